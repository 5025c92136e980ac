"""``GET /compare``: two succeeded jobs of one kind side by side. The rank statistics against scipy; the answer
for attributions (matched by sample id, records read from the artifact past the inline ones), TracIn (overlap,
rank correlation, entries and exits) and training (both histories, the last metrics, the changed fields); the
caller's own jobs only (404 as for an unknown job), 409 until both succeeded, 422 for kinds that differ or
cannot be compared."""

from __future__ import annotations

import random

import pytest

from core import compare
from tests.compare_fixtures import (
    ALICE,
    BOB,
    KEYS,
    attribution_pair,
    bearer,
    succeeded,
    tracin_pair,
    training_result,
)


@pytest.mark.parametrize("seed", range(6))
def test_spearman_and_kendall_tau_b_agree_with_scipy_with_and_without_ties(seed: int) -> None:
    from scipy import stats

    rng = random.Random(seed)
    n = rng.randint(2, 60)
    levels = rng.choice([3, 10, 1000])  # few levels: many ties
    x = [float(rng.randint(0, levels)) for _ in range(n)]
    y = [float(rng.randint(0, levels)) for _ in range(n)]
    if len(set(x)) < 2 or len(set(y)) < 2:
        assert compare.kendall_tau_b(x, y) is None and compare.spearman(x, y) is None
        return
    assert compare.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    assert compare.kendall_tau_b(x, y) == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)


def test_identical_lists_correlate_fully_and_reversed_ones_negatively() -> None:
    entries = [{"train_triple": ["h", "r", str(i)], "influence": 1.0 - i / 10} for i in range(5)]
    same = compare.compare_lists("proponents", entries, entries)
    assert (same.overlap, same.overlap_fraction, same.spearman, same.kendall) == (5, 1.0, 1.0, 1.0)
    assert same.entered == same.left == 0 and {t.change for t in same.triples} == {"stayed"}
    rev = compare.compare_lists("proponents", entries, entries[::-1])
    assert rev.spearman == pytest.approx(-1.0) and rev.kendall == pytest.approx(-1.0)
    # disjoint lists: everything left or entered, and missing triples rank after each list's end
    other = [{"train_triple": ["x", "r", str(i)], "influence": 0.5} for i in range(3)]
    dis = compare.compare_lists("proponents", entries, other)
    assert (dis.k, dis.overlap, dis.entered, dis.left, dis.union) == (3, 0, 3, 3, 8)
    assert [t.change for t in dis.triples].count("beyond") == 2  # a's ranks 4 and 5: past both top-3 lists


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from tests.service import api_client

    with api_client(tmp_path_factory.mktemp("compare"), EXPLAINQ_API_KEYS=KEYS) as c:
        yield c


def _job(client, result, kind, key=ALICE, **kw) -> str:
    return succeeded(client, client.app.state.redis, result, kind, key=key, settings=client.app.state.settings,
                     **kw)


def _compare(client, a: str, b: str, key: str = ALICE):
    return client.get("/compare", params={"a": a, "b": b}, headers=bearer(key))


def test_attributions_are_matched_by_sample_id_past_the_inline_records(client) -> None:
    a, b, jsonl = attribution_pair()
    ja = _job(client, a, "attributions", artifacts={"samples.jsonl": jsonl})
    jb = _job(client, b, "attributions")
    r = _compare(client, ja[:10], jb)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["renderer"] == "attributions" and got["a"]["id"] == ja and got["b"]["model"] == "nrms-b"
    cmp = got["attributions"]
    # a's six samples come from samples.jsonl (4 inline); s4 only in a, s7 only in b
    assert cmp["read"] == {"a": [6, 6], "b": [6, 6]}
    assert (cmp["matched"], cmp["only_a"], cmp["only_b"]) == (5, ["s4"], ["s7"])
    by_id = {s["id"]: s for s in cmp["samples"]}
    assert [s["id"] for s in cmp["samples"]] == ["s1", "s2", "s3", "s5", "s6"]
    s1 = by_id["s1"]
    assert s1["score_delta"] == pytest.approx(14.56) and s1["words_match"]
    assert s1["largest_change"]["word"] == "SHOCKING" and s1["largest_change"]["delta"] == pytest.approx(14.56)
    assert s1["words"][0]["rank_a"] == 1 and s1["words"][0]["rank_b"] == 1
    assert by_id["s2"]["score_delta"] == pytest.approx(1.0)
    # ranks by score among the matched samples: s1 first under both
    assert s1["rank_a"] == s1["rank_b"] == 1
    # the vocabulary has no minimum count: the word seen once that moved most comes first
    top = cmp["words"][0]
    assert (top["word"], top["count_a"], top["count_b"]) == ("shocking", 1, 1)
    assert top["delta"] == pytest.approx(14.56)
    assert cmp["words_total"] == len(cmp["words"])


def test_tracin_lists_show_overlap_rank_correlation_and_what_entered_and_left(client) -> None:
    a, b = tracin_pair()
    ja, jb = _job(client, a, "tracin"), _job(client, b, "tracin")
    got = _compare(client, ja, jb).json()
    cmp = got["influence"]
    assert (cmp["estimator_a"], cmp["estimator_b"], cmp["matched"], cmp["n_only_a"]) == ("tracin", "trak", 1, 1)
    assert cmp["only_a"] == [["china", "intergovorgs", "india"]]
    props, opps = cmp["tests"][0]["lists"]
    assert (props["role"], props["k"], props["overlap"], props["entered"], props["left"]) == (
        "proponents", 3, 2, 1, 1)
    changes = {tuple(t["train_triple"]): t for t in props["triples"]}
    assert changes[("uk", "embassy", "usa")]["change"] == "left"
    assert changes[("india", "embassy", "uk")]["change"] == "entered"
    assert changes[("usa", "embassy", "uk")]["rank_b"] == 2
    # the union [a1, a2, a3, b3]: a's ranks 1 2 3 4(missing), b's 2 1 4(missing) 3
    from scipy import stats

    assert props["spearman"] == pytest.approx(stats.spearmanr([1, 2, 3, 4], [2, 1, 4, 3]).statistic)
    assert props["kendall"] == pytest.approx(stats.kendalltau([1, 2, 3, 4], [2, 1, 4, 3]).statistic)
    assert opps["overlap_fraction"] == 1.0 and opps["spearman"] == pytest.approx(1.0)


def test_training_runs_give_both_histories_the_last_metrics_and_the_changed_fields(client) -> None:
    ja = _job(client, training_result([0.9, 0.5], [0.3, 0.5]), "train_conve", steps=1)
    jb = _job(client, training_result([0.8, 0.4, 0.3], [0.35, 0.6, 0.65]), "train_conve", steps=2)
    got = _compare(client, ja, jb).json()["training"]
    assert len(got["history_a"]) == 2 and len(got["history_b"]) == 3 and got["history_b"][2]["valid_mrr"] == 0.65
    metrics = {m["key"]: m for m in got["metrics"]}
    assert metrics["valid_mrr"]["delta"] == pytest.approx(0.15) and metrics["loss"]["a"] == 0.5
    assert {f["field"]: (f["a"], f["b"]) for f in got["changed_fields"]} == {"steps": (1, 2)}
    assert len(got["steps_b"]) == 3


def test_another_owners_job_is_404_like_an_unknown_one(client) -> None:
    a, b = tracin_pair()
    mine, theirs = _job(client, a, "tracin"), _job(client, b, "tracin", key=BOB)
    unknown = "0" * 32
    for other in (theirs, unknown):
        r = _compare(client, mine, other)
        assert r.status_code == 404 and r.json()["detail"]["loc"] == ["query", "b"], r.text
        assert r.json()["detail"]["message"] == f"b: no job {other!r}"
    assert _compare(client, theirs, mine, key=BOB).status_code == 404  # bob cannot see alice's either
    assert _compare(client, "../x", mine).status_code == 404


def test_jobs_that_have_not_both_succeeded_are_409(client) -> None:
    a, _ = tracin_pair()
    done, queued = _job(client, a, "tracin"), _job(client, None, "tracin")
    r = _compare(client, done, queued)
    assert r.status_code == 409 and r.json()["detail"]["code"] == "not_succeeded"
    assert r.json()["detail"]["loc"] == ["query", "b"] and r.json()["detail"]["status"] == "queued"


def test_kinds_that_differ_or_cannot_be_compared_are_422_naming_the_field(client) -> None:
    a, _ = tracin_pair()
    att, _, _ = attribution_pair()
    jt, ja = _job(client, a, "tracin"), _job(client, att, "attributions")
    r = _compare(client, jt, ja)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "b"]
    assert "only jobs of one kind" in r.json()["detail"][0]["msg"]
    plain = _job(client, {"steps": 1}, "test_sleep")
    r = _compare(client, plain, plain)
    assert r.status_code == 422 and "cannot be compared" in r.json()["detail"][0]["msg"]
    single = dict(a, mode="single")
    r = _compare(client, _job(client, single, "tracin"), _job(client, single, "tracin"))
    assert r.status_code == 422 and "mode 'single'" in r.json()["detail"][0]["msg"]
    r = client.get("/compare", params={"a": jt}, headers=bearer(ALICE))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "b"]
