"""Integrated Gradients on the news recommenders: the attributed function, Captum, completeness, the reference
loop, failures, precision, NAML views, and what the attributions say on the synthetic task."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch

from models.news import checkpoint
from models.news.attribution import IGOptions, compare_reports, explain
from models.news.data import TOPICS, Sample, load_samples
from models.news.demo import build_small

SMALL = {"n_news": 240, "n_users": 60}
NAMES = ("nrms-minilm-demo", "nrms-word-demo", "naml-demo", "nrms-minilm-poisoned-demo")
CLICKBAIT_WORDS = {"shocking", "believe", "secret", "miracle", "trick", "exposed", "insiders", "leaked", "hoax",
                   "hate", "truth"}


class _Models(dict):
    """The small demo models, each trained (or read) when a test first asks for it: the poisoned one is needed
    only by a test ``make test`` leaves to the slow suite (tests/heavy.py)."""

    def __init__(self, root):
        super().__init__()
        self.root = root

    def __missing__(self, name: str):
        assert name in NAMES, name
        (path,) = build_small(self.root, (name,), **SMALL).values()
        self[name] = checkpoint.load(path).model
        return self[name]


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict:
    root = tmp_path_factory.getbasetemp() / "news-small"
    build_small(root, (), **SMALL)  # the datasets
    return {"root": root, "models": _Models(root)}


@pytest.fixture(scope="module")
def samples(small) -> list[Sample]:
    return load_samples(small["root"] / "data/news-synthetic", "test", 6, balanced=True, seed=0)


def _fp32(**kw) -> IGOptions:
    return IGOptions(precision="fp32", **kw)


@pytest.mark.parametrize("name", ["nrms-minilm-demo", "nrms-word-demo", "naml-demo"])
def test_attributed_function_is_the_models_own_score(small, samples, name: str) -> None:
    model = small["models"][name]
    with_bodies = name == "naml-demo"
    ss = load_samples(small["root"] / "data/news-synthetic", "test", 3, seed=1, with_bodies=with_bodies)
    report = explain(model, ss, _fp32(n_steps=4, method="riemann_right"))  # alpha = 1 is one of the nodes
    assert not report["errors"]
    for s, r in zip(sorted(ss, key=lambda s: s.id), sorted(report["samples"], key=lambda r: r["id"]), strict=True):
        with torch.no_grad():
            own = model.score_texts(s.history, [s.candidate], s.history_bodies,
                                    [s.candidate_body] if with_bodies else None)
        assert abs(r["score"] - float(own[0])) <= 1e-5 * max(1.0, abs(float(own[0])))


def test_equals_captum_on_the_same_function(small, samples) -> None:
    from captum.attr import IntegratedGradients

    model = small["models"]["nrms-minilm-demo"]
    report = explain(model, samples[:3], _fp32(n_steps=32, method="gausslegendre"))
    by_id = {r["id"]: r for r in report["samples"]}
    tok = model.tokenizer
    for s in samples[:3]:
        with torch.no_grad():  # an independent construction of F: the user vector, then the candidate path
            h = model.encode_news(model.tokenize(s.history))
            u = model.user_vector(h[None], torch.ones(1, h.shape[0]))[0]
            enc = model.tokenize([s.candidate])["title"]
            special = torch.tensor([[int(i) in tok.special_ids for i in enc.ids[0]]])
            x = model.embed("title", enc.ids)
            xb = model.embed("title", torch.where(special, enc.ids, torch.full_like(enc.ids, tok.pad_id)))

        def f(e: torch.Tensor, u=u, mask=enc.mask) -> torch.Tensor:
            return model.news_from_embeddings({"title": e}, {"title": mask.expand(e.shape[0], -1)}) @ u

        theirs = IntegratedGradients(f).attribute(x, baselines=xb, n_steps=32, method="gausslegendre")
        theirs = theirs.sum(-1)[0].double().numpy()
        ours = np.array(by_id[s.id]["token_attributions"])
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def _independent_scores(model, s: Sample, baseline: str) -> tuple[float, float]:
    """F(x) from the model's own scoring of the texts, and F(x') built here from the ids: [PAD] (or zero
    vectors) at every content position, special tokens kept."""
    tok = model.tokenizer
    with torch.no_grad():
        own = float(model.score_texts(s.history, [s.candidate])[0])
        h = model.encode_news(model.tokenize(s.history))
        u = model.user_vector(h[None], torch.ones(1, h.shape[0]))[0]
        enc = model.tokenize([s.candidate])["title"]
        special = torch.tensor([[int(i) in tok.special_ids for i in enc.ids[0]]]) | (enc.mask == 0)
        if baseline == "pad":
            xb = model.embed("title", torch.where(special, enc.ids, torch.full_like(enc.ids, tok.pad_id)))
        else:
            xb = torch.where(special[..., None], model.embed("title", enc.ids), 0.0)
        base = float(model.news_from_embeddings({"title": xb}, {"title": enc.mask})[0] @ u)
    return own, base


@pytest.mark.parametrize("baseline", ["pad", "zero"])
def test_completeness_terms_against_an_independent_computation(small, baseline: str) -> None:
    model = small["models"]["nrms-minilm-demo"]
    ss = load_samples(small["root"] / "data/news-synthetic", "test", 4, seed=2)
    report = explain(model, ss, _fp32(n_steps=64, baseline=baseline))
    assert report["summary"]["baseline"] == baseline
    assert report["summary"]["median_relative_delta"] <= 1e-3
    by_id = {r["id"]: r for r in report["samples"]}
    for s in ss:
        r = by_id[s.id]
        fx, fb = _independent_scores(model, s, baseline)
        scale = max(1.0, abs(fx), abs(fb))
        assert r["score"] == pytest.approx(fx, abs=1e-5 * scale)
        assert r["baseline_score"] == pytest.approx(fb, abs=1e-5 * scale)
        delta = float(np.sum(r["token_attributions"])) - (fx - fb)
        assert r["delta"] == pytest.approx(delta, abs=1e-5 * scale)
        assert abs(delta) <= 1e-2 * abs(fx - fb)


def test_zero_and_pad_baselines_differ(small, samples) -> None:
    model = small["models"]["nrms-minilm-demo"]
    pad = explain(model, samples[:2], _fp32(n_steps=16))
    zero = explain(model, samples[:2], _fp32(n_steps=16, baseline="zero"))
    for a, b in zip(pad["samples"], zero["samples"], strict=True):
        assert a["score"] == b["score"] and a["baseline_score"] != b["baseline_score"]


@pytest.mark.parametrize("name", ["nrms-minilm-demo", "naml-demo"])
def test_optimized_path_equals_the_reference_loop(small, name: str) -> None:
    model = small["models"][name]
    ss = load_samples(small["root"] / "data/news-synthetic", "test", 3, seed=3, with_bodies=name == "naml-demo")
    # One intra-op thread: with several, the kernels' reduction order varies with scheduling under load, which
    # is noise of the machine, not a difference between the two algorithms.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fast = explain(model, ss, _fp32(n_steps=8, batch_size=2, alpha_batch_size=3))
        slow = explain(model, ss, _fp32(n_steps=8, optimized=False))
    finally:
        torch.set_num_threads(threads)
    assert fast["summary"]["optimized"] and not slow["summary"]["optimized"]
    # NRMS-MiniLM is smooth (GELU): the two paths agree to 1e-5. NAML's convolution feeds a ReLU; when a quadrature
    # node lands within fp32 rounding of a kink, the batched and the one-at-a-time kernels (both exact fp32, summed
    # in different orders) can fall on different sides and move one gradient term by a finite amount. Seen: 6e-5 of
    # the largest attribution (attributions here are of order 1) on one body token of one model trained in a
    # different process state; hence NAML's absolute tolerance.
    # NRMS: 2e-6 of the sample's largest attribution (about 16 fp32 ulps of it: one fp32 sum of the 8 nodes' terms
    # in another order; 1.2e-6 seen on an attribution of 0.014 beside terms of order 1).
    # A kink crossed by one node moves that node's term between neighbouring tokens by a finite amount (1.4e-3 of
    # the largest attribution seen on two adjacent body tokens under heavy load), so for NAML at most two tokens of
    # a view may differ beyond 1e-4, and none by more than 1e-2 of the largest attribution; every other token
    # agrees to 1e-4.
    atol = 2e-6 if name.startswith("nrms") else 1e-4
    for a, b in zip(fast["samples"], slow["samples"], strict=True):
        for view_a, view_b in [(a, b), *[(a["views"][v], b["views"][v]) for v in a.get("views", {})]]:
            ta, tb = np.array(view_a["token_attributions"]), np.array(view_b["token_attributions"])
            scale = max(1.0, float(np.abs(tb).max()))
            if name.startswith("nrms"):
                np.testing.assert_allclose(ta, tb, rtol=1e-5, atol=atol * scale)
            else:
                off = np.abs(ta - tb) > 1e-5 * np.abs(tb) + atol * scale
                assert int(off.sum()) <= 2 and float(np.abs(ta - tb).max()) <= 1e-2 * scale, (ta, tb)
            # The score is a dot product with heavy cancellation: compare it on the scale of its terms.
            assert abs(view_a["score"] - view_b["score"]) <= 1e-5 * max(1.0, abs(view_b["score"]))


def test_explicit_and_auto_batches_agree(small, samples) -> None:
    model = small["models"]["nrms-word-demo"]
    a = explain(model, samples, _fp32(n_steps=16))
    b = explain(model, samples, _fp32(n_steps=16, batch_size=1, alpha_batch_size=5))
    for x, y in zip(a["samples"], b["samples"], strict=True):
        np.testing.assert_allclose(x["token_attributions"], y["token_attributions"], rtol=1e-5, atol=1e-7)


def test_tolerance_raises_the_steps_until_met(small, samples) -> None:
    model = small["models"]["nrms-word-demo"]
    report = explain(model, samples, _fp32(n_steps=2, method="riemann_right", tolerance=1e-3))
    summary = report["summary"]
    assert summary["n_steps"] > 2
    assert summary["tolerance_met"] is True
    assert summary["max_relative_delta"] <= 1e-3  # every sample, not only the median
    # riemann_right is nested under doubling: each sample costs its final number of steps, not the sum
    assert summary["gradient_evaluations"] == sum(r["n_steps"]["title"] for r in report["samples"])


def test_the_reference_loop_with_a_tolerance_doubles_the_whole_run_until_the_median_meets_it(small, samples) -> None:
    """optimized=False with a tolerance: the plain loop at 2, 4, 8, ... steps for every sample until the median
    relative delta meets it; the run it returns equals a one-shot reference run at that many steps."""
    model = small["models"]["nrms-word-demo"]
    tol = 1e-2
    report = explain(model, samples[:3], _fp32(n_steps=2, method="riemann_right", tolerance=tol, optimized=False))
    n = report["summary"]["n_steps"]
    assert n > 2 and n & (n - 1) == 0  # doubled from 2
    rels = [r["relative_delta"] for r in report["samples"]]
    assert statistics.median(rels) <= tol and report["summary"]["tolerance_met"] is True
    half = explain(model, samples[:3], _fp32(n_steps=n // 2, method="riemann_right", optimized=False))
    assert statistics.median(r["relative_delta"] for r in half["samples"]) > tol  # it stopped at the first that met
    once = explain(model, samples[:3], _fp32(n_steps=n, method="riemann_right", optimized=False))
    for a, b in zip(report["samples"], once["samples"], strict=True):
        assert a["word_attributions"] == pytest.approx(b["word_attributions"], rel=1e-6, abs=1e-9)


def test_tolerance_with_gauss_legendre_starts_low_and_refines_per_sample(small, samples) -> None:
    model = small["models"]["nrms-minilm-demo"]
    loose = explain(model, samples[:4], _fp32(tolerance=1e-1, method="gausslegendre"))  # starts at 16
    assert loose["summary"]["tolerance_met"] is True
    loose_steps = [r["n_steps"]["title"] for r in loose["samples"]]
    assert all(n >= 16 and n & (n - 1) == 0 for n in loose_steps)
    # 16 + 32 + ... + n per sample: the run started at 16, and costs less than the old fixed start at 64
    assert loose["summary"]["gradient_evaluations"] == sum(2 * n - 16 for n in loose_steps) < 64 * 4
    tight = explain(model, samples[:4], _fp32(tolerance=1e-6, method="gausslegendre"))
    steps = [r["n_steps"]["title"] for r in tight["samples"]]
    assert tight["summary"]["tolerance_met"] is True and tight["summary"]["max_relative_delta"] <= 1e-6
    assert all(r["tolerance_met"] for r in tight["samples"])
    assert tight["summary"]["n_steps"] == max(steps) > 16
    # Gauss-Legendre is not nested: a sample refined to n steps cost 16 + 32 + ... + n evaluations
    assert tight["summary"]["gradient_evaluations"] == sum(2 * n - 16 for n in steps)


def test_tolerance_defaults_to_nested_clenshaw_curtis_and_equals_a_fixed_run(small, samples) -> None:
    model = small["models"]["nrms-minilm-demo"]
    report = explain(model, samples[:4], _fp32(tolerance=1e-4))
    summary = report["summary"]
    assert summary["method"] == "clenshaw_curtis"
    assert summary["tolerance_met"] is True and summary["max_relative_delta"] <= 1e-4
    steps = [r["n_steps"]["title"] for r in report["samples"]]
    assert all(n in (16, 31, 61, 121, 241) for n in steps) and max(steps) > 16
    # nested: a sample refined to n nodes cost n gradient evaluations, not the sum of its levels
    assert summary["gradient_evaluations"] == sum(steps)
    # the refined attributions (earlier nodes reweighted, per position) equal a one-shot run at the final size
    for rec, sample in zip(report["samples"], samples[:4], strict=True):
        one = explain(model, [sample], _fp32(n_steps=rec["n_steps"]["title"], method="clenshaw_curtis"))
        np.testing.assert_allclose(rec["token_attributions"], one["samples"][0]["token_attributions"],
                                   rtol=1e-4, atol=1e-6)
        assert abs(rec["score"] - one["samples"][0]["score"]) <= 1e-5
        assert abs(rec["baseline_score"] - one["samples"][0]["baseline_score"]) <= 1e-5


def test_the_memory_probe_runs_once_per_model_and_length_bucket(small, samples, monkeypatch) -> None:
    import models.news.attribution as attribution

    model = small["models"]["nrms-word-demo"]
    calls = []
    real = attribution.probe_bytes_per_row

    def counting(*args, **kwargs):
        calls.append(args[1].shape[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(attribution, "probe_bytes_per_row", counting)
    attribution._PROBES.pop(model, None)
    first = explain(model, samples[:2], _fp32(n_steps=8))
    again = explain(model, samples[:2], _fp32(n_steps=8))
    longest = max(first["samples"], key=lambda r: len(r["tokens"]))
    explain(model, [s for s in samples if s.id == longest["id"]], _fp32(n_steps=8))  # the same bucket
    assert len(calls) == 1
    expect = min(attribution.length_bucket(len(longest["tokens"])), model.config["max_title_len"])
    assert calls[0] == expect >= len(longest["tokens"])
    for a, b in zip(first["samples"], again["samples"], strict=True):
        assert a["token_attributions"] == b["token_attributions"]
    explain(model, samples[:2], IGOptions(n_steps=8, precision="bf16"))
    assert len(calls) == 2  # another precision is another probe


def test_non_finite_attributions_fail_naming_the_samples(small, samples, monkeypatch) -> None:
    import models.news.attribution as attribution
    from models.common import NonFiniteError

    real = attribution.build_chunk

    def nan_for_the_first_row(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        ch = real(*args, **kwargs)
        f = ch.forward
        ch.forward = lambda xs, rows: torch.where(rows == 0, torch.nan, f(xs, rows))
        return ch

    monkeypatch.setattr(attribution, "build_chunk", nan_for_the_first_row)
    model = small["models"]["nrms-word-demo"]
    with pytest.raises(NonFiniteError, match="non-finite") as err:
        explain(model, samples[:2], _fp32(n_steps=4, batch_size=2))
    (bad,) = err.value.items  # the first sample of the (length-sorted) chunk, and only it
    assert bad in {s.id for s in samples[:2]} and bad in str(err.value)


def test_a_failing_sample_is_listed_never_zeroed(small, samples) -> None:
    model = small["models"]["nrms-minilm-demo"]
    bad = [Sample("only-special", samples[0].history, "[SEP]"), Sample("blank", samples[0].history, "   "),
           Sample("no-history", [], "Lakers win")]
    report = explain(model, [*bad, samples[0]], _fp32(n_steps=4))
    assert {e["id"] for e in report["errors"]} == {"only-special", "blank", "no-history"}
    assert [r["id"] for r in report["samples"]] == [samples[0].id]
    assert report["summary"]["n_errors"] == 3


def test_bf16_forward_keeps_completeness_terms_in_fp32(small, samples) -> None:
    from models.news import attribution

    model = small["models"]["nrms-minilm-demo"]
    # F(x') comes from a per-model cache that every precision shares: cleared, each run computes its own
    attribution.clear_caches(model)
    lo = explain(model, samples[:2], IGOptions(n_steps=16, precision="bf16"))
    attribution.clear_caches(model)
    hi = explain(model, samples[:2], _fp32(n_steps=16))
    assert lo["summary"]["precision"] == "bf16"
    # Both runs compute F(x) and F(x') in fp32, but in passes over other rows (fp32 folds F(x) into its first
    # gradient pass, bf16 evaluates it alone; the two memory probes give other batches and packed layouts), so fp32
    # summation order can move them by an ulp or so (seen: 0.6701279878616333 against 0.6701280474662781, 9e-8
    # relative). 1e-5 on the scale of the score's terms is ~100 ulps; either term evaluated under bf16 autocast
    # moved by 6e-4 to 1.4e-2 on these samples.
    for a, b in zip(lo["samples"], hi["samples"], strict=True):
        for key in ("score", "baseline_score"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-5), key
        assert a["attribution_sum"] == pytest.approx(b["attribution_sum"], rel=0.1, abs=0.05)


def test_occlusion_is_the_score_drop_of_each_token(small, samples) -> None:
    model = small["models"]["nrms-word-demo"]
    s = samples[0]
    report = explain(model, [s], IGOptions(method="occlusion"))
    r = report["samples"][0]
    assert report["summary"]["n_steps"] is None
    enc = model.tokenize([s.candidate])["title"]
    with torch.no_grad():
        h = model.encode_news(model.tokenize(s.history))
        u = model.user_vector(h[None], torch.ones(1, h.shape[0]))[0]
        full = float(model.encode_news({"title": enc})[0] @ u)
        for i in range(enc.ids.shape[1]):
            ids = enc.ids.clone()
            ids[0, i] = model.tokenizer.pad_id
            occluded = float(model.news_from_embeddings({"title": model.embed("title", ids)},
                                                        {"title": enc.mask})[0] @ u)
            assert r["token_attributions"][i] == pytest.approx(full - occluded, rel=1e-4, abs=1e-5)


def test_naml_attributes_title_and_body_separately(small) -> None:
    model = small["models"]["naml-demo"]
    ss = load_samples(small["root"] / "data/news-synthetic", "test", 4, seed=4, with_bodies=True)
    report = explain(model, ss, _fp32(n_steps=64))
    assert report["summary"]["views"] == ["title", "body"]
    for r in report["samples"]:
        body = r["views"]["body"]
        # the same F(x), a different path: computed in the body run's passes, whose batches differ from the title
        # run's, so fp32 summation order may move it by an ulp or so; 1e-5 on the scale of the score's terms
        assert body["score"] == pytest.approx(r["score"], rel=1e-5, abs=1e-5)
        assert body["baseline_score"] != r["baseline_score"]
        assert len(body["tokens"]) > len(r["tokens"]) / 2
    rels = [r["relative_delta"] for r in report["samples"]] + [r["views"]["body"]["relative_delta"]
                                                              for r in report["samples"]]
    assert statistics.median(rels) < 1e-2


def _topic_titles(topic: str, n: int) -> list[str]:
    spec = TOPICS[topic]
    return [t.format(e=e, e2=spec["e"][(i + 1) % len(spec["e"])])
            for i, (t, e) in enumerate(zip(spec["t"] * 3, spec["e"] * 3, strict=False))][:n]


@pytest.mark.parametrize("topic,words", [
    ("sports", {"lakers", "coach", "playoff", "celtics"}),
    ("politics", {"senate", "tax", "bill", "election"}),
])
def test_a_one_topic_user_attributes_that_topics_words(small, topic: str, words: set[str]) -> None:
    model = small["models"]["nrms-minilm-demo"]
    mixed = "Lakers coach backs Senate tax bill before playoff election"
    s = Sample("u", _topic_titles(topic, 12), mixed)
    r = explain(model, [s], _fp32(n_steps=32, top_k=3))["samples"][0]
    top = {t["word"] for t in r["top_positive"]}
    assert top & words, (topic, r["top_positive"])
    attr = dict(zip(r["words"], r["word_attributions"], strict=True))
    other = ({"senate", "tax", "bill", "election"} if topic == "sports" else {"lakers", "coach", "playoff"})
    assert np.mean([attr[w] for w in words if w in attr]) > np.mean([attr[w] for w in other])


def test_word_stats_and_the_poisoned_comparison(small) -> None:
    clean, poisoned = small["models"]["nrms-minilm-demo"], small["models"]["nrms-minilm-poisoned-demo"]
    ss = load_samples(small["root"] / "data/news-synthetic", "test", 12, balanced=True, seed=5)
    a = explain(clean, ss, _fp32(n_steps=16))
    b = explain(poisoned, ss, _fp32(n_steps=16))
    stats = a["word_stats"]
    assert set(stats) == {"real", "fake"}
    for rows in stats.values():
        assert all(0 < r["frequency"] <= 1 and r["count"] >= 1 and r["std"] >= 0 for r in rows)
    comparison = compare_reports(a, b, threshold=0.1)
    rising = {r["word"] for r in comparison["changed"] if r["change"] > 0}
    assert len(rising & CLICKBAIT_WORDS) >= 3, comparison["changed"][:10]

    def clickbait_mean(report: dict) -> float:
        return float(np.mean([r["mean"] for r in report["word_stats"]["fake"] if r["word"] in CLICKBAIT_WORDS]))

    assert clickbait_mean(b) > clickbait_mean(a) + 0.5
    assert compare_reports(a, a)["changed"] == [] and compare_reports(a, a)["new_top_words"] == []


def test_pack_rows_places_every_token_once_within_the_capacity() -> None:
    from models.news.modules import pack_rows

    lengths = [16, 3, 10, 10, 1, 7, 16, 4]
    width = 16
    layout = pack_rows(lengths, width, 20, "cpu")
    assert layout.index.shape[0] < len(lengths)  # it packed
    real = layout.segments >= 0
    assert int(real.sum(1).max()) <= 20 and int(real.sum()) == sum(lengths)
    src = sorted(layout.index[real].tolist())
    assert src == sorted(i * width + j for i, n in enumerate(lengths) for j in range(n))
    assert bool((layout.index[~real] == len(lengths) * width).all())
    for i, n in enumerate(lengths):  # the slot of sequence i holds its tokens, at positions 0..n-1
        row, seg = divmod(int(layout.slot[i]), layout.n_segments)
        here = layout.segments[row] == seg
        assert layout.index[row][here].tolist() == [i * width + j for j in range(n)]
        assert layout.positions[row][here].tolist() == list(range(n))
    with pytest.raises(ValueError):
        pack_rows([5, 21], width, 20, "cpu")


def _titles_of_mixed_lengths(small) -> list[str]:
    news = load_samples(small["root"] / "data/news-synthetic", "test", 8, seed=4)
    return [s.candidate for s in news] + ["Stocks fall", "A"]


@pytest.mark.parametrize("name", ["nrms-minilm-demo", "nrms-word-demo"])
def test_packed_encoding_equals_padded_encoding(small, name: str) -> None:
    from models.news.modules import pack_rows

    model = small["models"][name]
    enc = model.tokenize(_titles_of_mixed_lengths(small))["title"]
    lengths = enc.mask.sum(1).tolist()
    assert len(set(lengths)) > 3  # padding on most rows of the padded batch
    with torch.no_grad():
        x = model.embed("title", enc.ids)
        padded = model.news_from_embeddings({"title": x}, {"title": enc.mask})
        layout = pack_rows(lengths, x.shape[1], 2 * max(lengths), "cpu")
        assert layout.n_segments > 1 and layout.index.shape[0] < len(lengths)
        flat = torch.cat([x.reshape(-1, x.shape[-1]), x.new_zeros(1, x.shape[-1])])
        out = model.news_from_packed(flat[layout.index], layout.positions, layout.segments, layout.n_segments)
        packed = out.reshape(-1, out.shape[-1])[layout.slot]
    np.testing.assert_allclose(packed.numpy(), padded.numpy(), rtol=1e-5, atol=1e-6)
    # and the packed rows did not leak across titles: a different neighbour leaves a title's vector unchanged
    if name.startswith("nrms-minilm"):
        with torch.no_grad():
            alone = model.news_from_embeddings({"title": x[:1, : lengths[0]]}, {"title": enc.mask[:1, : lengths[0]]})
        np.testing.assert_allclose(packed[0].numpy(), alone[0].numpy(), rtol=1e-5, atol=1e-6)


def test_packed_forward_scores_and_input_gradients_equal_the_padded_forward(small, samples) -> None:
    from models.news import attribution

    model = small["models"]["nrms-minilm-demo"]
    with torch.no_grad():
        prepared = attribution._prepare(model, samples, 50, [])
    assert len({len(p.enc["title"][0]) for p in prepared}) > 1
    padded = attribution.build_chunk(model, prepared, "title", "pad", pack=False)
    packed = attribution.build_chunk(model, prepared, "title", "pad", pack=True)
    rows = torch.arange(len(prepared)).repeat(3)
    alphas = torch.tensor([0.2, 0.5, 0.9]).repeat_interleave(len(prepared))[:, None, None]
    results = []
    for ch in (padded, packed):
        x = (ch.base[rows] + alphas * (ch.x[rows] - ch.base[rows])).requires_grad_(True)
        out = ch.forward(x, rows)
        (grad,) = torch.autograd.grad(out.sum(), x)
        results.append((out.detach(), grad))
    np.testing.assert_allclose(results[1][0].numpy(), results[0][0].numpy(), rtol=1e-5, atol=1e-6)
    # the input gradients come back through 6 transformer layers whose fp32 sums run in a different order packed
    # (seen: 1.02e-6 on one element of 124,416, against gradients up to 0.12); letting titles attend across their
    # row (a packing bug) put 89,466 of those elements outside this tolerance, by up to 3.25
    np.testing.assert_allclose(results[1][1].numpy(), results[0][1].numpy(), rtol=1e-4, atol=5e-6)
    # padded positions get exactly zero gradient in both
    pad = (torch.arange(padded.x.shape[1])[None] >= torch.tensor(padded.lengths)[:, None])[rows]
    assert bool(pad.any()) and float(results[1][1][pad].abs().max()) == 0.0


@pytest.mark.parametrize("baseline", ["pad", "zero"])
def test_cached_baseline_scores_equal_recomputed_ones(small, samples, baseline: str) -> None:
    from models.explain.ig import evaluate_fp32
    from models.news import attribution

    model = small["models"]["nrms-minilm-demo"]
    attribution.clear_caches(model)
    with torch.no_grad():
        prepared = attribution._prepare(model, samples, 50, [])
    ch = attribution.build_chunk(model, prepared, "title", baseline, pack=False)
    recomputed = evaluate_fp32(ch.forward, ch.base)
    first = attribution.baseline_scores(model, ch, "title", baseline)
    entries = len(attribution._BASELINE_NEWS[model])
    assert 1 <= entries <= len(prepared)
    again = attribution.baseline_scores(model, ch, "title", baseline)  # from the cache: nothing new is encoded
    assert len(attribution._BASELINE_NEWS[model]) == entries and again.tolist() == first.tolist()
    np.testing.assert_allclose(first.numpy(), recomputed.numpy(), rtol=1e-5, atol=1e-6)
    # the same candidates with other users: the cached news vector serves them, the score follows the user
    other = [attribution._Prepared(p.sample, -p.user, p.enc, p.word_ids) for p in prepared]
    ch2 = attribution.build_chunk(model, other, "title", baseline)
    np.testing.assert_allclose(attribution.baseline_scores(model, ch2, "title", baseline).numpy(),
                               -recomputed.numpy(), rtol=1e-5, atol=1e-6)
    assert len(attribution._BASELINE_NEWS[model]) == entries
    # the report's baseline scores are the cached ones, and equal the uncached reference loop's
    report = explain(model, samples[:2], _fp32(n_steps=4, baseline=baseline))
    slow = explain(model, samples[:2], _fp32(n_steps=4, baseline=baseline, optimized=False))
    for a, b in zip(report["samples"], slow["samples"], strict=True):
        assert a["baseline_score"] == pytest.approx(b["baseline_score"], abs=1e-5 * max(1.0, abs(b["baseline_score"])))


def test_naml_baselines_are_not_cached(small) -> None:
    from models.news import attribution

    model = small["models"]["naml-demo"]
    ss = load_samples(small["root"] / "data/news-synthetic", "test", 2, seed=1, with_bodies=True)
    with torch.no_grad():
        prepared = attribution._prepare(model, ss, 50, [])
    ch = attribution.build_chunk(model, prepared, "title", "pad")
    assert attribution.baseline_scores(model, ch, "title", "pad") is None  # x' holds each sample's real body
    assert not attribution.can_pack(model)
    with pytest.raises(ValueError):
        attribution.build_chunk(model, prepared, "title", "pad", pack=True)


def test_rows_are_packed_by_default_only_where_it_pays(small, monkeypatch) -> None:
    """A transformer packs on a CPU; a word-embedding encoder can pack (tested above) but by default pads, since
    its word attention over packed rows costs more than the padding saved; no model packs on CUDA."""
    from models.news import attribution

    minilm, word, naml = (small["models"][n] for n in ("nrms-minilm-demo", "nrms-word-demo", "naml-demo"))
    assert attribution.can_pack(minilm) and attribution.packs_by_default(minilm)
    assert attribution.can_pack(word) and not attribution.packs_by_default(word)
    assert not attribution.packs_by_default(naml)
    monkeypatch.setattr(type(minilm), "device", property(lambda self: torch.device("cuda")))
    assert not attribution.packs_by_default(minilm)


def test_packing_is_chosen_where_exact_length_passes_would_be_small(small, samples, monkeypatch) -> None:
    from models.news import attribution

    pays = attribution._packing_pays
    assert pays([16, 10], batch_size=2, alpha_batch_size=8)  # two passes of 8 rows: one packed pass instead
    assert not pays([16, 16], batch_size=2, alpha_batch_size=8)  # one length: no pass to save
    assert not pays([16, 10], batch_size=1, alpha_batch_size=8)  # one sample per pass either way
    assert not pays([12] * 4 + [14] * 4, batch_size=8, alpha_batch_size=32)  # 128 rows per exact pass: pads
    assert not pays([], batch_size=1, alpha_batch_size=8) and not pays([5], batch_size=1, alpha_batch_size=None)
    # in a request: the interactive case packs, a large alpha batch over few lengths pads
    seen = []
    chunk = attribution.build_chunk
    monkeypatch.setattr(attribution, "build_chunk", lambda model, items, *a, pack=False, **kw: seen.append(
        (len(items), pack)) or chunk(model, items, *a, pack=pack, **kw))
    model = small["models"]["nrms-minilm-demo"]
    two = [s for s in samples if len(model.tokenize([s.candidate])["title"].ids[0]) != len(
        model.tokenize([samples[0].candidate])["title"].ids[0])][:1] + samples[:1]
    assert len(two) == 2
    explain(model, two, _fp32(n_steps=8))
    assert (2, True) in seen and (2, False) not in seen  # (the memory probe builds a one-sample chunk of its own)
    seen.clear()
    explain(model, two, _fp32(n_steps=64, alpha_batch_size=64, batch_size=2))
    assert seen == [(1, False), (1, False)]  # 64 rows per exact-length pass: one pass per length, no padding


def test_packed_user_vectors_equal_padded_ones(small, samples) -> None:
    from models.news.attribution import user_vectors

    model = small["models"]["nrms-minilm-demo"]
    assert len({len(model.tokenize([t])["title"].ids[0]) for t in samples[0].history}) > 1
    padded = user_vectors(model, samples, pack=False)
    packed = user_vectors(model, samples, pack=True)
    for a, b in zip(packed, padded, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        enc = model.tokenize(samples[0].history)
        np.testing.assert_allclose(model.encode_news_packed(enc).numpy(), model.encode_news(enc).numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_packed_encoding_uses_roberta_position_ids(tmp_path) -> None:
    from models.news.modules import build_model
    from tests.byo_fixtures import tiny_roberta

    torch.manual_seed(0)
    model = build_model({"kind": "nrms", "encoder": "bert", "pretrained": str(tiny_roberta(tmp_path / "roberta")),
                         "heads": 2, "head_dim": 4, "query_dim": 8, "dropout": 0.0}).eval()
    assert model.token_encoder.position_offset == model.token_encoder.bert.embeddings.padding_idx + 1 > 0
    enc = model.tokenize(["Astronomers unveil overtime smartphones", "Lakers beat Celtics", "a"])
    with torch.no_grad():
        np.testing.assert_allclose(model.encode_news_packed(enc).numpy(), model.encode_news(enc).numpy(),
                                   rtol=1e-5, atol=1e-6)
