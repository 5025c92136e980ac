"""Job results: plain dicts (the server's JSON) that render themselves in Jupyter."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from explainq_client import render
from explainq_client.faithfulness import FaithfulnessTable, faithfulness_table

__all__ = ["AblationResult", "AttributionResult", "EvaluationResult", "Result", "TracInResult", "TrainingResult",
           "make_result"]


class Result(dict[str, Any]):
    """The JSON result of a succeeded job, as a dict; ``kind`` is the job's kind."""

    def __init__(self, data: Mapping[str, Any], kind: str | None = None):
        super().__init__(data)
        self.kind = kind

    @property
    def artifacts(self) -> list[dict[str, Any]]:
        """The artifacts the result lists (``name``, ``size``, ``media_type``); download them with the job."""
        return list(self.get("artifacts") or [])

    def text(self) -> str:
        """The result as plain text for a terminal: tables for the known renderers, else indented JSON."""
        return json.dumps(self, indent=2, ensure_ascii=False)


class AttributionResult(Result):
    """Renderer ``attributions``: renders each sample's headline as words coloured by attribution (and, when the
    request asked for ``faithfulness``, its curves and table: :attr:`faithfulness`)."""

    @property
    def faithfulness(self) -> FaithfulnessTable | None:
        """Comprehensiveness, sufficiency and curve areas per word ranking (IG, random, occlusion) as a table
        (``.to_pandas()``, ``.curves``, ``.tests``); None when the request did not ask for them."""
        return faithfulness_table(self)

    def _repr_html_(self) -> str:
        f = self.faithfulness
        return render.attribution_html(self) + (f._repr_html_() if f is not None else "")

    def text(self) -> str:
        f = self.faithfulness
        return render.attribution_text(self) + (f"\n\n{f}" if f is not None else "")


class TracInResult(Result):
    """Renderer ``influence`` (``tracin``): renders proponents and opponents (or the self-influence ranking) as tables."""

    def _repr_html_(self) -> str:
        return render.tracin_html(self)

    def text(self) -> str:
        return render.tracin_text(self)


class TrainingResult(Result):
    """Renderer ``training`` (``train_bdh``, ``train_conve``, ``train_news``): renders the per-step running loss, the
    per-epoch curves and the final metrics."""

    @property
    def history(self) -> list[dict[str, Any]]:
        return list(self.get("history") or [])

    def _repr_html_(self) -> str:
        return render.training_html(self)

    def text(self) -> str:
        return render.training_text(self)


class AblationResult(Result):
    """Renderer ``ablation`` (``ablations``): renders the representation × layer-set table and the all → visual drop."""

    def _repr_html_(self) -> str:
        return render.ablation_html(self)

    def text(self) -> str:
        return render.ablation_text(self)


class EvaluationResult(Result):
    """Renderer ``evaluation`` (``evaluate_attribution``, ``evaluate_mislabel``): each estimator's LDS with its
    interval, or its mislabel-detection AUC, found@10%/20% and recall curve."""

    @property
    def estimators(self) -> dict[str, Any]:
        return dict(self.get("estimators") or {})

    def _repr_html_(self) -> str:
        return render.evaluation_html(self)

    def text(self) -> str:
        return render.evaluation_text(self)


# By the renderer a kind names (``GET /kinds``), never by kind name: a new kind that draws its result as an
# existing one does needs no change here.
RESULT_TYPES: dict[str, type[Result]] = {
    "attributions": AttributionResult,
    "influence": TracInResult,
    "training": TrainingResult,
    "ablation": AblationResult,
    "evaluation": EvaluationResult,
}


def make_result(renderer: str | None, data: Any, kind: str | None = None) -> Result:
    """The result class for the kind's ``renderer`` around ``data`` (a non-object result is kept under
    ``"value"``); a kind without a renderer, or one this SDK does not know, gets a plain :class:`Result`."""
    cls = RESULT_TYPES.get(renderer or "", Result)
    return cls(data if isinstance(data, Mapping) else {"value": data}, kind)
