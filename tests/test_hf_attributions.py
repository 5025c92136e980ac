"""``POST /attributions`` on Hugging Face sequence classifiers (``models.hf.attribution``): the oracle (Captum's
``LayerIntegratedGradients`` on the word-embedding layer, same baselines, steps and rule), adaptive tolerance,
targets by index and by name, no-padding batching, then the service: a whole and a sharded run of one ``texts``
request give one result, rendered by the SDK and the CLI, and the 422s of a request the model cannot take.

The classifiers are tiny random three-class models built from a config (``tests.hf_fixtures``), so nothing is
downloaded.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from core import registry
from core.contract.results.attributions import AttributionResult, SampleRecord
from models.hf.attribution import HFOptions, explain
from models.hf.batches import TextSample, length_batches, max_tokens, prepare
from models.hf.checkpoint import load
from tests.captum_oracle import captum_layer_ig
from tests.hf_fixtures import LABELS, TEXTS, save_classifier
from tests.results_compare import assert_renders, assert_same

RTOL = 1e-5  # the oracle: explainq's IG against Captum's, relative
STEPS = 16


@pytest.fixture(scope="module")
def fixture_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-attr")
    return {t: save_classifier(root / t, t) for t in ("bert", "roberta", "gpt2")}


@pytest.fixture(scope="module")
def models(fixture_dirs):
    return {t: load(d) for t, d in fixture_dirs.items()}


def _samples(targets=None) -> list[TextSample]:
    return [TextSample(f"t{i}", text, target=None if targets is None else targets[i]) for i, text in enumerate(TEXTS)]


def _forward_logits(clf, text: str, baseline: str, target: int) -> tuple[float, float]:
    """F(x) and F(x') of one text, by one plain forward each (no engine): the logits of the embeddings, with the
    baseline's token (or zeros) at the content positions."""
    from models.hf.batches import baseline_token, logits_from_embeddings

    errors: list = []
    (p,) = prepare(clf, [TextSample("x", text)], errors)
    ids = torch.tensor([p.ids])
    content = torch.tensor([p.content])
    with torch.no_grad():
        x = clf.embeddings()(ids)
        token = baseline_token(clf, baseline)
        base = (torch.where(content[..., None], torch.zeros_like(x), x) if token is None
                else clf.embeddings()(torch.where(content, torch.full_like(ids, token), ids)))
        logits = logits_from_embeddings(clf)
        return float(logits(x)[0, target]), float(logits(base)[0, target])


# ------------------------------------------------------------------------------------------------- the oracle
@pytest.mark.parametrize(("model_type", "baseline", "method"), [
    ("bert", "pad", "gausslegendre"), ("bert", "mask", "gausslegendre"), ("bert", "zero", "gausslegendre"),
    ("bert", "pad", "riemann_middle"), ("roberta", "pad", "gausslegendre"), ("roberta", "mask", "gausslegendre"),
    ("gpt2", "pad", "gausslegendre"), ("gpt2", "zero", "gausslegendre"),
])
def test_equals_captum_layer_integrated_gradients(models, model_type, baseline, method):
    """Token attributions and their sum equal Captum's to 1e-5 relative (of the largest attribution, and of the
    attributions' L1 norm for the sum, which cancels); F(x) − F(x') equals plain forwards (and, for BERT, whose
    baseline forward Captum computes on the same positions, Captum's own completeness terms)."""
    clf = models[model_type]
    targets = [i % len(LABELS) for i in range(len(TEXTS))]
    report = explain(clf, _samples(targets), HFOptions(n_steps=STEPS, method=method, baseline=baseline,
                                                      precision="fp32"))
    assert report["errors"] == [] and len(report["samples"]) == len(TEXTS)
    for text, target, rec in zip(TEXTS, targets, report["samples"], strict=True):
        captum, captum_sum = captum_layer_ig(clf, text, target, baseline, STEPS, method)
        ours = np.array(rec["token_attributions"])
        scale = float(captum.abs().max())
        np.testing.assert_allclose(ours, captum.numpy(), rtol=RTOL, atol=RTOL * scale, err_msg=text)
        assert abs(rec["attribution_sum"] - captum_sum) <= RTOL * float(captum.abs().sum())
        fx, fb = _forward_logits(clf, text, baseline, target)
        assert rec["score"] == pytest.approx(fx, rel=RTOL, abs=1e-6)
        assert rec["baseline_score"] == pytest.approx(fb, rel=RTOL, abs=1e-6)
        assert rec["target"] == {"index": target, "label": LABELS[target], "source": "request"}
        SampleRecord.model_validate(rec)


def test_captum_completeness_terms_agree_on_bert(models):
    """Captum's convergence delta gives F(x) − F(x') = Σ attributions − delta; on BERT (positions do not depend on
    the ids) its baseline forward is the path's end, so it equals explainq's score − baseline_score."""
    from captum.attr import LayerIntegratedGradients

    from models.news.text import structural_ids

    clf = models["bert"]
    report = explain(clf, _samples([2] * len(TEXTS)), HFOptions(n_steps=STEPS, precision="fp32"))
    model, tok = clf.model, clf.tokenizer
    special = structural_ids(tok)
    for text, rec in zip(TEXTS, report["samples"], strict=True):
        ids = tok(text, return_tensors="pt")["input_ids"]
        base = torch.tensor([[t if t in special else tok.pad_token_id for t in ids[0].tolist()]])
        lig = LayerIntegratedGradients(lambda i: model(input_ids=i, attention_mask=torch.ones_like(i)).logits,
                                       model.get_input_embeddings())
        attr, delta = lig.attribute(ids, baselines=base, target=2, n_steps=STEPS, method="gausslegendre",
                                    return_convergence_delta=True)
        captum_diff = float(attr.sum()) - float(delta)
        assert rec["score"] - rec["baseline_score"] == pytest.approx(captum_diff, rel=RTOL, abs=1e-6)


def test_structural_tokens_get_no_attribution_and_are_no_word(models):
    clf = models["bert"]
    (rec,) = explain(clf, [TextSample("a", "the movie was good")], HFOptions(n_steps=8))["samples"]
    assert rec["tokens"][0] == "[CLS]" and rec["tokens"][-1] == "[SEP]"
    assert rec["token_attributions"][0] == 0.0 and rec["token_attributions"][-1] == 0.0
    assert rec["display_words"] == ["the", "movie", "was", "good"]
    assert rec["spans"] == [[0, 3], [4, 9], [10, 13], [14, 18]]
    assert sum(rec["word_attributions"]) == pytest.approx(rec["attribution_sum"], rel=1e-9, abs=1e-12)


def test_byte_level_words_are_spans_without_their_leading_space(models):
    (rec,) = explain(models["roberta"], [TextSample("a", "great acting but dull")], HFOptions(n_steps=8))["samples"]
    assert rec["words"] == rec["display_words"] == ["great", "acting", "but", "dull"]
    assert rec["spans"] == [[0, 5], [6, 12], [13, 16], [17, 21]]


# ----------------------------------------------------------------------------------------------- the options
@pytest.mark.parametrize("model_type", ["bert", "gpt2"])
def test_adaptive_tolerance_is_met(models, model_type):
    tol = 1e-4
    report = explain(models[model_type], _samples(), HFOptions(n_steps=64, tolerance=tol, precision="fp32"))
    assert report["summary"]["method"] == "clenshaw_curtis" and report["summary"]["tolerance_met"] is True
    for rec in report["samples"]:
        assert rec["tolerance_met"] is True and rec["relative_delta"] <= tol, rec["relative_delta"]
        assert set(rec["n_steps"]) == {"text"} and rec["n_steps"]["text"] >= 16
    assert report["summary"]["gradient_evaluations"] >= 16 * len(TEXTS)


def test_targets_by_index_and_by_name_and_the_predicted_default(models):
    clf = models["gpt2"]
    opts = HFOptions(n_steps=8, precision="fp32")
    by_index = explain(clf, _samples([2] * len(TEXTS)), opts)["samples"]
    by_name = explain(clf, _samples(["positive"] * len(TEXTS)), opts)["samples"]
    default = explain(clf, _samples(), opts)["samples"]
    logits = clf.logits(TEXTS).double()
    for a, b, d, row in zip(by_index, by_name, default, logits, strict=True):
        assert a["token_attributions"] == b["token_attributions"] and a["score"] == b["score"]
        assert a["target"] == b["target"] == {"index": 2, "label": "positive", "source": "request"}
        assert a["score"] == pytest.approx(float(row[2]), rel=1e-5, abs=1e-6)
        top = int(row.argmax())
        assert d["target"] == {"index": top, "label": LABELS[top], "source": "predicted"}
        assert d["predicted"]["index"] == top and d["score"] == pytest.approx(float(row[top]), rel=1e-5, abs=1e-6)
        assert d["predicted"]["probability"] == pytest.approx(float(torch.softmax(row, 0)[top]), rel=1e-6)
    bad = explain(clf, [TextSample("a", "good", target="nope"), TextSample("b", "good", target=7),
                        TextSample("c", "   ")], opts)
    assert bad["samples"] == []
    assert [e["id"] for e in bad["errors"]] == ["a", "b", "c"]
    assert "not a class of the model" in bad["errors"][0]["error"]


@pytest.mark.parametrize("model_type", ["bert", "gpt2"])
def test_batching_texts_of_one_length_equals_one_text_at_a_time(models, model_type):
    """Texts of equal token length share a batch (nothing padded: GPT-2 reads the last position); the attributions
    equal those of one text per batch."""
    clf = models[model_type]
    texts = [*TEXTS, "the film was bad", "the movie was good", "a plot was dull"]
    samples = [TextSample(f"t{i}", t) for i, t in enumerate(texts)]
    batches = length_batches(prepare(clf, samples, []), 64)
    assert max(len(b) for b in batches) > 1  # some texts do share a length
    together = explain(clf, samples, HFOptions(n_steps=12, precision="fp32", batch_size=64))
    alone = explain(clf, samples, HFOptions(n_steps=12, precision="fp32", batch_size=1))
    assert together["summary"]["batch_size"] > 1 and alone["summary"]["batch_size"] == 1
    for a, b in zip(together["samples"], alone["samples"], strict=True):
        assert a["id"] == b["id"] and a["tokens"] == b["tokens"]
        scale = max(abs(v) for v in b["token_attributions"])
        np.testing.assert_allclose(a["token_attributions"], b["token_attributions"], rtol=1e-5, atol=1e-6 * scale)
        assert a["score"] == pytest.approx(b["score"], rel=1e-5, abs=1e-6)


def test_gpt2_without_a_padding_token_reads_the_last_position(fixture_dirs):
    """A GPT-2 classifier with no pad_token_id refuses batches; its transformer and score head give the same
    logits, batched."""
    with_pad, without = load(fixture_dirs["gpt2"]), load(fixture_dirs["gpt2"])
    without.model.config.pad_token_id = None
    opts = HFOptions(n_steps=8, precision="fp32", baseline="zero", batch_size=64)
    samples = [TextSample("a", "the film was bad"), TextSample("b", "the movie was good")]
    a, b = explain(with_pad, samples, opts)["samples"], explain(without, samples, opts)["samples"]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x["token_attributions"], y["token_attributions"], rtol=1e-5, atol=1e-7)


def test_a_long_text_is_truncated_to_the_models_maximum(models):
    clf = models["bert"]
    assert max_tokens(clf) == 64
    (rec,) = explain(clf, [TextSample("long", " ".join(["good"] * 200))], HFOptions(n_steps=4))["samples"]
    assert rec["truncated"] is True and len(rec["tokens"]) == 64 and rec["tokens"][-1] == "[SEP]"


def test_occlusion_faithfulness_and_the_reference_loop(models):
    clf = models["bert"]
    occ = explain(clf, _samples(), HFOptions(method="occlusion"))
    assert occ["summary"]["n_steps"] is None and occ["summary"]["gradient_evaluations"] is None
    ref = explain(clf, _samples(), HFOptions(n_steps=8, optimized=False))
    fast = explain(clf, _samples(), HFOptions(n_steps=8, precision="fp32"))
    for r, f in zip(ref["samples"], fast["samples"], strict=True):
        np.testing.assert_allclose(r["token_attributions"], f["token_attributions"], rtol=1e-5, atol=1e-7)
    faith = explain(clf, _samples(), HFOptions(n_steps=8, faithfulness=True, faithfulness_seed=3))
    section = faith["faithfulness"]
    assert section["n_samples"] == len(TEXTS) and section["view"] == "text" and section["seed"] == 3
    assert set(section["orders"]) == {"ig", "random", "occlusion"}
    for rec in faith["samples"]:
        assert rec["faithfulness"]["n_words"] == len(rec["words"])
        # deleting no word leaves the target logit
        assert rec["faithfulness"]["orders"]["ig"]["deletion"][0] == pytest.approx(rec["score"], rel=1e-5)


# ------------------------------------------------------------------------------------------------ the service
HF, HF_B, NEWS_STUB, NO_MASK, OTHER_LABELS = "hf-bert", "hf-roberta", "news-stub", "hf-nomask", "hf-other"
TEXT_ITEMS = [
    {"id": "a", "text": "the movie was good", "label": "positive"},
    {"id": "b", "text": "a very boring and long film", "label": "negative", "target": "negative"},
    {"id": "c", "text": "great acting but the plot was dull", "target": 1},
    {"id": "d", "text": "   "},  # no token: an error, listed in both runs
    {"id": "e", "text": "not bad", "label": "neutral"},
    {"id": "f", "text": "really funny", "target": "positive"},
]
BODY = {"model": HF, "texts": TEXT_ITEMS, "n_steps": 6, "top_k": 3, "precision": "fp32", "compare_with": HF_B,
        "faithfulness": True, "max_failed_fraction": 0.5}
PER_RUN = {"seconds", "seconds_prepare", "batch_size", "alpha_batch_size", "cpu_seconds", "attribution_seconds",
           "time_ratio"}


@pytest.fixture(scope="module")
def svc(tmp_path_factory, fixture_dirs):
    from tests.service import Service

    home = tmp_path_factory.mktemp("hf-attr-home")
    service = Service(home, queues=("explain,bulk",), start=False)
    settings = service.settings
    meta = {"labels": list(LABELS), "model_type": "bert"}
    registry.register_model(settings, HF, kind="hf_classifier", loader="models.hf.checkpoint:load",
                            path=fixture_dirs["bert"], meta=meta)
    registry.register_model(settings, HF_B, kind="hf_classifier", loader="models.hf.checkpoint:load",
                            path=fixture_dirs["roberta"], meta={**meta, "model_type": "roberta"})
    registry.register_model(settings, OTHER_LABELS, kind="hf_classifier", loader="models.hf.checkpoint:load",
                            path=fixture_dirs["bert"], meta={"labels": ["spam", "ham", "eggs"]})
    no_mask = tmp_path_factory.mktemp("hf-nomask") / "m"
    shutil.copytree(fixture_dirs["gpt2"], no_mask)
    cfg = json.loads((no_mask / "tokenizer_config.json").read_text())
    cfg.pop("mask_token")
    (no_mask / "tokenizer_config.json").write_text(json.dumps(cfg))
    registry.register_model(settings, NO_MASK, kind="hf_classifier", loader="models.hf.checkpoint:load",
                            path=no_mask, meta=meta)
    registry.register_model(settings, NEWS_STUB, kind="news", loader="models.news.checkpoint:load",
                            path=fixture_dirs["bert"])  # never loaded: submission checks only
    service.start()
    yield service
    service.stop()


def _tolerance(where: str) -> tuple[float, float]:
    last = where.rsplit(".", 1)[-1]
    if "relative_delta" in where or last == "delta":
        return 5e-2, 1e-4
    if "faithfulness" in where:
        return 1e-3, 1e-5
    return 1e-4, 1e-6


def test_whole_and_sharded_texts_runs_give_one_result(svc):
    ids = []
    for shard_size in (len(TEXT_ITEMS), 2):
        r = svc.client.post("/attributions", json={**BODY, "shard_size": shard_size})
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    for job_id in ids:
        job = svc.wait(job_id, timeout_s=300)
        assert job["status"] == "succeeded", (job, svc.worker_logs())
    whole, sharded = (svc.client.get(f"/jobs/{j}/result").json() for j in ids)
    for result in (whole, sharded):
        AttributionResult.model_validate(result)
    assert whole["shards"] is None and sharded["shards"] == {"total": 3, "failed": []}
    assert_same(*({k: v for k, v in r.items() if k not in ("shards", "artifacts")} for r in (sharded, whole)),
                _tolerance, PER_RUN)
    assert {a["name"] for a in whole["artifacts"]} == {a["name"] for a in sharded["artifacts"]}

    assert whole["n_samples"] == 5 and whole["errors"] == [{"id": "d", "error": "text must be a non-empty string"}]
    assert whole["summary"]["views"] == ["text"] and whole["faithfulness"]["view"] == "text"
    by_id = {s["id"]: s for s in whole["samples"]}
    assert by_id["b"]["target"] == {"index": 0, "label": "negative", "source": "request"}
    assert by_id["c"]["target"] == {"index": 1, "label": "neutral", "source": "request"}
    assert by_id["a"]["target"]["source"] == "predicted" and by_id["a"]["truncated"] is False
    assert sorted(whole["word_stats"]) == ["negative", "neutral", "positive", "unlabelled"]
    # the comparison explains the same class under the second model, and aligns the words by their spans
    compared = {s["id"]: s for s in whole["comparison"]["samples"]}
    for sid, rec in by_id.items():
        assert compared[sid]["target"]["label"] == rec["target"]["label"]
        assert compared[sid]["target"]["source"] == "model"
    assert all(p["aligned"] == len(by_id[p["id"]]["words"]) for p in whole["comparison"]["per_sample"])

    from explainq_client import AttributionResult as SDKAttributionResult

    assert_renders(svc.settings, ids, SDKAttributionResult)


@pytest.mark.parametrize(("body", "loc", "says"), [
    ({"model": HF, "samples": [{"id": "s", "history": ["a"], "candidate": "b"}]}, ("body", "samples"),
     "Hugging Face classifier"),
    ({"model": HF, "dataset": {"name": "d"}}, ("body", "dataset"), "Hugging Face classifier"),
    ({"model": HF}, ("body", "texts"), "give texts"),
    ({"model": NEWS_STUB, "texts": [{"id": "a", "text": "x"}]}, ("body", "texts"), "news recommender"),
    ({"model": NEWS_STUB, "baseline": "mask", "samples": [{"id": "s", "history": ["a"], "candidate": "b"}]},
     ("body", "baseline"), "news recommender takes"),
    ({"model": HF, "texts": [{"id": "a", "text": "x"}, {"id": "b", "text": "y", "target": "nope"}]},
     ("body", "texts", 1, "target"), "not a class"),
    ({"model": HF, "texts": [{"id": "a", "text": "x", "target": 3}]}, ("body", "texts", 0, "target"),
     "not one of"),
    ({"model": HF, "texts": [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}]}, ("body", "texts", 1, "id"),
     "duplicate"),
    ({"model": HF, "texts": [{"id": "a", "text": "x"}], "max_history": 5}, ("body", "max_history"), "history"),
    ({"model": NO_MASK, "texts": [{"id": "a", "text": "x"}], "baseline": "mask"}, ("body", "baseline"),
     "no mask token"),
    ({"model": HF, "texts": [{"id": "a", "text": "x"}], "compare_with": NEWS_STUB}, ("body", "compare_with"),
     "Hugging Face classifier"),
    ({"model": HF, "texts": [{"id": "a", "text": "x"}], "compare_with": OTHER_LABELS}, ("body", "compare_with"),
     "same class names"),
    ({"model": HF, "texts": [{"id": "a", "text": "x", "target": True}]}, ("body", "texts", 0, "target"), ""),
])
def test_what_a_model_cannot_take_is_a_422_naming_the_field(svc, body, loc, says):
    r = svc.client.post("/attributions", json=body)
    assert r.status_code == 422, r.text
    found = [d for d in r.json()["detail"] if tuple(d["loc"][:len(loc)]) == loc]
    assert found, r.text
    assert says in found[0]["msg"], found
