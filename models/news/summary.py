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
from collections.abc import Iterable
from typing import Any

import numpy as np


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
            min_count: int = 3) -> dict[str, Any]:
    """Words whose mean attribution moved by more than ``threshold`` from ``base`` to ``other``, and the words new
    to ``other``'s top-positive lists (in at least ``min_count`` samples there and in none under ``base``)."""
    ma, mb = base.word_means(), other.word_means()
    changed = [{
        "word": w, "mean_before": ma[w][0], "mean_after": mb[w][0], "change": mb[w][0] - ma[w][0],
        "count": mb[w][1],
    } for w in sorted(set(ma) & set(mb)) if abs(mb[w][0] - ma[w][0]) > threshold]
    changed.sort(key=lambda r: -abs(r["change"]))
    ta, tb = base.top_positive_counts(), other.top_positive_counts()
    new = sorted(({"word": w, "count": c} for w, c in tb.items() if c >= min_count and ta.get(w, 0) == 0),
                 key=lambda r: (-r["count"], r["word"]))
    return {"threshold": threshold, "min_count": min_count, "changed": changed, "new_top_words": new}
