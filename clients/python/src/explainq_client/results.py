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


def _data_frame(rows: list[dict[str, Any]], columns: list[str] | None = None) -> Any:
    """``rows`` as a ``pandas.DataFrame`` (pandas must be installed; the SDK does not depend on it), with
    ``columns`` in that order even when there are no rows."""
    import pandas as pd

    return pd.DataFrame(rows, columns=columns) if columns is not None else pd.DataFrame(rows)


def _scalars(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The scalar values of a record, nested records flattened with ``_`` (``{"lds": {"mean": x}}`` is
    ``lds_mean``); lists are left out."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_scalars(value, name + "_"))
        elif not isinstance(value, list | tuple):
            out[name] = value
    return out


def _triple(prefix: str, triple: Any) -> dict[str, Any]:
    parts = list(triple) if isinstance(triple, list | tuple) and len(triple) == 3 else [None, None, None]
    return {f"{prefix}_head": parts[0], f"{prefix}_relation": parts[1], f"{prefix}_tail": parts[2]}


TRACIN_COLUMNS = ["test_head", "test_relation", "test_tail", "role", "rank", "train_head", "train_relation",
                  "train_tail", "influence", "train_self_influence", "is_test_triple", "is_reverse"]
BREAKDOWN_COLUMNS = ["test_head", "test_relation", "test_tail", "role", "rank", "train_head", "train_relation",
                     "train_tail", "influence", "part", "name", "value"]
SELF_INFLUENCE_COLUMNS = ["rank", "train_head", "train_relation", "train_tail", "self_influence"]


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

    def to_pandas(self) -> Any:
        """A result without a table of its own (a featurize, an import, a registration...) as one row: its
        scalar fields, nested records flattened with ``_`` (``provenance_device``...); lists are left out. The
        result classes with rows override this."""
        return _data_frame([_scalars(self)])

    def to_parquet(self, dest: Any, *args: Any, **kwargs: Any) -> Any:
        """Write :meth:`to_pandas` (its arguments, e.g. ``of="breakdown"``) to ``dest`` as Parquet (pyarrow must be
        installed); returns ``dest`` as a ``Path``. A ranking longer than the result lists is in full in an
        artifact: ``job.export("influence.csv", "influence.parquet")``."""
        from explainq_client.tables import export_frame

        return export_frame(self.to_pandas(*args, **kwargs), dest, "parquet")

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

    def rows(self) -> list[dict[str, Any]]:
        """One row per ranked training triple the result holds inline. A query (modes ``test``, ``single``): per
        test triple its proponents (``role`` ``proponent``, ``rank`` 1 the most positive), then its opponents
        (``opponent``, 1 the most negative), or its ``pair`` scores: ``test_head``, ``test_relation``,
        ``test_tail``, ``role``, ``rank``, ``train_head``, ``train_relation``, ``train_tail``, ``influence``,
        ``train_self_influence``, ``is_test_triple``. Mode ``self``: one row per entry of the ranking: ``rank``,
        ``train_head``, ``train_relation``, ``train_tail``, ``self_influence``. A result listing more test
        triples than it holds has all of them in its artifact (``job.entries("results")``)."""
        if self.get("mode") == "self":
            return [{"rank": i, **_triple("train", r.get("train_triple")), "self_influence": r.get("self_influence")}
                    for i, r in enumerate(self.get("ranking") or [], 1) if isinstance(r, Mapping)]
        out: list[dict[str, Any]] = []
        for entry in self.get("results") or []:
            if not isinstance(entry, Mapping):
                continue
            test = _triple("test", entry.get("test_triple"))
            for role, key in (("proponent", "proponents"), ("opponent", "opponents"), ("pair", "pairs")):
                for i, pair in enumerate(entry.get(key) or [], 1):
                    out.append({**test, "role": role, "rank": i, **_triple("train", pair.get("train_triple")),
                                "influence": pair.get("influence"),
                                "train_self_influence": pair.get("train_self_influence"),
                                "is_test_triple": bool(pair.get("is_test_triple")),
                                "is_reverse": render._flag(entry, pair) == render.REVERSED})
        return out

    def breakdown(self) -> list[dict[str, Any]]:
        """Where each listed score comes from (exact TracIn with ``top_k``): one row per listed pair and part,
        ``test_head``... ``role``, ``rank``, ``train_head``..., ``influence``, ``part`` (``checkpoint`` or
        ``layers``), ``name`` (the checkpoint's or the layer group's) and ``value``; each pair's parts of one kind
        add up to its influence."""
        names = [str(c.get("name")) for c in self.get("checkpoints") or [] if isinstance(c, Mapping)]
        out: list[dict[str, Any]] = []
        for entry in self.get("results") or []:
            if not isinstance(entry, Mapping):
                continue
            test = _triple("test", entry.get("test_triple"))
            for role, key in (("proponent", "proponents"), ("opponent", "opponents")):
                for i, pair in enumerate(entry.get(key) or [], 1):
                    b = pair.get("breakdown") if isinstance(pair, Mapping) else None
                    if not isinstance(b, Mapping):
                        continue
                    base = {**test, "role": role, "rank": i, **_triple("train", pair.get("train_triple")),
                            "influence": pair.get("influence")}
                    out += [{**base, "part": "checkpoint", "name": n, "value": v}
                            for n, v in zip(names, b.get("checkpoints") or [], strict=False)]
                    out += [{**base, "part": "layers", "name": g, "value": v} for g, v in (b.get("layers") or {}).items()]
        return out

    def to_pandas(self, of: str = "rows") -> Any:
        """:meth:`rows` (or, ``of="breakdown"``, :meth:`breakdown`) as a ``pandas.DataFrame`` with its documented
        columns (pandas must be installed)."""
        if of == "breakdown":
            return _data_frame(self.breakdown(), BREAKDOWN_COLUMNS)
        if of != "rows":
            raise ValueError("of must be 'rows' or 'breakdown'")
        columns = SELF_INFLUENCE_COLUMNS if self.get("mode") == "self" else TRACIN_COLUMNS
        return _data_frame(self.rows(), columns)

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

    def rows(self, of: str = "history") -> list[dict[str, Any]]:
        """One row per epoch (``of="history"``: the kind's per-epoch values, nested ones flattened with ``_``, as
        ``valid_mrr``), or per point of the running-loss curve (``of="steps"``: ``step``, ``epoch``, ``loss``)."""
        if of not in ("history", "steps"):
            raise ValueError("of must be 'history' or 'steps'")
        return [_scalars(r) for r in self.get(of) or [] if isinstance(r, Mapping)]

    def to_pandas(self, of: str = "history") -> Any:
        """:meth:`rows` as a ``pandas.DataFrame``: one row per epoch (an ``epoch`` column first when the kind
        records one) or, with ``of="steps"``, per curve point (pandas must be installed)."""
        rows = self.rows(of)
        first = ["step", "epoch", "loss"] if of == "steps" else ["epoch"] if any("epoch" in r for r in rows) else []
        return _data_frame(rows, [*first, *dict.fromkeys(k for r in rows for k in r if k not in first)])

    def _repr_html_(self) -> str:
        return render.training_html(self)

    def text(self) -> str:
        return render.training_text(self)


class AblationResult(Result):
    """Renderer ``ablation`` (``ablations``): renders the representation × layer-set table and the all → visual drop."""

    def rows(self) -> list[dict[str, Any]]:
        """One row per (layer set, representation) cell: ``layer_set``, ``representation`` and the cell's numbers,
        flattened with ``_`` (``test_acc_mean``, ``test_acc_std``, ...; the confusion matrices left out)."""
        return [{"layer_set": ls, "representation": rep, **_scalars(cell)}
                for ls, cells in (self.get("results") or {}).items() if isinstance(cells, Mapping)
                for rep, cell in cells.items() if isinstance(cell, Mapping)]

    def to_pandas(self) -> Any:
        """:meth:`rows` as a ``pandas.DataFrame`` (pandas must be installed)."""
        return _data_frame(self.rows())

    def _repr_html_(self) -> str:
        return render.ablation_html(self)

    def text(self) -> str:
        return render.ablation_text(self)


SUSPECT_COLUMNS = ["estimator", "rank", "train_index", "head", "relation", "tail", "self_influence", "corrupted",
                   "original_tail"]


class EvaluationResult(Result):
    """Renderers ``evaluation`` (``evaluate_attribution``, ``evaluate_mislabel``) and ``classifier_evaluation``
    (``evaluate_classifier_attribution``, ``evaluate_classifier_mislabel``): each estimator's LDS with its interval,
    or its mislabel-detection AUC with its interval, found@10%/20% and recall curve."""

    @property
    def estimators(self) -> dict[str, Any]:
        return dict(self.get("estimators") or {})

    def rows(self) -> list[dict[str, Any]]:
        """One row per estimator: ``estimator`` and its numbers, nested ones flattened with ``_``. An LDS
        evaluation: ``lds_mean``, ``lds_low``, ``lds_high`` (the bootstrap interval), ``n_undefined``,
        ``ratio_to_tracin_ratio``, ``ratio_to_tracin_low``, ``ratio_to_tracin_high``, ``seconds``, ...; mislabel
        detection: ``auc``, ``found_at_10``, ``found_at_20``, ``seconds`` (a classifier evaluation's AUC with its
        interval: ``auc_interval_auc``, ``auc_interval_low``, ``auc_interval_high``). Per-test values and curves are
        left out (they are lists: ``result["estimators"][name]``)."""
        return [{"estimator": name, **_scalars(values)} for name, values in self.estimators.items()
                if isinstance(values, Mapping)]

    def suspects(self, estimator: str | None = None) -> list[dict[str, Any]]:
        """Mislabel detection: the training triples each estimator suspects most, the top
        ``result["suspects_listed"]`` of its self-influence ranking (all of them: the ``suspects.csv`` artifact),
        one row per (estimator, triple), columns :data:`SUSPECT_COLUMNS`: ``rank`` 1 the highest
        ``self_influence``, the triple as trained (``head``, ``relation``, ``tail``), ``corrupted`` and, for a
        corrupted one, its ``original_tail``. ``estimator`` keeps one estimator's; empty for an LDS evaluation."""
        out: list[dict[str, Any]] = []
        for name, values in self.estimators.items():
            if estimator is not None and name != estimator or not isinstance(values, Mapping):
                continue
            for s in values.get("suspects") or []:
                if isinstance(s, Mapping):
                    head, relation, tail = (list(s.get("triple") or []) + [None] * 3)[:3]
                    out.append({"estimator": name, "rank": s.get("rank"), "train_index": s.get("train_index"),
                                "head": head, "relation": relation, "tail": tail,
                                "self_influence": s.get("self_influence"), "corrupted": s.get("corrupted"),
                                "original_tail": s.get("original_tail")})
        return out

    def to_pandas(self, of: str = "estimators") -> Any:
        """:meth:`rows` (one row per estimator) or, ``of="suspects"``, :meth:`suspects` as a ``pandas.DataFrame``
        (pandas must be installed)."""
        if of == "suspects":
            return _data_frame(self.suspects(), SUSPECT_COLUMNS)
        if of != "estimators":
            raise ValueError("of must be 'estimators' or 'suspects'")
        return _data_frame(self.rows())

    def _repr_html_(self) -> str:
        return render.evaluation_html(self)

    def text(self) -> str:
        return render.evaluation_text(self)


CLASSIFIER_INFLUENCE_COLUMNS = ["test", "target", "predicted", "role", "rank", "index", "label", "score",
                                "self_influence", "text"]


class ClassifierInfluenceResult(Result):
    """Renderer ``classifier_influence`` (``classifier_influence``): a classifier's training-data influence, drawn
    with its images' thumbnails or its texts."""

    def rows(self) -> list[dict[str, Any]]:
        """One row per listed training example: mode ``test``, per test example (``test``, ``target``,
        ``predicted``) its proponents (``role`` ``proponent``, ``rank`` 1 the most positive) then its opponents;
        mode ``self``, the ranking (``role`` ``self``). Columns: :data:`CLASSIFIER_INFLUENCE_COLUMNS`."""
        out: list[dict[str, Any]] = []
        for t in self.get("tests") or []:
            if not isinstance(t, Mapping):
                continue
            for role, key in (("proponent", "proponents"), ("opponent", "opponents")):
                out += [{"test": t.get("id"), "target": t.get("target"), "predicted": t.get("predicted"),
                         "role": role, "rank": i, "index": e.get("index"), "label": e.get("label"),
                         "score": e.get("score"), "self_influence": e.get("self_influence"), "text": e.get("text")}
                        for i, e in enumerate(t.get(key) or [], 1) if isinstance(e, Mapping)]
        out += [{"test": None, "target": None, "predicted": None, "role": "self", "rank": i, "index": e.get("index"),
                 "label": e.get("label"), "score": e.get("score"), "self_influence": e.get("score"),
                 "text": e.get("text")}
                for i, e in enumerate(self.get("self_influence") or [], 1) if isinstance(e, Mapping)]
        return out

    def to_pandas(self) -> Any:
        """:meth:`rows` as a ``pandas.DataFrame`` with its documented columns (pandas must be installed)."""
        return _data_frame(self.rows(), CLASSIFIER_INFLUENCE_COLUMNS)

    def _repr_html_(self) -> str:
        return render.classifier_influence_html(self)

    def text(self) -> str:
        return render.classifier_influence_text(self)


# By the renderer a kind names (``GET /kinds``), never by kind name: a new kind that draws its result as an
# existing one does needs no change here.
RESULT_TYPES: dict[str, type[Result]] = {
    "attributions": AttributionResult,
    "influence": TracInResult,
    "training": TrainingResult,
    "ablation": AblationResult,
    "evaluation": EvaluationResult,
    "classifier_influence": ClassifierInfluenceResult,
    "classifier_evaluation": EvaluationResult,
}


def make_result(renderer: str | None, data: Any, kind: str | None = None, schema: str | None = None) -> Result:
    """The result class for the kind's ``renderer`` around ``data`` (a non-object result is kept under
    ``"value"``); a kind without a renderer, or one this SDK does not know, gets a plain :class:`Result`, and so
    does a result whose ``schema`` header says ``unvalidated`` (it is not drawn: ``validated`` is False)."""
    cls = Result if schema == UNVALIDATED else RESULT_TYPES.get(renderer or "", Result)
    return cls(data if isinstance(data, Mapping) else {"value": data}, kind, schema)
