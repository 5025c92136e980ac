"""The attributions kind's one result shape: the same request run whole and as shards, on real workers, gives
results that both validate against ``AttributionResult`` and are equal field by field (identical keys at every level,
equal strings and integers, floats within the pipeline's tolerance: the shards batch their samples differently), and
the same artifacts, ``samples.jsonl`` (and ``compare.jsonl``) equal record by record."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from core.contract.results.attributions import AttributionResult
from models.news.report import CHANGED_INLINE, NPZ_MIN_SAMPLES, SAMPLES_INLINE
from tests.results_compare import assert_renders, assert_same
from tests.test_fanout import DATASET, MODEL, NAML, _setup

HISTORY = ["Lakers beat Celtics in overtime thriller", "Yankees rally to win the league title"]
BODY = "The team won the game after a late rally in the fourth quarter."


def _inline(n: int) -> list[dict]:
    """Inline samples for NAML: some without bodies (input warnings), one whose candidate is blank (an error)."""
    out = []
    for i in range(n):
        s = {"id": f"q{i}", "history": HISTORY, "candidate": f"Star signs record deal number {i} with the club",
             "label": ("real", "fake")[i % 2]}
        if i % 3:
            s["candidate_body"] = BODY
            s["history_bodies"] = [BODY] * len(HISTORY)
        out.append(s)
    out[4]["candidate"] = "   "
    return out


# name -> (request, shard_size of the sharded run)
CASES = {
    # more samples than the result holds inline: 100 of 120 inline, per_sample of the inline ones, the npz
    "nrms-compare": ({"model": MODEL, "compare_with": NAML, "n_steps": 4, "top_k": 3, "precision": "fp32",
                      "dataset": {**DATASET, "n_samples": SAMPLES_INLINE + 20}}, 48),
    "nrms-faithfulness": ({"model": MODEL, "n_steps": 8, "top_k": 3, "precision": "fp32", "faithfulness": True,
                           "faithfulness_seed": 2, "dataset": {**DATASET, "n_samples": NPZ_MIN_SAMPLES + 4}}, 12),
    "naml-compare-faithfulness": ({"model": NAML, "compare_with": MODEL, "n_steps": 8, "top_k": 3,
                                   "precision": "fp32", "faithfulness": True,
                                   "dataset": {**DATASET, "n_samples": 24}}, 8),
    "naml-inline": ({"model": NAML, "n_steps": 8, "top_k": 3, "precision": "fp32", "max_failed_fraction": 0.2,
                     "samples": _inline(10)}, 4),
}

# per run, not per sample set: a shard resolves "auto" batch sizes for its own samples, and times are work
PER_RUN = {"seconds", "seconds_prepare", "batch_size", "alpha_batch_size", "cpu_seconds", "attribution_seconds",
           "time_ratio"}
RTOL, ATOL = 1e-4, 1e-6  # attributions, scores and their statistics (fp32, batched differently)
# a completeness error divides an fp32 residual (~1e-6 of the score here) by F(x) - F(x'): compared in absolute terms
DELTA_ATOL = 1e-4
# a faithfulness number is a score under masks, batched differently: its tests' statistics move with it
FAITH_RTOL = 1e-3


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    service = _setup(tmp_path_factory, "contract-home", ("explain,bulk", "explain,bulk"), naml=True)
    yield service
    service.stop()


def _tolerance(where: str) -> tuple[float, float]:
    last = where.rsplit(".", 1)[-1]
    if "relative_delta" in where or last == "delta":
        return 5e-2, DELTA_ATOL
    if "faithfulness" in where:
        return FAITH_RTOL, 1e-5
    return RTOL, ATOL


def _assert_same(got, want, where: str) -> None:
    assert_same(got, want, _tolerance, PER_RUN, where)


def _post(svc, body: dict) -> str:
    r = svc.client.post("/attributions", json=body)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def _jsonl(svc, job_id: str, name: str) -> list[dict]:
    return [json.loads(line) for line in svc.artifact(job_id, name).decode().splitlines() if line.strip()]


def _n(body: dict) -> int:
    return len(body["samples"]) if "samples" in body else body["dataset"]["n_samples"]


# the larger runs (more samples than a result holds inline; faithfulness over 36 samples) go with the slow tests
SLOW_CASES = {"nrms-compare", "nrms-faithfulness"}


@pytest.fixture(scope="module")
def runs(svc, request):
    """Every selected case run whole and sharded (submitted together, so both workers are busy):
    {case: (whole, sharded)} job ids."""
    selected = {item.callspec.params["case"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec") and "case" in item.callspec.params}
    ids = {}
    for case, (body, shard_size) in CASES.items():
        if case in selected:
            ids[case] = (_post(svc, {**body, "shard_size": _n(body)}),
                         _post(svc, {**body, "shard_size": shard_size}))
    for whole, sharded in ids.values():
        for job_id in (whole, sharded):
            job = svc.wait(job_id, timeout_s=600)
            assert job["status"] == "succeeded", (job, svc.worker_logs())
    return ids


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c
                                  for c in CASES])
def test_whole_and_sharded_runs_give_one_result(svc, runs, case):
    body, shard_size = CASES[case]
    n = _n(body)
    whole_id, sharded_id = runs[case]
    whole = svc.client.get(f"/jobs/{whole_id}/result").json()
    sharded = svc.client.get(f"/jobs/{sharded_id}/result").json()
    for result in (whole, sharded):
        AttributionResult.model_validate(result)
    assert whole["shards"] is None
    assert sharded["shards"] == {"total": -(-n // shard_size), "failed": []}

    # the SDK's renderers and the CLI's table draw both
    from explainq_client import AttributionResult as SDKAttributionResult

    assert_renders(svc.settings, (whole_id, sharded_id), SDKAttributionResult)

    # every field but how the run was split and the files' sizes (their names and contents are compared below)
    _assert_same(*({k: v for k, v in r.items() if k not in ("shards", "artifacts")} for r in (sharded, whole)),
                 "result")

    # the shape itself: the lists held in part, and what they say
    n_ok = whole["n_samples"]
    assert n_ok + whole["n_errors"] == n
    assert len(whole["samples"]) == min(n_ok, SAMPLES_INLINE)
    assert whole["listed"]["samples"] == {"total": n_ok, "inline": len(whole["samples"]), "artifact": "samples.jsonl"}
    errors_file = "errors.jsonl" if whole["n_errors"] else None
    assert whole["listed"]["errors"] == {"total": whole["n_errors"], "inline": whole["n_errors"],
                                         "artifact": errors_file}
    assert all(set(s) == {"top", "bottom", "words"} for s in whole["word_stats"].values())
    names = {a["name"] for a in whole["artifacts"]}
    assert names == {a["name"] for a in sharded["artifacts"]}
    comparing = "compare_with" in body
    assert names == {"samples.jsonl", "words.csv", "word_stats.json"} | (
        {"attributions.npz"} if n_ok >= NPZ_MIN_SAMPLES else set()) | (
        {"compare.jsonl", "comparison.json"} if comparing else set()) | ({"errors.jsonl"} if errors_file else set())
    if comparing:
        cmp = whole["comparison"]
        assert set(whole["listed"]) == {"samples", "errors", "comparison.samples", "comparison.errors"}
        assert whole["listed"]["comparison.samples"] == {"total": cmp["n_samples"], "inline": len(cmp["samples"]),
                                                        "artifact": "compare.jsonl"}
        assert [p["id"] for p in cmp["per_sample"]] == [s["id"] for s in whole["samples"]]
        assert len(cmp["changed"]) == min(cmp["changed_total"], CHANGED_INLINE)
    else:
        assert whole["comparison"] is None and set(whole["listed"]) == {"samples", "errors"}
    if body.get("faithfulness"):
        assert whole["faithfulness"]["n_samples"] == n_ok and whole["faithfulness"]["seed"] == body.get(
            "faithfulness_seed", 0)
    else:
        assert whole["faithfulness"] is None
    if "samples" in body:  # the input warnings are worded over every sample, not per shard
        assert any(w.startswith("4 sample(s) have no candidate_body") for w in whole["warnings"]), whole["warnings"]
        assert whole["errors"] == [{"id": "q4", "error": "candidate must be a non-empty string"}]
        # an empty body is its own baseline: nothing to attribute, completeness exact (not 0 or 1 by rounding)
        empty = [s for s in whole["samples"] if not s["views"]["body"]["words"]]
        assert empty and all(s["views"]["body"]["relative_delta"] == 0.0 for s in empty)
        assert not any("(body) exceeds" in w for w in whole["warnings"]), whole["warnings"]

    # the artifacts: every record, in order, equal
    for name in ("samples.jsonl", "errors.jsonl", "compare.jsonl") if comparing else ("samples.jsonl", "errors.jsonl"):
        if name in names:
            _assert_same(_jsonl(svc, sharded_id, name), _jsonl(svc, whole_id, name), name)
    assert _jsonl(svc, whole_id, "samples.jsonl")[:SAMPLES_INLINE] == whole["samples"]
    stats = [json.loads(svc.artifact(j, "word_stats.json")) for j in (sharded_id, whole_id)]
    _assert_same(*stats, "word_stats.json")
    assert {label: len(rows) for label, rows in stats[1].items()} == {
        label: s["words"] for label, s in whole["word_stats"].items()}
    rows = [list(csv.reader(io.StringIO(svc.artifact(j, "words.csv").decode()))) for j in (sharded_id, whole_id)]
    assert [r[:7] for r in rows[0]] == [r[:7] for r in rows[1]]
    np.testing.assert_allclose([float(r[7]) for r in rows[0][1:]], [float(r[7]) for r in rows[1][1:]],
                               rtol=RTOL, atol=ATOL)
    if comparing:
        full = [json.loads(svc.artifact(j, "comparison.json")) for j in (sharded_id, whole_id)]
        _assert_same(*full, "comparison.json")
        assert full[1]["changed"][:CHANGED_INLINE] == whole["comparison"]["changed"]
    if "attributions.npz" in names:
        arrays = [np.load(io.BytesIO(svc.artifact(j, "attributions.npz"))) for j in (sharded_id, whole_id)]
        assert sorted(arrays[0].files) == sorted(arrays[1].files)
        for key in arrays[1].files:
            if arrays[1][key].dtype.kind in "US" or key == "offsets":
                assert arrays[0][key].tolist() == arrays[1][key].tolist(), key
            elif key != "relative_delta":
                np.testing.assert_allclose(arrays[0][key], arrays[1][key], rtol=RTOL, atol=ATOL, err_msg=key)
        assert arrays[1]["ids"].tolist() == [r["id"] for r in _jsonl(svc, whole_id, "samples.jsonl")]
