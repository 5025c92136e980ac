"""The streaming report statistics: equal to a direct computation, and identical when replayed from shards."""

from __future__ import annotations

import json
import random

import numpy as np

from models.news.attribution import compare_reports, word_stats
from models.news.summary import ReportAccumulator, compare

VOCAB = ["Shocking", "star", "deal", "record", "win", "Lakers", "title", "[UNK]", "the", "a"]


def _records(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [rng.choice(VOCAB) for _ in range(rng.randint(3, 9))]
        attrs = [rng.gauss(0, 1) for _ in words]
        ranked = sorted(zip(words, attrs, strict=True), key=lambda t: -t[1])
        out.append({"id": f"s{i}", "label": rng.choice(["real", "fake", None]), "words": words,
                    "word_attributions": attrs, "relative_delta": abs(rng.gauss(0, 1e-3)),
                    "top_positive": [{"word": w, "attribution": a} for w, a in ranked if a > 0][:3]})
    return out


def test_word_stats_agree_with_a_direct_computation_elementwise():
    records = _records(300, 0)
    stats = word_stats(records)
    for label in ("real", "fake", "unlabelled"):
        subset = [r for r in records if (r["label"] or "unlabelled") == label]
        for row in stats[label]:
            values = [a for r in subset for w, a in zip(r["words"], r["word_attributions"], strict=True)
                      if w.lower() == row["word"]]
            np.testing.assert_allclose(row["mean"], np.mean(values), rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(row["std"], np.std(values), rtol=1e-9, atol=1e-15)
            assert row["count"] == len(values)
            assert row["frequency"] == sum(row["word"] in {w.lower() for w in r["words"]} for r in subset) / len(subset)
        assert [r["mean"] for r in stats[label]] == sorted((r["mean"] for r in stats[label]), reverse=True)


def test_replaying_shard_jsonl_in_order_gives_identical_statistics(tmp_path):
    records = _records(500, 1)
    whole = ReportAccumulator().extend(records)
    paths = []
    for k in range(0, len(records), 73):  # uneven shards, written and read back as JSONL
        path = tmp_path / f"shard-{k:05d}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records[k:k + 73]))
        paths.append(path)
    replay = ReportAccumulator()
    for path in paths:
        with open(path) as fh:
            for line in fh:
                replay.add(json.loads(line))
    assert replay.word_stats() == whole.word_stats()
    assert replay.delta_distribution() == whole.delta_distribution()
    assert replay.top_words(5) == whole.top_words(5)
    other = ReportAccumulator().extend(_records(500, 2))
    assert compare(replay, other) == compare(whole, other)


def test_delta_distribution_and_top_words():
    records = _records(200, 3)
    acc = ReportAccumulator().extend(records)
    rel = np.array([r["relative_delta"] for r in records])
    assert acc.delta_distribution() == {"median": float(np.median(rel)), "p95": float(np.quantile(rel, 0.95)),
                                        "max": float(rel.max())}
    top = acc.top_words(3, min_count=5)
    assert len(top["positive"]) <= 3 and all(r["mean"] > 0 and r["count"] >= 5 for r in top["positive"])
    assert all(r["mean"] < 0 for r in top["negative"])
    assert ReportAccumulator().delta_distribution() == {"median": None, "p95": None, "max": None}


def test_compare_reports_finds_a_planted_word():
    clean = _records(200, 4)
    poisoned = [dict(r, words=[*r["words"], "Shocking"], word_attributions=[*r["word_attributions"], 3.0],
                     top_positive=[{"word": "Shocking", "attribution": 3.0}, *r["top_positive"]]) for r in clean]
    out = compare_reports({"samples": clean}, {"samples": poisoned}, threshold=0.5)
    assert out["changed"][0]["word"] == "shocking" and out["changed"][0]["change"] > 0.5


def test_every_view_counts_in_the_delta_distribution():
    """NAML records hold the body view under ``views``: its relative deltas count, overall and per view."""
    records = _records(50, 3)
    for i, r in enumerate(records):
        r["views"] = {"body": {"relative_delta": 1e-2 + i * 1e-4}}
    acc = ReportAccumulator().extend(records)
    title = [r["relative_delta"] for r in records]
    body = [r["views"]["body"]["relative_delta"] for r in records]
    assert acc.delta_distribution()["median"] == float(np.median(title + body))
    by_view = acc.delta_by_view()
    assert list(by_view) == ["title", "body"]
    assert by_view["body"]["max"] == max(body) and by_view["title"]["median"] == float(np.median(title))



# ------------------------------------------------------------------------- the result's builder, whole or in parts
def _attributed(records: list[dict], seed: int) -> list[dict]:
    """Records as ``explain`` writes them (tokens, scores, completeness terms) over ``_records``' words; sample
    ``s7``'s completeness error is not finite."""
    rng = random.Random(seed)
    out = []
    for r in records:
        score, base = rng.gauss(0, 1), rng.gauss(0, 1)
        total = sum(r["word_attributions"])
        out.append({**r, "tokens": list(r["words"]), "token_attributions": list(r["word_attributions"]),
                    "display_words": list(r["words"]), "spans": [[i, i + 1] for i in range(len(r["words"]))],
                    "score": score, "baseline_score": base, "attribution_sum": total,
                    "delta": total - (score - base), "top_negative": [],
                    "relative_delta": float("nan") if r["id"] == "s7" else r["relative_delta"]})
    return out


def _run_summary(n: int, n_errors: int) -> dict:
    return {"n_samples": n, "n_errors": n_errors, "method": "gausslegendre", "n_steps": 8,
            "gradient_evaluations": 8 * n, "precision": "fp32", "baseline": "pad", "optimized": True,
            "views": ["title"], "median_relative_delta": 0.0, "max_relative_delta": 0.0, "relative_delta_by_view": {},
            "tolerance": None, "tolerance_met": None, "batch_size": 16, "alpha_batch_size": 8, "seconds": 1.0,
            "seconds_prepare": 0.5}


def _build(out_dir, records: list[dict], other: list[dict], failed: set[str], cuts: list[int]) -> dict:
    """The result of ``records`` (``other``: the comparison model's) fed as parts ending at ``cuts``; the samples
    in ``failed`` are errors of both models."""
    from models.news.data import Sample
    from models.news.report import AttributionReport, ReportOptions
    from models.news.summary import InputWarnings

    options = ReportOptions(model="a", top_k=3, warn_relative_delta=1e-3, compare_with="b", compare_threshold=0.1,
                            compare_min_count=2, compare_top_n=2, faithfulness=False, faithfulness_seed=0,
                            baseline="pad")
    samples = [Sample(id=r["id"], history=["h"], candidate="c", label=r["label"]) for r in records]
    bounds = [0, *cuts, len(records)]
    with AttributionReport(out_dir, options) as report:
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            errors = [{"id": r["id"], "error": "no tokens"} for r in records[lo:hi] if r["id"] in failed]
            done = [r for r in records[lo:hi] if r["id"] not in failed]
            report.part({"n": hi - lo, "summary": _run_summary(len(done), len(errors)), "errors": errors,
                         "inputs": InputWarnings().extend(samples[lo:hi]).state(),
                         "compare_summary": _run_summary(len(done), len(errors)), "compare_errors": errors},
                        done, [r for r in other[lo:hi] if r["id"] not in failed])
        return report.finish()


def test_the_result_is_the_same_whole_or_in_parts(tmp_path):
    """One builder, fed the whole run as one part or the shards' parts in order: the same result (times and
    batch sizes summed or taken from the first part), the same artifacts byte for byte."""
    from models.news.attribution import samples_to_arrays
    from models.news.report import CHANGED_INLINE, SAMPLES_INLINE

    records = _attributed(_records(SAMPLES_INLINE + 30, 5), 6)
    other = _attributed([dict(r, word_attributions=[a + (0.5 if w == "star" else 0.0) for w, a in
                                                    zip(r["words"], r["word_attributions"], strict=True)])
                         for r in _records(SAMPLES_INLINE + 30, 5)], 7)
    failed = {"s3", "s77"}
    whole = _build(tmp_path / "whole", records, other, failed, [])
    parts = _build(tmp_path / "parts", records, other, failed, [17, 60, 61, 120])
    assert parts["summary"]["seconds"] == 5.0 and whole["summary"]["seconds"] == 1.0  # work, summed over parts
    for result in (whole, parts):
        for summary in (result["summary"], result["comparison"]["summary"]):
            del summary["seconds"], summary["seconds_prepare"]
    assert parts == whole
    for name in ("samples.jsonl", "compare.jsonl", "errors.jsonl", "compare_errors.jsonl", "words.csv",
                 "word_stats.json", "comparison.json", "attributions.npz"):
        assert (tmp_path / "parts" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name

    ok = [r for r in records if r["id"] not in failed]
    assert whole["n_samples"] == len(ok) and whole["n_errors"] == 2 and whole["shards"] is None
    assert [r["id"] for r in whole["samples"]] == [r["id"] for r in ok[:SAMPLES_INLINE]]
    assert whole["samples"][6]["relative_delta"] is None  # s7: NaN, stored as null
    assert whole["listed"] == {
        "samples": {"total": len(ok), "inline": SAMPLES_INLINE, "artifact": "samples.jsonl"},
        "errors": {"total": 2, "inline": 2, "artifact": "errors.jsonl"},
        "comparison.samples": {"total": len(ok), "inline": SAMPLES_INLINE, "artifact": "compare.jsonl"},
        "comparison.errors": {"total": 2, "inline": 2, "artifact": "compare_errors.jsonl"}}
    assert whole["summary"]["n_samples"] == len(ok) and whole["summary"]["n_errors"] == 2
    assert whole["summary"]["gradient_evaluations"] == 8 * len(ok)
    acc = ReportAccumulator().extend(json.loads(json.dumps(r).replace("NaN", "null")) for r in ok)
    assert whole["relative_delta"] == acc.delta_distribution()
    assert whole["word_stats"]["real"]["top"] == acc.word_stats()["real"][:50]
    assert whole["word_stats"]["real"]["words"] == len(acc.word_stats()["real"])
    assert whole["labels"] == [[k, v] for k, v in sorted(acc.n_label.items())]
    cmp = whole["comparison"]
    assert cmp["changed"][0]["word"] == "star" and cmp["changed_total"] == len(
        json.loads((tmp_path / "whole" / "comparison.json").read_text())["changed"]) >= len(cmp["changed"])
    assert len(cmp["changed"]) <= CHANGED_INLINE
    assert [p["id"] for p in cmp["per_sample"]] == [r["id"] for r in whole["samples"]]
    assert all(c["word"] == "star" for p in cmp["per_sample"] for c in p["changed"][:1] if p["changed"])
    # the npz holds what samples_to_arrays made of one job's records
    want = samples_to_arrays({"samples": ok})
    with np.load(tmp_path / "whole" / "attributions.npz") as got:
        assert sorted(got.files) == sorted(want)
        for key, value in want.items():
            assert got[key].dtype == value.dtype, key
            np.testing.assert_array_equal(got[key], value)


def test_input_warnings_merged_from_parts_equal_one_pass():
    from models.news.data import Sample
    from models.news.summary import InputWarnings

    samples = [Sample(id=f"s{i}", history=["h"], candidate="c", candidate_body=None if i % 4 else "b",
                      history_bodies=None if i % 5 else ["b"]) for i in range(40)]
    whole = InputWarnings().extend(samples)
    merged = InputWarnings()
    for lo in range(0, 40, 7):
        merged.merge(json.loads(json.dumps(InputWarnings().extend(samples[lo:lo + 7]).state())))
    assert merged.warnings(("title", "body")) == whole.warnings(("title", "body"))
    lines = whole.warnings(("title", "body"))
    assert lines[0].startswith("no sample has a label (a news item's real/fake label")
    assert lines[1].startswith("32 sample(s) have no history_bodies (e.g. ['s1', 's2', 's3'])")
    assert lines[2].startswith("30 sample(s) have no candidate_body (e.g. ['s1', 's2', 's3'])")
    assert whole.warnings(("title",)) == lines[:1]
