"""Dataset-level statistics of attribution reports, computed in one streaming pass over per-sample records.

The same accumulator serves a run on one worker (fed the samples as they are attributed) and the reduce step of a
sharded run (fed the shards' JSONL records in sample order), so the two give identical numbers, and its memory grows
with the vocabulary, never with the number of samples (one float per sample is kept, for the delta quantiles).

Per label (``real``/``fake``/``unlabelled``) and word (lower-cased): the mean and population standard deviation of its
attribution (Welford's update, in record order), its number of occurrences, and the fraction of that label's samples
it appears in. Across all samples: the distribution of the relative completeness delta (median, p95, max) over every
view of every sample (NAML: title and body), the same per view, and the
global top-k words by mean attribution among words seen at least ``min_count`` times. For ``compare_with`` runs, the
per-word means over all samples and how many samples list a word among their top-positive words.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from models.tables import TableWriter


class _Welford:
    __slots__ = ("n", "mean", "m2")

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.n) if self.n else 0.0


def distribution(values: Iterable[float]) -> dict[str, float | None]:
    """Median, p95 and max of ``values`` (all None without any)."""
    arr = np.asarray(list(values), dtype=np.float64)
    if not arr.size:
        return {"median": None, "p95": None, "max": None}
    return {"median": float(np.median(arr)), "p95": float(np.quantile(arr, 0.95)), "max": float(arr.max())}


class ReportAccumulator:
    """Feed per-sample records (``{"id", "label", "words", "word_attributions", "relative_delta",
    "top_positive", "views": {view: {..., "relative_delta"}}, ...}``) with ``add``; read the statistics with
    ``word_stats()``, ``summary()``, ``word_means()`` and ``top_positive_counts()``. ``main_view`` names the view
    a record holds at its top level (the model's first: ``title``)."""

    def __init__(self, main_view: str = "title") -> None:
        self.main_view = main_view
        self.rel_by_view: dict[str, list[float]] = {}
        self.by_label: dict[str, dict[str, _Welford]] = defaultdict(dict)
        self.present: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.n_label: dict[str, int] = defaultdict(int)
        self.overall: dict[str, _Welford] = {}
        self.top_counts: dict[str, int] = defaultdict(int)
        self.rel_deltas: list[float] = []
        self.n = 0

    def add(self, rec: dict[str, Any]) -> None:
        self.n += 1
        label = rec.get("label") or "unlabelled"
        self.n_label[label] += 1
        table = self.by_label[label]
        for w in {w.lower() for w in rec["words"]}:
            self.present[label][w] += 1
        for w, a in zip(rec["words"], rec["word_attributions"], strict=True):
            key = w.lower()
            acc = table.get(key)
            if acc is None:
                acc = table[key] = _Welford()
            acc.add(float(a))
            tot = self.overall.get(key)
            if tot is None:
                tot = self.overall[key] = _Welford()
            tot.add(float(a))
        for w in {t["word"].lower() for t in rec.get("top_positive", [])}:
            self.top_counts[w] += 1
        views = [(self.main_view, rec)] + list((rec.get("views") or {}).items())
        for view, part in views:
            rel = part.get("relative_delta")
            if rel is not None and math.isfinite(rel):
                self.rel_deltas.append(float(rel))
                self.rel_by_view.setdefault(view, []).append(float(rel))

    def extend(self, records: Iterable[dict[str, Any]]) -> ReportAccumulator:
        for rec in records:
            self.add(rec)
        return self

    def word_stats(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for label, table in self.by_label.items():
            rows = [{"word": w, "mean": acc.mean, "std": acc.std, "count": acc.n,
                     "frequency": self.present[label][w] / self.n_label[label]} for w, acc in table.items()]
            out[label] = sorted(rows, key=lambda r: (-r["mean"], r["word"]))
        return out

    def word_means(self) -> dict[str, tuple[float, int]]:
        return {w: (acc.mean, acc.n) for w, acc in self.overall.items()}

    def top_positive_counts(self) -> dict[str, int]:
        return dict(self.top_counts)

    def delta_distribution(self) -> dict[str, float | None]:
        """The relative deltas of every view of every sample."""
        return distribution(self.rel_deltas)

    def delta_by_view(self) -> dict[str, dict[str, float | None]]:
        """The relative deltas' distribution per view, in the order the views were first seen."""
        return {view: distribution(values) for view, values in self.rel_by_view.items()}

    def top_words(self, top_k: int, min_count: int = 3) -> dict[str, list[dict[str, Any]]]:
        """The words with the highest and lowest mean attribution over all samples (seen ``min_count`` times)."""
        rows = [{"word": w, "mean": acc.mean, "count": acc.n} for w, acc in self.overall.items()
                if acc.n >= min_count]
        rows.sort(key=lambda r: (-r["mean"], r["word"]))
        positive = [r for r in rows if r["mean"] > 0][:top_k]
        negative = [r for r in reversed(rows) if r["mean"] < 0][:top_k]
        return {"positive": positive, "negative": negative, "min_count": min_count}


def compare(base: ReportAccumulator, other: ReportAccumulator, threshold: float = 0.1,
            min_count: int = 3, changed_min_count: int = 1) -> dict[str, Any]:
    """Words whose mean attribution moved by more than ``threshold`` from ``base`` to ``other`` among the words
    seen at least ``changed_min_count`` times under both (a word seen once has a mean of one value: noise), sorted
    by the size of the change, and the words new to ``other``'s top-positive lists (in at least ``min_count``
    samples there and in none under ``base``)."""
    ma, mb = base.word_means(), other.word_means()
    changed = [{
        "word": w, "mean_before": ma[w][0], "mean_after": mb[w][0], "change": mb[w][0] - ma[w][0],
        "count": mb[w][1],
    } for w in sorted(set(ma) & set(mb))
        if abs(mb[w][0] - ma[w][0]) > threshold and min(ma[w][1], mb[w][1]) >= changed_min_count]
    changed.sort(key=lambda r: -abs(r["change"]))
    ta, tb = base.top_positive_counts(), other.top_positive_counts()
    new = sorted(({"word": w, "count": c} for w, c in tb.items() if c >= min_count and ta.get(w, 0) == 0),
                 key=lambda r: (-r["count"], r["word"]))
    return {"threshold": threshold, "min_count": min_count, "changed_min_count": changed_min_count,
            "changed": changed, "new_top_words": new}


# ------------------------------------------------------------------------------------- per-sample checks
DEFAULT_WARN_RELATIVE_DELTA = 0.05  # a sample whose attributions miss score - baseline score by more is flagged
WARNED_SAMPLES_LISTED = 10  # completeness warnings name at most this many samples one by one


def completeness_excess(rec: dict[str, Any], threshold: float, main_view: str = "title") -> list[tuple[str, float]]:
    """The views of a sample record whose relative completeness error (``relative_delta``, see
    :func:`models.explain.ig.relative_delta`) exceeds ``threshold``, or is not finite, with that error."""
    out = []
    for view, part in [(main_view, rec)] + list((rec.get("views") or {}).items()):
        rel = part.get("relative_delta")
        if rel is None:
            continue
        if not math.isfinite(rel) or rel > threshold:
            out.append((view, float(rel)))
    return out


class CompletenessWarnings:
    """Streaming: the samples whose completeness error exceeds ``threshold`` (``add`` each record), as the
    result's ``warnings`` lines: one per sample up to ``WARNED_SAMPLES_LISTED``, then one line counting the rest.
    ``prefix`` names the model in a comparison."""

    def __init__(self, threshold: float, main_view: str = "title", prefix: str = "") -> None:
        self.threshold = threshold
        self.main_view = main_view
        self.prefix = prefix
        self.listed: list[tuple[str, list[tuple[str, float]]]] = []
        self.n = 0
        self.more: list[str] = []

    def add(self, rec: dict[str, Any]) -> None:
        excess = completeness_excess(rec, self.threshold, self.main_view)
        if not excess:
            return
        self.n += 1
        if len(self.listed) < WARNED_SAMPLES_LISTED:
            self.listed.append((str(rec.get("id")), excess))
        elif len(self.more) < 5:
            self.more.append(str(rec.get("id")))

    def extend(self, records: Iterable[dict[str, Any]]) -> CompletenessWarnings:
        for rec in records:
            self.add(rec)
        return self

    def warnings(self) -> list[str]:
        out = []
        for sid, excess in self.listed:
            errs = ", ".join(f"{rel:.3g} ({view})" for view, rel in excess)
            out.append(f"{self.prefix}sample {sid!r}: relative completeness error {errs} exceeds "
                       f"{self.threshold:g}: its attributions do not add up to score − baseline score; raise "
                       "n_steps or set a tolerance")
        if self.n > len(self.listed):
            out.append(f"{self.prefix}{self.n - len(self.listed)} more samples exceed the relative completeness "
                       f"error {self.threshold:g} (e.g. {self.more})")
        return out


class InputWarnings:
    """Streaming: what the caller should know about the inputs (``add`` each sample, attributed or not): no sample
    has a real/fake label; for a model that reads bodies, samples without ``history_bodies`` or
    ``candidate_body``. ``state()`` is a JSON summary that ``merge`` folds in (a shard's, in sample order), so a
    sharded run words its warnings exactly as one job over the same samples."""

    EXAMPLES = 3  # sample ids named per warning

    def __init__(self) -> None:
        self.labelled = False
        self.missing: dict[str, list[Any]] = {"history_bodies": [0, []], "candidate_body": [0, []]}

    def add(self, sample: Any) -> None:
        self.labelled = self.labelled or sample.label is not None
        for name in self.missing:
            if getattr(sample, name) is None:
                self._count(name, 1, [sample.id])

    def _count(self, name: str, n: int, ids: list[str]) -> None:
        entry = self.missing[name]
        entry[0] += n
        entry[1].extend(ids[: self.EXAMPLES - len(entry[1])])

    def extend(self, samples: Iterable[Any]) -> InputWarnings:
        for s in samples:
            self.add(s)
        return self

    def state(self) -> dict[str, Any]:
        return {"labelled": self.labelled, "missing": {k: [n, list(ids)] for k, (n, ids) in self.missing.items()}}

    def merge(self, state: dict[str, Any]) -> InputWarnings:
        self.labelled = self.labelled or bool(state["labelled"])
        for name, (n, ids) in state["missing"].items():
            self._count(name, n, list(ids))
        return self

    def warnings(self, views: Sequence[str]) -> list[str]:
        out = []
        if not self.labelled:
            out.append("no sample has a label (a news item's real/fake label, a text's own label): word_stats has "
                       "the single group 'unlabelled' and no per-label statistics")
        if "body" in views:
            (n_hist, hist), (n_cand, cand) = self.missing["history_bodies"], self.missing["candidate_body"]
            if n_hist:
                out.append(f"{n_hist} sample(s) have no history_bodies (e.g. {hist}): their user vectors "
                           "were built with empty history bodies")
            if n_cand:
                out.append(f"{n_cand} sample(s) have no candidate_body (e.g. {cand}): the body view "
                           "was attributed over an empty body")
        return out


def compare_sample(base: dict[str, Any], other: dict[str, Any], top_n: int) -> dict[str, Any]:
    """One sample under two models: its words aligned by their character span in the text (both models read the
    same headline, possibly with different tokenizers), the change ``other - base`` of each aligned word's
    attribution, and the ``top_n`` largest changes by absolute size (ties: text order), each with the word's
    index in both records. Without spans (an old record) words align by position when both word lists agree."""
    spans_a, spans_b = base.get("spans"), other.get("spans")
    pairs: list[tuple[int, int]] = []
    if spans_a is not None and spans_b is not None:
        where = {tuple(sp): j for j, sp in enumerate(spans_b) if sp is not None}
        pairs = [(i, where[tuple(sp)]) for i, sp in enumerate(spans_a) if sp is not None and tuple(sp) in where]
    elif [w.lower() for w in base["words"]] == [w.lower() for w in other["words"]]:
        pairs = [(i, i) for i in range(len(base["words"]))]
    display = base.get("display_words") or base["words"]
    rows = [{"word": display[i], "index_a": i, "index_b": j, "before": float(base["word_attributions"][i]),
             "after": float(other["word_attributions"][j]),
             "change": float(other["word_attributions"][j]) - float(base["word_attributions"][i])}
            for i, j in pairs]
    ranked = sorted((r for r in rows if r["change"] != 0), key=lambda r: (-abs(r["change"]), r["index_a"]))
    return {"id": base.get("id"), "aligned": len(pairs), "words_a": len(base["words"]),
            "words_b": len(other["words"]), "changed": ranked[:top_n]}


WORDS_CSV_COLUMNS = ["model", "sample_id", "label", "view", "position", "word", "display_word", "attribution"]


class WordsCsv:
    """``words.csv``: one row per word of every view of every sample (``position`` is the word's index in its
    view, ``word`` the model's token text, ``display_word`` the text as given), the numbers the page shows."""

    def __init__(self, fh: Any) -> None:
        self.writer = TableWriter(fh, WORDS_CSV_COLUMNS, lineterminator="\n")

    def add(self, model: str, rec: dict[str, Any], main_view: str = "title") -> None:
        for view, part in [(main_view, rec)] + list((rec.get("views") or {}).items()):
            display = part.get("display_words") or part["words"]
            for i, (w, d, a) in enumerate(zip(part["words"], display, part["word_attributions"], strict=True)):
                self.writer.row([model, rec.get("id"), rec.get("label") or "", view, i, w, d, float(a)])
