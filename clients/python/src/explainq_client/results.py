"""Job results: plain dicts (the server's JSON) that render themselves in Jupyter."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from explainq_client import render
from explainq_client.faithfulness import FaithfulnessTable, faithfulness_table

__all__ = ["UNVALIDATED", "AblationResult", "AttributionResult", "EvaluationResult", "Provenance", "Result",
           "TracInResult", "TrainingResult", "make_result"]


UNVALIDATED = "unvalidated"  # the schema header of a result that does not match its kind's result model


class Provenance(dict[str, Any]):
    """What produced a result (its ``provenance`` block, as a dict): ``models`` (name, version, ``digest``),
    ``registered`` (models the job registered), ``datasets``, the ``request`` as run, ``seeds``, ``precision``,
    ``device``, ``software`` (explainq and its commit, Python, torch, CUDA), ``worker``, ``started_at`` and
    ``finished_at``."""

    @property
    def model_digest(self) -> str | None:
        """The digest of the first model the job read (else registered): ``client.jobs(model_digest=...)`` finds
        every job of yours with that model version."""
        for m in [*(self.get("models") or []), *(self.get("registered") or [])]:
            if isinstance(m, Mapping) and m.get("digest"):
                return str(m["digest"])
        return None

    def _repr_html_(self) -> str:
        return render.provenance_html(self)

    def text(self) -> str:
        return render.provenance_text(self)


class Result(dict[str, Any]):
    """The JSON result of a succeeded job, as a dict; ``kind`` is the job's kind.

    ``schema`` is the name of the result model the server validated it against (its ``X-Explainq-Result-Schema``
    header, e.g. ``InfluenceResult``; ``none`` for a kind without one, None when unknown). ``validated`` is False
    for a result written by an earlier version of the server that does not match its kind's model: it is kept as
    it was stored, a plain :class:`Result`, and shows as JSON rather than through a renderer.

    A list that grows with the request (an influence query's ``results``, an attribution run's ``samples``, a
    self-influence ``ranking``) holds its first entries here; ``listed[name]`` says how many there are in all
    (:meth:`total`) and which artifact holds every one: read them with ``job.entries(name)``."""

    def __init__(self, data: Mapping[str, Any], kind: str | None = None, schema: str | None = None):
        super().__init__(data)
        self.kind = kind
        self.schema = schema
        self.validated = schema != UNVALIDATED

    @property
    def provenance(self) -> Provenance | None:
        """What produced the result (:class:`Provenance`); None for a result stored before servers recorded it."""
        block = self.get("provenance")
        return Provenance(block) if isinstance(block, Mapping) else None

    @property
    def artifacts(self) -> list[dict[str, Any]]:
        """The artifacts the result lists (``name``, ``size``, ``media_type``); download them with the job."""
        return list(self.get("artifacts") or [])

    def total(self, name: str) -> int:
        """How many entries the list ``name`` has in all (``listed[name]["total"]``), of which the result holds
        the first ones inline; a list without a ``listed`` entry is held whole. Dotted names reach a nested list
        (``comparison.samples``)."""
        return render.listed_total(self, name)

    def _repr_html_(self) -> str:
        return render.json_html(self, validated=self.validated)

    def text(self) -> str:
        """The result as plain text for a terminal: tables for the known renderers, else indented JSON (always
        JSON for a result that did not validate: ``validated`` is False)."""
        return json.dumps(self, indent=2, ensure_ascii=False)


class AttributionResult(Result):
    """Renderer ``attributions``: renders each sample's headline as words coloured by attribution (and, when the
    request asked for ``faithfulness``, its curves and table: :attr:`faithfulness`)."""

    @property
    def faithfulness(self) -> FaithfulnessTable | None:
        """Comprehensiveness, sufficiency and curve areas per word ranking (IG, random, occlusion) as a table
        (``.to_pandas()``, ``.curves``, ``.tests``); None when the request did not ask for them."""
        return faithfulness_table(self)

    def rows(self) -> list[dict[str, Any]]:
        """One row per word (a text's, a headline's), cell (an image's pixel or patch) or feature (a tabular
        row's) of every sample the result holds inline: ``sample``, ``label``, ``target`` (the class explained, for
        classifiers), ``view``, ``position``, ``name``, ``attribution`` and, for an exported classifier's input,
        ``value`` (the feature's value or the cell's mean intensity) and ``row``/``column`` of an image cell. A run
        with more samples than the result holds lists them all in ``samples.jsonl`` (:meth:`Result.total`)."""
        out: list[dict[str, Any]] = []
        for s in self.get("samples") or []:
            target = (s.get("target") or {}).get("label") if isinstance(s.get("target"), Mapping) else None
            inp = s.get("input") if isinstance(s.get("input"), Mapping) else None
            values = list(inp.get("values") or []) if inp else []
            grid = inp.get("grid") if inp else None
            views = [("main", s), *((k, v) for k, v in (s.get("views") or {}).items() if isinstance(v, Mapping))]
            for view, part in views:
                names = part.get("display_words") or part.get("words") or []
                for i, (name, a) in enumerate(zip(names, part.get("word_attributions") or [], strict=False)):
                    row = {"sample": s.get("id"), "label": s.get("label"), "target": target, "view": view,
                           "position": i, "name": name, "attribution": a}
                    if inp is not None:
                        row["value"] = values[i] if i < len(values) else None
                        if isinstance(grid, list) and len(grid) == 2 and grid[1]:
                            row["row"], row["column"] = divmod(i, grid[1])
                    out.append(row)
        return out

    def to_pandas(self) -> Any:
        """:meth:`rows` as a ``pandas.DataFrame`` (pandas must be installed; the SDK does not depend on it)."""
        import pandas as pd

        return pd.DataFrame(self.rows())

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


def make_result(renderer: str | None, data: Any, kind: str | None = None, schema: str | None = None) -> Result:
    """The result class for the kind's ``renderer`` around ``data`` (a non-object result is kept under
    ``"value"``); a kind without a renderer, or one this SDK does not know, gets a plain :class:`Result`, and so
    does a result whose ``schema`` header says ``unvalidated`` (it is not drawn: ``validated`` is False)."""
    cls = Result if schema == UNVALIDATED else RESULT_TYPES.get(renderer or "", Result)
    return cls(data if isinstance(data, Mapping) else {"value": data}, kind, schema)
