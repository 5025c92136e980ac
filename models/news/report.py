"""The result of an attribution job, built one sample record at a time: the same code, the same fields and the same
numbers whether the job ran whole or as shards.

A job attributes its samples in *parts* (the whole run is one part; a sharded run has one per shard, fed in sample
order by the reduce step). A part is its records (one per attributed sample, the comparison model's alongside)
and a small JSON summary, :func:`part_summary`: the run's ``summary`` (``models.news.attribution.explain``), its
errors, the input warnings' state and the faithfulness time. :class:`AttributionReport` takes the parts in order
(:meth:`AttributionReport.part`) and streams every record once through

- the statistics (:class:`models.news.summary.ReportAccumulator`) and the completeness warnings
  (:class:`models.news.summary.CompletenessWarnings`), per model;
- the artifacts: ``samples.jsonl`` (every record, in order; ``compare.jsonl`` for ``compare_with``), ``words.csv``
  (:class:`models.news.summary.WordsCsv`: the model's rows, then the comparison model's), ``attributions.npz``
  (token attributions, spooled to disk and written at the end when there are at least ``NPZ_MIN_SAMPLES``
  samples), ``errors.jsonl`` / ``compare_errors.jsonl`` (every sample that could not be attributed, when there is
  one);

and keeps only the first ``SAMPLES_INLINE`` records and ``ERRORS_INLINE`` errors per model, so its memory grows
with the vocabulary, never with the number of samples (except one float per view and sample for the delta
quantiles, and each record's faithfulness numbers when they were asked for: their summary's Wilcoxon tests pair
every sample). :meth:`AttributionReport.finish` writes ``word_stats.json`` (every word per label) and, when
comparing, ``comparison.json`` (every changed word), and returns the result (``AttributionResult``, as JSON).
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import zipfile
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from models.news.summary import (
    CompletenessWarnings,
    InputWarnings,
    ReportAccumulator,
    WordsCsv,
    compare,
    compare_sample,
)

SAMPLES_INLINE = 100  # records per model held in the result (every one is in samples.jsonl / compare.jsonl)
ERRORS_INLINE = 1000  # errors per model held in the result (every one is in errors.jsonl / compare_errors.jsonl)
WORDS_INLINE = 50  # words per label at each end of word_stats (every word is in word_stats.json)
CHANGED_INLINE = 50  # the comparison's changed words held in the result (every one is in comparison.json)
NPZ_MIN_SAMPLES = 32  # runs with at least this many samples also write attributions.npz

SAMPLES_FILE, COMPARE_FILE = "samples.jsonl", "compare.jsonl"
ERRORS_FILE, COMPARE_ERRORS_FILE = "errors.jsonl", "compare_errors.jsonl"
NPZ_FILE = "attributions.npz"


def json_safe(obj: Any) -> Any:
    """``obj`` as valid JSON: non-finite floats become None, tuples and numpy scalars plain values (the records a
    shard stores and the reduce step reads back are exactly this)."""
    if isinstance(obj, float | np.floating):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


@dataclass(frozen=True)
class ReportOptions:
    """What the result depends on besides the records, from the job's request (no defaults here: they are the
    request model's)."""

    model: str
    top_k: int
    warn_relative_delta: float
    compare_with: str | None
    compare_threshold: float
    compare_min_count: int
    compare_top_n: int
    faithfulness: bool
    faithfulness_seed: int
    baseline: str


def part_summary(n: int, report: dict[str, Any], report_b: dict[str, Any] | None, samples: Iterable[Any]
                 ) -> dict[str, Any]:
    """The JSON summary of one part (a whole run, or one shard) from ``explain``'s reports over its ``n``
    samples (``report_b``: the ``compare_with`` model's): what a shard stores as ``done.json`` besides its
    records, and what :meth:`AttributionReport.part` reads."""
    faith = report.get("faithfulness") or {}
    out: dict[str, Any] = {
        "n": n,
        "summary": report["summary"],
        "errors": report["errors"],
        "inputs": InputWarnings().extend(samples).state(),
        "faithfulness_seconds": faith.get("seconds") or 0.0,
        "faithfulness_cpu_seconds": faith.get("cpu_seconds") or 0.0,
    }
    if report_b is not None:
        out["compare_summary"] = report_b["summary"]
        out["compare_errors"] = report_b["errors"]
    return json_safe(out)


def merge_summaries(summaries: Sequence[dict[str, Any]], acc: ReportAccumulator, n_errors: int) -> dict[str, Any]:
    """The ``summary`` of the parts together (one part: the run's own), field by field: settings from the first
    part; counts from the merged records; ``n_steps`` the largest (an adaptive run's largest per-sample rule);
    ``gradient_evaluations`` the sum (additive over samples); ``tolerance_met`` true when every part met it;
    ``max_token_error`` the largest of the parts' (an adaptive run's per-token error estimates); the
    relative-delta statistics over every view of every merged record, overall and ``relative_delta_by_view``.
    Times are summed over parts (work, not wall time). ``batch_size`` and ``alpha_batch_size`` are the first
    part's (``auto`` resolves per part). With a tolerance and ``optimized: false`` (the reference loop doubles the
    whole run until the median meets it) each shard doubles on its own, so only there can ``n_steps`` and
    ``tolerance_met`` differ from one job's."""
    first = summaries[0] if summaries else {}
    keep = ("method", "precision", "baseline", "optimized", "tolerance", "batch_size", "alpha_batch_size")
    steps = [s["n_steps"] for s in summaries if s.get("n_steps") is not None]
    evals = [s.get("gradient_evaluations") for s in summaries]
    met = [s.get("tolerance_met") for s in summaries]
    token = [s["max_token_error"] for s in summaries if s.get("max_token_error") is not None]
    dist = acc.delta_distribution()
    return {**{k: first.get(k) for k in keep},
            "views": list(first.get("views") or []),
            "n_samples": acc.n,
            "n_errors": n_errors,
            "n_steps": max(steps) if steps else None,
            "gradient_evaluations": None if not evals or any(e is None for e in evals) else sum(evals),
            "median_relative_delta": dist["median"],
            "max_relative_delta": dist["max"],
            "relative_delta_by_view": acc.delta_by_view(),
            "tolerance_met": None if all(m is None for m in met) else all(m is True for m in met),
            "max_token_error": max(token) if token else None,
            "seconds": sum(s.get("seconds") or 0.0 for s in summaries) if summaries else None,
            "seconds_prepare": sum(s.get("seconds_prepare") or 0.0 for s in summaries) if summaries else None}


def label_word_stats(stats: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per label, the ``WORDS_INLINE`` words of highest and of lowest mean attribution (``bottom`` lowest first) and
    how many words there are."""
    return {label: {"top": rows[:WORDS_INLINE], "bottom": rows[-WORDS_INLINE:][::-1], "words": len(rows)}
            for label, rows in stats.items()}


class NpzSpool:
    """``attributions.npz`` written from records one at a time: the columns are spooled to files in ``spool_dir``
    and streamed into the archive at the end, in ``np.savez_compressed``'s format (``ids``, ``offsets``,
    ``tokens``, ``token_attributions``, ``score``, ``baseline_score``, ``attribution_sum``, ``relative_delta``;
    a None number is NaN)."""

    STRINGS = ("ids", "tokens")
    NUMBERS = ("token_attributions", "score", "baseline_score", "attribution_sum", "relative_delta")
    CHUNK = 1 << 16

    def __init__(self, spool_dir: Path) -> None:
        self.dir = spool_dir
        self.files: dict[str, IO[Any]] = {}
        for name in self.STRINGS:
            self.files[name] = open(spool_dir / f"{name}.txt", "w", encoding="utf-8")
        for name in (*self.NUMBERS, "lengths"):
            self.files[name] = open(spool_dir / f"{name}.bin", "wb")
        self.count = dict.fromkeys((*self.STRINGS, *self.NUMBERS, "lengths"), 0)
        self.width = dict.fromkeys(self.STRINGS, 1)

    @staticmethod
    def _number(v: Any) -> float:
        return float("nan") if v is None else float(v)

    def _strings(self, name: str, values: Sequence[str]) -> None:
        for v in values:
            self.files[name].write(json.dumps(v) + "\n")
            self.width[name] = max(self.width[name], len(v))
        self.count[name] += len(values)

    def _numbers(self, name: str, values: Sequence[Any], code: str = "d") -> None:
        array(code, [int(v) for v in values] if code == "q" else [self._number(v) for v in values]
              ).tofile(self.files[name])
        self.count[name] += len(values)

    def add(self, rec: dict[str, Any]) -> None:
        self._strings("ids", [str(rec["id"])])
        # an exported classifier's record has cells (pixels, patches or features) and no tokens: its cells are stored
        tokens = rec["tokens"] if rec.get("tokens") is not None else rec["words"]
        values = rec["token_attributions"] if rec.get("token_attributions") is not None else rec["word_attributions"]
        self._strings("tokens", list(tokens))
        self._numbers("token_attributions", values)
        self._numbers("lengths", [len(tokens)], "q")
        for name in ("score", "baseline_score", "attribution_sum", "relative_delta"):
            self._numbers(name, [rec.get(name)])

    def close(self) -> None:
        for fh in self.files.values():
            fh.close()

    def _entry(self, zf: zipfile.ZipFile, name: str, dtype: np.dtype, n: int, chunks: Iterable[np.ndarray]) -> None:
        with zf.open(f"{name}.npy", "w", force_zip64=True) as fh:
            np.lib.format.write_array_header_1_0(fh, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                      "fortran_order": False, "shape": (n,)})
            for chunk in chunks:
                fh.write(np.ascontiguousarray(chunk, dtype=dtype).tobytes())

    def _string_chunks(self, name: str, dtype: np.dtype) -> Iterable[np.ndarray]:
        with open(self.dir / f"{name}.txt", encoding="utf-8") as fh:
            part: list[str] = []
            for line in fh:
                part.append(json.loads(line))
                if len(part) == self.CHUNK:
                    yield np.array(part, dtype=dtype)
                    part = []
            if part:
                yield np.array(part, dtype=dtype)

    def _number_chunks(self, name: str, dtype: np.dtype) -> Iterable[np.ndarray]:
        with open(self.dir / f"{name}.bin", "rb") as fh:
            while True:
                part = np.fromfile(fh, dtype=dtype, count=self.CHUNK)
                if not part.size:
                    return
                yield part

    def _offsets(self) -> Iterable[np.ndarray]:
        yield np.zeros(1, dtype=np.int64)
        total = 0
        for lengths in self._number_chunks("lengths", np.dtype(np.int64)):
            ends = total + np.cumsum(lengths)
            total = int(ends[-1])
            yield ends

    def write(self, path: Path) -> None:
        self.close()
        f8 = np.dtype(np.float64)
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
            ids = np.dtype(f"<U{self.width['ids']}")
            self._entry(zf, "ids", ids, self.count["ids"], self._string_chunks("ids", ids))
            self._entry(zf, "offsets", np.dtype(np.int64), self.count["lengths"] + 1, self._offsets())
            tokens = np.dtype(f"<U{self.width['tokens']}")
            self._entry(zf, "tokens", tokens, self.count["tokens"], self._string_chunks("tokens", tokens))
            for name in self.NUMBERS:
                self._entry(zf, name, f8, self.count[name], self._number_chunks(name, f8))


class _Side:
    """One model's records: statistics, completeness warnings, the JSONL of every record, the first records and
    errors inline, and its parts' summaries."""

    def __init__(self, model: str, records: IO[str], errors_path: Path, threshold: float, prefix: str = "",
                 normalize: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        self.model = model
        self.normalize = normalize
        self.acc = ReportAccumulator()
        self.warn = CompletenessWarnings(threshold, prefix=prefix)
        self.views: list[str] | None = None
        self.summaries: list[dict[str, Any]] = []
        self.records = records
        self.inline: list[dict[str, Any]] = []
        self.errors_path = errors_path
        self.errors_fh: IO[str] | None = None
        self.errors_inline: list[dict[str, Any]] = []
        self.n_errors = 0

    @property
    def main_view(self) -> str:
        return self.acc.main_view

    def summary(self, summary: dict[str, Any]) -> None:
        """A part's summary; the first that names the model's views sets the view records hold at top level."""
        if self.views is None and summary.get("views"):
            self.views = list(summary["views"])
            self.acc.main_view = self.warn.main_view = self.views[0]
        self.summaries.append(summary)

    def errors(self, errors: Iterable[dict[str, Any]]) -> None:
        for e in errors:
            e = {"id": str(e["id"]), "error": str(e["error"])}
            if self.errors_fh is None:
                self.errors_fh = open(self.errors_path, "w", encoding="utf-8")
            self.errors_fh.write(json.dumps(e) + "\n")
            if len(self.errors_inline) < ERRORS_INLINE:
                self.errors_inline.append(e)
            self.n_errors += 1

    def add(self, rec: dict[str, Any]) -> dict[str, Any]:
        rec = json_safe(rec)
        if self.normalize is not None:
            rec = self.normalize(rec)
        self.acc.add(rec)
        self.warn.add(rec)
        self.records.write(json.dumps(rec) + "\n")
        if len(self.inline) < SAMPLES_INLINE:
            self.inline.append(rec)
        return rec

    def close(self) -> None:
        self.records.close()
        if self.errors_fh is not None:
            self.errors_fh.close()

    def common(self, stats: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
        """The fields the result and its comparison share (``stats``: the model's word statistics, when already
        computed)."""
        stats = self.acc.word_stats() if stats is None else stats
        return {"model": self.model, "n_samples": self.acc.n, "n_errors": self.n_errors,
                "samples": self.inline, "errors": self.errors_inline,
                "summary": merge_summaries(self.summaries, self.acc, self.n_errors),
                "relative_delta": self.acc.delta_distribution(),
                "relative_delta_by_view": self.acc.delta_by_view(),
                "word_stats": label_word_stats(stats)}

    def listed(self, prefix: str, records_file: str) -> dict[str, dict[str, Any]]:
        errors_file = self.errors_path.name if self.n_errors else None
        return {f"{prefix}samples": {"total": self.acc.n, "inline": len(self.inline), "artifact": records_file},
                f"{prefix}errors": {"total": self.n_errors, "inline": len(self.errors_inline),
                                    "artifact": errors_file}}


class AttributionReport:
    """The result of an attribution job and its artifacts in ``out_dir``, from its parts in sample order (see the
    module's docstring). ``normalize`` maps each (JSON-safe) record to the form the result holds (the service
    passes its result model's dump, so that a record inline and its line in the JSONL are equal). Use as a
    context manager (its files are closed, and its spool removed, on the way out)::

        with AttributionReport(out_dir, options) as report:
            report.part(part_summary(...), records, compare_records)   # once per part, in sample order
            result = report.finish()
    """

    def __init__(self, out_dir: Path, options: ReportOptions,
                 normalize: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.options = options
        self._spool = Path(tempfile.mkdtemp(prefix=f".{self.dir.name}-spool-", dir=self.dir.parent))
        threshold = options.warn_relative_delta
        self.main = _Side(options.model, self._open(SAMPLES_FILE), self.dir / ERRORS_FILE, threshold,
                          normalize=normalize)
        self.other = None
        if options.compare_with is not None:
            self.other = _Side(options.compare_with, self._open(COMPARE_FILE), self.dir / COMPARE_ERRORS_FILE,
                               threshold, prefix=f"compare_with {options.compare_with!r}: ", normalize=normalize)
        self._csv = open(self.dir / "words.csv", "w", newline="", encoding="utf-8")
        self.words_csv = WordsCsv(self._csv)
        self.npz = NpzSpool(self._spool)
        self.inputs = InputWarnings()
        self.faithful: list[dict[str, Any]] = []  # each record's faithfulness (when asked for)
        self.faithfulness_seconds = 0.0
        self.faithfulness_cpu_seconds = 0.0
        self._inline_ids: set[str] = set()
        self._paired: dict[str, dict[str, Any]] = {}  # the comparison's records of the inline samples, by id

    def _open(self, name: str) -> IO[str]:
        return open(self.dir / name, "w", encoding="utf-8")

    def __enter__(self) -> AttributionReport:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.main.close()
        if self.other is not None:
            self.other.close()
        self._csv.close()
        self.npz.close()
        shutil.rmtree(self._spool, ignore_errors=True)

    @property
    def n_errors(self) -> int:
        return self.main.n_errors

    # ----------------------------------------------------------------------------------------------- feeding
    def part(self, summary: dict[str, Any], records: Iterable[dict[str, Any]],
             compare_records: Iterable[dict[str, Any]] = ()) -> None:
        """One part, after the earlier ones: its summary (:func:`part_summary`), its records and the comparison
        model's records of the same samples (each in sample order)."""
        self.main.summary(summary["summary"])
        self.main.errors(summary["errors"])
        if "inputs" in summary:  # (absent from a shard stored by an earlier version)
            self.inputs.merge(summary["inputs"])
        self.faithfulness_seconds += summary.get("faithfulness_seconds") or 0.0
        self.faithfulness_cpu_seconds += summary.get("faithfulness_cpu_seconds") or 0.0
        for rec in records:
            self.add(rec)
        if self.other is not None:
            self.other.summary(summary["compare_summary"])
            self.other.errors(summary["compare_errors"])
            for rec in compare_records:
                self.add_compare(rec)

    def add(self, rec: dict[str, Any]) -> None:
        """The next record of the model."""
        rec = self.main.add(rec)
        self.words_csv.add(self.main.model, rec, self.main.main_view)
        self.npz.add(rec)
        if self.options.faithfulness and rec.get("faithfulness"):
            self.faithful.append(rec["faithfulness"])
        if len(self._inline_ids) < SAMPLES_INLINE:
            self._inline_ids.add(rec["id"])

    def add_compare(self, rec: dict[str, Any]) -> None:
        """The next record of the ``compare_with`` model (after the model's record of the same sample)."""
        if self.other is None:
            raise ValueError("this report compares with no model")
        rec = self.other.add(rec)
        if rec["id"] in self._inline_ids:
            self._paired[rec["id"]] = rec

    def errors(self, errors: Sequence[dict[str, Any]]) -> None:
        """Samples no part attributed (a failed shard's): errors of the model and of the comparison's."""
        self.main.errors(errors)
        if self.other is not None:
            self.other.errors(errors)

    # ---------------------------------------------------------------------------------------------- the result
    def _faithfulness(self, attribution_seconds: float | None) -> dict[str, Any] | None:
        if not self.options.faithfulness:
            return None
        from models.news.faithfulness import merged_section

        return merged_section(self.faithful, self.main.views[0] if self.main.views else None,
                              self.options.faithfulness_seed, self.options.baseline, self.faithfulness_seconds,
                              self.faithfulness_cpu_seconds, attribution_seconds or 0.0)

    def _comparison(self) -> dict[str, Any]:
        o = self.options
        other = self.other
        assert other is not None
        self._words_of(other)
        cmp = compare(self.main.acc, other.acc, threshold=o.compare_threshold, changed_min_count=o.compare_min_count)
        (self.dir / "comparison.json").write_text(json.dumps(json_safe(cmp)))
        per_sample = [compare_sample(r, self._paired[r["id"]], o.compare_top_n)
                      for r in self.main.inline if r["id"] in self._paired]
        return {**other.common(), "threshold": cmp["threshold"], "min_count": cmp["min_count"],
                "changed_min_count": cmp["changed_min_count"], "top_n": o.compare_top_n,
                "changed": cmp["changed"][:CHANGED_INLINE], "changed_total": len(cmp["changed"]),
                "new_top_words": cmp["new_top_words"], "per_sample": per_sample}

    def _words_of(self, side: _Side) -> None:
        """The comparison model's rows of ``words.csv``, after the model's: read back from its JSONL."""
        side.records.flush()
        with open(self.dir / COMPARE_FILE, encoding="utf-8") as fh:
            for line in fh:
                self.words_csv.add(side.model, json.loads(line), side.main_view)

    def finish(self, shards: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write the remaining artifacts and return the result (``artifacts`` is the caller's to list once the
        files are where they are served from); ``shards``: how a sharded run was split, None for a whole one."""
        main = self.main
        main.records.flush()
        stats = main.acc.word_stats()
        (self.dir / "word_stats.json").write_text(json.dumps(json_safe(stats)))
        result = main.common(stats)
        comparison = self._comparison() if self.other is not None else None
        self._csv.flush()
        if main.acc.n >= NPZ_MIN_SAMPLES:
            self.npz.write(self.dir / NPZ_FILE)
        listed = main.listed("", SAMPLES_FILE)
        if self.other is not None:
            listed.update(self.other.listed("comparison.", COMPARE_FILE))
        result.update({
            "top_words": main.acc.top_words(self.options.top_k),
            "labels": sorted(main.acc.n_label.items()),
            "warnings": (self.inputs.warnings(main.views or [])
                         + main.warn.warnings() + (self.other.warn.warnings() if self.other is not None else [])),
            "warn_relative_delta": self.options.warn_relative_delta,
            "faithfulness": self._faithfulness(result["summary"]["seconds"]),
            "comparison": comparison,
            "listed": listed,
            "shards": shards,
            "artifacts": [],
        })
        self.close()
        return json_safe(result)
