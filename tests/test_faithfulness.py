"""Faithfulness of word attributions: the masks, the batched scoring against a one-by-one reference, the seeded
random ranking, the summary's paired test, the request's checks and the result section through the service."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch

from models.explain import faithfulness as F

# ------------------------------------------------------------------------------------- a small scored function
L, D = 9, 4


def _forward_factory(seed: int = 0):
    """A nonlinear score of ``(M, L, D)`` inputs whose context depends on the sample row (like a user vector)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(L, D, generator=g, dtype=torch.float64)
    ctx = torch.randn(3, D, generator=g, dtype=torch.float64)
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        calls.append((x.detach().clone(), rows.detach().clone()))
        h = torch.tanh(x.double() * w[None, : x.shape[1]]).sum(1)
        return ((h + h**2 * 0.3) * ctx[rows]).sum(-1)

    return forward, calls


def _inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, L, D, generator=g)
    base = torch.randn(3, L, D, generator=g) * 0.1
    base[:, 0] = x[:, 0]  # a structural token kept in the baseline
    return x, base


# sample 0: 5 words, word 1 has two pieces; sample 1: 7 words of one token; sample 2: one word
WORDS = [[[1], [2, 3], [4], [5], [6]], [[1], [2], [3], [4], [5], [6], [7]], [[1]]]


def _samples(attrs: list[list[float]], seed: int = 0) -> list[F.SampleWords]:
    return [F.SampleWords(w, {"ig": F.rank_words(a), "random": F.random_order(len(w), seed, f"s{i}")})
            for i, (w, a) in enumerate(zip(WORDS, attrs, strict=True))]


ATTRS = [[0.5, 2.0, 2.0, -1.0, 0.5], [0.1, 0.7, -0.3, 0.7, 0.0, 1.5, 0.2], [3.0]]


def test_ranking_breaks_ties_by_word_order() -> None:
    assert F.rank_words([0.5, 2.0, 2.0, -1.0, 0.5]).tolist() == [1, 2, 0, 4, 3]
    assert F.rank_words([0.0, 0.0, 0.0]).tolist() == [0, 1, 2]
    # many ties (a sort that is not stable reorders equal keys of longer arrays)
    attrs = np.random.default_rng(0).integers(0, 3, 40).astype(float)
    order = F.rank_words(attrs).tolist()
    assert order == sorted(range(40), key=lambda i: (-attrs[i], i))
    assert F.FRACTIONS == (0.01, 0.05, 0.1, 0.2, 0.5)  # ERASER's bins
    assert [F.top_k(10, q) for q in F.FRACTIONS] == [1, 1, 1, 2, 5]
    assert [F.top_k(7, q) for q in F.FRACTIONS] == [1, 1, 1, 2, 4]
    assert [F.top_k(1, q) for q in F.FRACTIONS] == [1, 1, 1, 1, 1]
    assert [F.top_k(200, q) for q in F.FRACTIONS] == [2, 10, 20, 40, 100]


def test_holm_adjustment_and_the_rank_biserial_effect() -> None:
    # Holm by hand: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1, made monotone
    assert F.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert F.holm([0.5, None, 0.9]) == [pytest.approx(1.0), None, pytest.approx(1.0)]
    # ranks of |d| = 1, 2, 3: W+ = 1 + 3, W- = 2, r = (4 - 2) / 6
    assert F.rank_biserial(np.array([1.0, -2.0, 3.0, 0.0])) == pytest.approx(1 / 3)
    assert F.rank_biserial(np.array([1.0, 2.0])) == 1.0 and F.rank_biserial(np.zeros(3)) is None
    d = np.random.default_rng(1).normal(0.3, 1.0, 60)
    lo, hi = F.effect_interval(d)
    assert lo <= F.rank_biserial(d) <= hi and F.effect_interval(d) == [lo, hi]  # seeded


def test_masks_replace_exactly_the_ranked_words() -> None:
    order = F.rank_words(ATTRS[0])  # words 1, 2, 0, 4, 3
    points = F.curve_points(5)
    deletion, insertion = F.variant_masks(order, WORDS[0], L, points)
    positions = [set(w) for w in WORDS[0]]
    for p, j in enumerate(points):
        first = set().union(*[positions[int(w)] for w in order[:j]]) if j else set()
        every = set().union(*positions)
        for pos in range(L):
            assert deletion[p, pos] == (pos in first), (j, pos)
            assert insertion[p, pos] == (pos in every - first), (j, pos)
    # the two-piece word goes as one: after one removal both of its positions are masked, nothing else
    assert deletion[1].nonzero()[0].tolist() == [2, 3]
    assert insertion[1].nonzero()[0].tolist() == [1, 4, 5, 6]
    # position 0 (structural) and 7, 8 (padding) are in no word: never masked
    assert not deletion[:, [0, 7, 8]].any() and not insertion[:, [0, 7, 8]].any()


def test_scored_inputs_are_the_masked_inputs_element_wise() -> None:
    forward, calls = _forward_factory()
    x, base = _inputs()
    masks = torch.zeros(4, L, dtype=torch.bool)
    masks[1, [2, 3]] = True
    masks[2, [1, 4, 5]] = True
    masks[3, 1:7] = True
    rows = torch.tensor([0, 0, 1, 2])
    F.score_variants(forward, x, base, rows, masks, max_rows=3)
    seen = torch.cat([c[0] for c in calls])
    assert [c[0].shape[0] for c in calls] == [3, 1]  # at most max_rows per forward
    assert torch.equal(torch.cat([c[1] for c in calls]), rows)
    for v in range(4):
        i = int(rows[v])
        for pos in range(L):
            want = base[i, pos] if masks[v, pos] else x[i, pos]
            assert torch.equal(seen[v, pos], want), (v, pos)


def _slow(forward, x, base, words):
    """Straight from the definitions: ``score(i, masked word indices)`` builds that variant alone and scores it."""
    def score(i: int, masked: set[int]) -> float:
        v = x[i].clone()
        for w in masked:
            for pos in words[w]:
                v[pos] = base[i, pos]
        return float(forward(v[None], torch.tensor([i]))[0])

    return score


def test_batched_metrics_equal_a_one_by_one_reference() -> None:
    forward, calls = _forward_factory()
    x, base = _inputs()
    samples = _samples(ATTRS)
    fast = F.evaluate(forward, x, base, samples, max_rows=5)
    n_rows = sum(c[0].shape[0] for c in calls)
    ref = F.evaluate(forward, x, base, samples, reference=True)
    n_variants = sum(2 * len(r["points"]) * 2 for r in ref)
    assert n_rows < n_variants  # identical variants (x, x' of every order) scored once
    for i, (a, b) in enumerate(zip(fast, ref, strict=True)):
        score = _slow(forward, x, base, WORDS[i])
        n = len(WORDS[i])
        assert a["points"] == b["points"] == list(range(n + 1))
        for name, order in samples[i].orders.items():
            fa, fb = a["orders"][name], b["orders"][name]
            for key in ("comprehensiveness", "sufficiency", "deletion", "insertion", "deletion_auc", "insertion_auc"):
                np.testing.assert_allclose(fa[key], fb[key], rtol=1e-6, atol=1e-6)
            full = score(i, set())
            every = set(range(n))
            dele = [score(i, {int(w) for w in order[:j]}) for j in range(n + 1)]
            ins = [score(i, every - {int(w) for w in order[:j]}) for j in range(n + 1)]
            np.testing.assert_allclose(fa["deletion"], dele, rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(fa["insertion"], ins, rtol=1e-6, atol=1e-6)
            ks = [max(1, math.ceil(q * n - 1e-9)) for q in F.FRACTIONS]
            np.testing.assert_allclose(fa["comprehensiveness"], [full - dele[k] for k in ks], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(fa["sufficiency"], [full - ins[k] for k in ks], rtol=1e-6, atol=1e-6)
            grid = np.arange(n + 1) / n
            area = sum((grid[j + 1] - grid[j]) * (dele[j] + dele[j + 1]) / 2 for j in range(n))
            assert fa["deletion_auc"] == pytest.approx(area, rel=1e-6, abs=1e-9)


def test_long_inputs_have_bounded_curves() -> None:
    n = 300
    points = F.curve_points(n)
    assert len(points) <= F.MAX_CURVE_POINTS + 1 + len(F.FRACTIONS)
    assert points[0] == 0 and points[-1] == n
    assert {F.top_k(n, q) for q in F.FRACTIONS} <= set(points)
    assert points == sorted(set(points))


def test_random_order_is_seeded_and_reproducible() -> None:
    a = F.random_order(12, 7, "sample-a")
    assert sorted(a.tolist()) == list(range(12))
    assert np.array_equal(a, F.random_order(12, 7, "sample-a"))
    assert not np.array_equal(a, F.random_order(12, 8, "sample-a"))
    assert not np.array_equal(a, F.random_order(12, 7, "sample-b"))
    # independent of what was drawn before (a sample's order does not depend on its place in a run)
    F.random_order(5, 7, "other")
    assert np.array_equal(a, F.random_order(12, 7, "sample-a"))


def test_an_order_that_is_not_a_permutation_is_refused() -> None:
    forward, _ = _forward_factory()
    x, base = _inputs()
    bad = [F.SampleWords(WORDS[0], {"ig": np.array([0, 0, 1, 2, 3])})]
    with pytest.raises(ValueError, match="not a permutation"):
        F.evaluate(forward, x[:1], base[:1], bad)


def test_summary_means_and_wilcoxon() -> None:
    from scipy.stats import wilcoxon

    forward, _ = _forward_factory()
    x, base = _inputs()
    recs = F.evaluate(forward, x, base, _samples(ATTRS))
    out = F.summarize(recs)
    assert out["n_samples"] == 3
    ig = out["orders"]["ig"]
    np.testing.assert_allclose(ig["comprehensiveness"],
                               np.mean([r["orders"]["ig"]["comprehensiveness"] for r in recs], 0))
    assert ig["deletion_auc"] == pytest.approx(np.mean([r["orders"]["ig"]["deletion_auc"] for r in recs]))
    assert len(out["curves"]["fraction"]) == F.CURVE_GRID
    # the mean curve starts at the mean full score and ends at the mean baseline score
    assert out["curves"]["ig"]["deletion"][0] == pytest.approx(np.mean([r["orders"]["ig"]["deletion"][0] for r in recs]))
    assert out["curves"]["ig"]["insertion"][-1] == pytest.approx(
        np.mean([r["orders"]["ig"]["insertion"][-1] for r in recs]))
    test = next(t for t in out["tests"] if t["metric"] == "comprehensiveness" and t["against"] == "random")
    d = [np.mean(r["orders"]["ig"]["comprehensiveness"]) - np.mean(r["orders"]["random"]["comprehensiveness"])
         for r in recs]
    nz = [v for v in d if v != 0]
    if nz:
        want = wilcoxon(d, zero_method="wilcox", alternative="greater")
        assert test["statistic"] == pytest.approx(want.statistic) and test["p_value"] == pytest.approx(want.pvalue)
    assert F.paired_test([1.0, 2.0], [1.0, 2.0], "greater")["p_value"] is None  # no difference: no test
    # differences at fp32 rounding are ties, not evidence
    rounding = F.paired_test([1.0, 2.0, 3.0], [1.0 + 1e-9, 2.0 - 1e-8, 3.5], "greater")
    assert rounding["n_nonzero"] == 1 and rounding["n"] == 3
    assert rounding["p_value"] == pytest.approx(wilcoxon([-0.5], alternative="greater").pvalue)


# ------------------------------------------------------------------------------------ on a news recommender
@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """An untrained NRMS with word embeddings on a small synthetic set (seconds to build; faithfulness needs a
    model, not a good one)."""
    from models.news import checkpoint
    from models.news.demo import DEMOS, build, make_datasets

    root = tmp_path_factory.getbasetemp() / "faith-tiny"
    if not (root / "model" / "config.json").exists():
        make_datasets(root / "data", n_news=60, n_users=20)
        torch.manual_seed(0)
        spec = {s.name: s for s in DEMOS}["nrms-word-demo"]
        checkpoint.save(build(spec, root / "data"), root / "model", meta={})
    return {"root": root, "model": checkpoint.load(root / "model").model}


def test_news_report_section_matches_its_reference(tiny) -> None:
    import copy

    from models.news.attribution import IGOptions, _prepare, explain
    from models.news.data import load_samples
    from models.news.faithfulness import faithfulness_section

    model = tiny["model"]
    samples = load_samples(tiny["root"] / "data" / "news-synthetic", "test", 2, seed=0)
    seen: list[tuple[int, int, str]] = []
    fast = explain(model, samples, IGOptions(n_steps=4, precision="fp32", faithfulness=True),
                   lambda d, t, m: seen.append((d, t, m)))
    assert seen[-1] == (2, 2, "faithfulness: 2/2 samples")  # the bar stays full, the message says what runs
    records = copy.deepcopy(fast["samples"])
    with torch.no_grad():
        prepared = _prepare(model, samples, 50, [])
    faithfulness_section(model, prepared, records, "pad", 0, 1.0, reference=True)
    for a, b in zip(fast["samples"], records, strict=True):
        fa, fb = a["faithfulness"], b["faithfulness"]
        assert fa["n_words"] == len(a["words"]) and fa["points"] == fb["points"]
        for name in F.ORDERS:
            for key in ("deletion", "insertion", "comprehensiveness", "sufficiency"):
                np.testing.assert_allclose(fa["orders"][name][key], fb["orders"][name][key], rtol=1e-4, atol=1e-5)
            # nothing removed is the scored input, everything removed the baseline IG integrated from
            assert fa["orders"][name]["deletion"][0] == pytest.approx(a["score"], rel=1e-4, abs=1e-5)
            assert fa["orders"][name]["deletion"][-1] == pytest.approx(a["baseline_score"], rel=1e-4, abs=1e-5)
            assert fa["orders"][name]["insertion"][0] == pytest.approx(a["baseline_score"], rel=1e-4, abs=1e-5)
        # the IG ranking is the report's own word attributions, ties by word order
        ig = fa["orders"]["ig"]
        k = fa["k"][0]
        order = F.rank_words(a["word_attributions"])
        assert fa["k"] == [F.top_k(fa["n_words"], q) for q in F.FRACTIONS]
        assert ig["comprehensiveness"][0] == pytest.approx(ig["deletion"][0] - ig["deletion"][k])
        # occlusion's ranking is the token drops of models.explain.occlusion summed per word
        assert len(order) == fa["n_words"]
    section = fast["faithfulness"]
    assert set(section["orders"]) == set(F.ORDERS) and section["n_samples"] == len(fast["samples"])
    assert section["seconds"] > 0 and section["time_ratio"] == pytest.approx(
        section["seconds"] / fast["summary"]["seconds"])


def test_occlusion_order_is_the_occlusion_reports(tiny) -> None:
    from models.news.attribution import IGOptions, explain
    from models.news.data import load_samples

    samples = load_samples(tiny["root"] / "data" / "news-synthetic", "test", 2, seed=1)
    ig = explain(tiny["model"], samples, IGOptions(n_steps=4, precision="fp32", faithfulness=True))
    occ = explain(tiny["model"], samples, IGOptions(method="occlusion", precision="fp32"))
    for a, b in zip(ig["samples"], occ["samples"], strict=True):
        assert a["words"] == b["words"]
        drops = b["word_attributions"]
        top = int(F.rank_words(drops)[0])
        curve = a["faithfulness"]["orders"]["occlusion"]["deletion"]
        # the word model's words are single tokens: removing occlusion's top word loses exactly its drop
        assert a["score"] - curve[1] == pytest.approx(drops[top], rel=1e-4, abs=1e-5)
        assert a["score"] - curve[1] == pytest.approx(max(drops), rel=1e-4, abs=1e-5)


def test_words_and_attributions_that_disagree_are_refused(tiny) -> None:
    from models.news.attribution import IGOptions, _prepare, explain
    from models.news.data import load_samples
    from models.news.faithfulness import faithfulness_section

    samples = load_samples(tiny["root"] / "data" / "news-synthetic", "test", 1, seed=2)
    rec = explain(tiny["model"], samples, IGOptions(n_steps=2, precision="fp32"))["samples"][0]
    with torch.no_grad():
        prepared = _prepare(tiny["model"], samples, 50, [])
    bad = {**rec, "word_attributions": rec["word_attributions"] + [0.0]}
    with pytest.raises(ValueError, match="attributions"):
        faithfulness_section(tiny["model"], prepared, [bad], "pad", 0, 1.0)


def test_occlusion_as_the_method_is_refused(tiny) -> None:
    from models.news.attribution import IGOptions

    with pytest.raises(ValueError, match="faithfulness"):
        IGOptions(method="occlusion", faithfulness=True).check()


# ------------------------------------------------------------------------------------------- the request
@pytest.fixture(scope="module")
def api(tmp_path_factory, tiny):
    from core import registry
    from tests.service import api_client

    home = tmp_path_factory.mktemp("faith-api")
    with api_client(home) as client:
        registry.register_model(client.app.state.settings, "tiny", kind="news", loader="models.news.checkpoint:load",
                                path=tiny["root"] / "model", parameters=1)
        yield client


SAMPLE = {"id": "a", "history": ["Lakers beat Celtics in overtime"], "candidate": "Dodgers sign star"}


@pytest.mark.parametrize("extra, loc", [
    ({"faithfulness": True, "method": "occlusion"}, ["body", "faithfulness"]),
    ({"faithfulness": "yes"}, ["body", "faithfulness"]),
    ({"faithfulness": True, "faithfulness_seed": -1}, ["body", "faithfulness_seed"]),
    ({"faithfulness": True, "faithfulness_seed": 2**31}, ["body", "faithfulness_seed"]),
])
def test_request_checks_name_the_field(api, extra, loc) -> None:
    r = api.post("/attributions", json={"model": "tiny", "samples": [SAMPLE], **extra})
    assert r.status_code == 422, r.text
    assert loc in [d["loc"] for d in r.json()["detail"]], r.json()


# ------------------------------------------------------------------------------------------- the service
@pytest.fixture(scope="module")
def svc(tmp_path_factory, tiny):
    from core import registry
    from tests.service import Service

    home = tmp_path_factory.mktemp("faith-home")
    service = Service(home, heartbeat_ttl_s=30, start=False)
    shutil.copytree(tiny["root"] / "model", home / "models" / "tiny")
    registry.register_model(service.settings, "tiny", kind="news", loader="models.news.checkpoint:load",
                            path=home / "models" / "tiny", parameters=1)
    shutil.copytree(tiny["root"] / "data" / "news-synthetic", home / "data" / "tiny-news")
    registry.register_dataset(service.settings, "tiny-news", kind="news", path=home / "data" / "tiny-news")
    with service.start():
        yield service


def _run(svc, body: dict) -> dict:
    r = svc.client.post("/attributions", json=body)
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=180)
    assert job["status"] == "succeeded", job
    return svc.client.get(f"/jobs/{job['id']}/result").json()


def test_result_section_through_the_service(svc) -> None:
    body = {"model": "tiny", "n_steps": 8, "precision": "fp32", "faithfulness": True, "faithfulness_seed": 3,
            "samples": [SAMPLE, {**SAMPLE, "id": "b", "candidate": "Senate passes the budget bill tonight"}]}
    result = _run(svc, body)
    section = result["faithfulness"]
    assert section["seed"] == 3 and section["n_samples"] == 2
    assert set(section["orders"]) == {"ig", "random", "occlusion"}
    assert [t["against"] for t in section["tests"]].count("random") == len(F.TESTED)
    for s in result["samples"]:
        assert s["faithfulness"]["n_words"] == len(s["words"])
    off = _run(svc, {**body, "faithfulness": False})
    assert off["faithfulness"] is None and off["samples"][0]["faithfulness"] is None


@pytest.mark.slow
def test_sharded_run_merges_the_section(svc) -> None:
    body = {"model": "tiny", "n_steps": 4, "precision": "fp32", "faithfulness": True, "shard_size": 2,
            "dataset": {"name": "tiny-news", "split": "test", "n_samples": 4, "seed": 0}}
    result = _run(svc, body)
    section = result["faithfulness"]
    assert section["n_samples"] == result["n_samples"] == 4
    assert set(section["orders"]) == {"ig", "random", "occlusion"}
    assert section["seconds"] > 0


# ------------------------------------------------------------------------------------------------- the SDK
def test_sdk_result_exposes_the_table_and_renders_the_curves() -> None:
    from explainq_client.results import make_result

    forward, _ = _forward_factory()
    x, base = _inputs()
    recs = F.evaluate(forward, x, base, [F.SampleWords(w, {**s.orders, "occlusion": s.orders["ig"][::-1]})
                                         for w, s in zip(WORDS, _samples(ATTRS), strict=True)])
    section = {**F.summarize(recs), "seconds": 0.5, "time_ratio": 0.25}
    sample = {"id": "<s>", "words": ["a"], "word_attributions": [1.0], "score": 1.0, "baseline_score": 0.0}
    result = make_result("attributions", {"model": "m", "samples": [sample], "faithfulness": section})
    table = result.faithfulness
    assert [r["ranking"] for r in table] == ["ig", "random", "occlusion"]
    bins = ["1%", "5%", "10%", "20%", "50%"]
    assert table.columns == ["ranking", *(f"comprehensiveness@{b}" for b in bins),
                             *(f"sufficiency@{b}" for b in bins), "deletion_auc", "insertion_auc"]
    ig = section["orders"]["ig"]
    assert table[0]["comprehensiveness@20%"] == ig["comprehensiveness"][3]
    assert "p (Holm)" in result._repr_html_() and "p Holm" in result.text()
    assert all(t["p_holm"] is None or t["p_holm"] >= t["p_value"] for t in section["tests"])
    assert table[0]["deletion_auc"] == ig["deletion_auc"]
    assert table.curves["ig"]["deletion"] == section["curves"]["ig"]["deletion"]
    html = result._repr_html_()
    assert html.count("<svg") == 2 and "deletion curve" in html and "insertion curve" in html
    assert "fraction of words" in html and "&lt;s&gt;" in html and "<s>" not in html
    for label in ("IG", "random order", "occlusion"):
        assert f"{label}</title></polyline>" in html
    text = result.text()
    assert "faithfulness over 3 samples" in text and "comprehensiveness@10%" in text
    plain = make_result("attributions", {"model": "m", "samples": [sample]})
    assert plain.faithfulness is None and "faithfulness" not in plain._repr_html_()
    pd = pytest.importorskip("pandas")
    frame = table.to_pandas()
    assert isinstance(frame, pd.DataFrame) and list(frame.index) == ["ig", "random", "occlusion"]
    assert frame.loc["random", "insertion_auc"] == section["orders"]["random"]["insertion_auc"]


# ------------------------------------------------------------------------------------------- the dashboard
def test_dashboard_partial_carries_the_curves_and_the_table() -> None:
    import html
    import json
    import re

    from app.ui.router import templates
    from app.ui.views import num

    forward, _ = _forward_factory()
    x, base = _inputs()
    recs = F.evaluate(forward, x, base, [F.SampleWords(w, {**s.orders, "occlusion": s.orders["ig"][::-1]})
                                         for w, s in zip(WORDS, _samples(ATTRS), strict=True)])
    section = {**F.summarize(recs), "view": "title", "seed": 0, "baseline": "pad", "seconds": 0.5,
               "attribution_seconds": 2.0, "time_ratio": 0.25}
    page = templates.get_template("_faithfulness.html").render(result={"faithfulness": section})
    charts = re.findall(r'data-curve="(\w+)" data-points="0" data-faith="([^"]+)"', page)
    assert [c for c, _ in charts] == ["deletion", "insertion"]
    for curve, data in charts:
        spec = json.loads(html.unescape(data))
        assert spec["x"] == section["curves"]["fraction"]
        assert spec["series"] == [[label, section["curves"][o][curve]] for o, label in
                                  (("ig", "IG"), ("random", "random order"), ("occlusion", "occlusion"))]
    row = re.search(r'<tr data-order="random"><th scope="row">random order</th>(.*?)</tr>', page).group(1)
    r = section["orders"]["random"]
    want = [*r["comprehensiveness"], *r["sufficiency"], r["deletion_auc"], r["insertion_auc"]]
    assert re.findall(r"<td>(.*?)</td>", row) == [html.escape(num(v, 3)) for v in want]
    assert page.count("<tr><th scope=\"row\">") == len(section["tests"])
    assert templates.get_template("_faithfulness.html").render(result={}).strip() == ""
    # per sample: the mean comprehensiveness over the fractions and the deletion area of each ranking
    samples = [{"id": f"<s{i}>", "faithfulness": r} for i, r in enumerate(recs)]
    page = templates.get_template("_faithfulness.html").render(result={"faithfulness": section, "samples": samples})
    for i, r in enumerate(recs):
        row = re.search(rf'<tr data-sample-id="&lt;s{i}&gt;"><th scope="row" class="mono">&lt;s{i}&gt;</th>(.*?)</tr>',
                        page).group(1)
        cells = re.findall(r"<td>(.*?)</td>", row)
        want = [r["n_words"], *(np.mean(r["orders"][o]["comprehensiveness"]) for o in F.ORDERS),
                *(r["orders"][o]["deletion_auc"] for o in F.ORDERS)]
        assert cells == [html.escape(num(v, 3)) for v in want]


# ------------------------------------------------------------------------------------------- the benchmark
def test_benchmark_run_returns_its_tables(tiny, tmp_path) -> None:
    import argparse
    import importlib.util

    from tests.service import ROOT

    spec = importlib.util.spec_from_file_location("faith_bench", ROOT / "benchmarks" / "faithfulness.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    small = tmp_path / "small"  # laid out as build_small leaves it, so nothing is trained
    shutil.copytree(tiny["root"] / "model", small / "models" / "nrms-word-demo")
    shutil.copytree(tiny["root"] / "data", small / "data")
    args = argparse.Namespace(home=str(tmp_path / "no-home"), small=str(small), models="nrms-word-demo",
                              samples=2, n_steps=2, rounds=1)
    threads = torch.get_num_threads()
    try:
        out = bench.run(args)
    finally:
        torch.set_num_threads(threads)  # run() sets the benchmark's thread count
    assert "### nrms-word-demo: 2 samples, IG gausslegendre 2 steps" in out
    for row in ("| ig ", "| random ", "| occlusion ", "IG vs random", "IG vs occlusion"):
        assert row in out, row
    assert "median time ratio faithfulness / attribution: wall" in out
