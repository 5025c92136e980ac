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
