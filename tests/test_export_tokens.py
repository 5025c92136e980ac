"""Exported text classifiers over token ids (``models.export.tokens``): the spec names the embedding table and the
graph must agree, IG over that table's output equals Captum's ``LayerIntegratedGradients`` on the eager model's
embedding layer (same baselines, steps and rule), and the records group the vocabulary's pieces into words.

The two models (``tests.token_fixtures``) are a mean-pooled embedding bag with an attention mask and a dynamic
length, and a one-layer transformer with learned positions over 8 tokens; both exported by the test itself.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from captum.attr import LayerIntegratedGradients

from core.contract.results.attributions import SampleRecord
from models.export.attribution import ExportOptions, TensorSample, explain
from models.export.files import inspect_program
from models.export.program import build
from models.export.spec import SpecError, check_spec
from tests.export_fixtures import edit_program, rewrite
from tests.token_fixtures import (
    BAG_SPEC,
    CLS,
    LABELS,
    MASK,
    PAD,
    STATIC_LENGTH,
    TRANSFORMER_SPEC,
    VOCAB,
    save_token_dir,
)

RTOL = 1e-5
STEPS = 16
# ids of the bag model (dynamic length, padded rows too) and of the transformer (8 tokens, padded at the end)
BAG_IDS = [[CLS, 3, 4, 5, 6], [CLS, 10, 11, 12, 13, 15, 16, 17], [CLS, 19, 20, 21, 22, PAD, PAD],
           [CLS, 7, 9, 18, 23], [CLS, 8]]
TRANSFORMER_IDS = [[CLS, 3, 4, 5, 6, 13, 7, 23], [CLS, 10, 11, 14, 16, 17, PAD, PAD],
                   [CLS, 19, 20, 21, 18, 12, 9, PAD]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokens")
    out = {}
    for kind in ("bag", "transformer"):
        directory, model = save_token_dir(root / kind, kind)
        out[kind] = (model, directory, build(directory / "model.pt2", json.loads((directory / "spec.json").read_text())))
    return out


def _samples(ids, targets=None) -> list[TensorSample]:
    return [TensorSample(f"s{i}", np.array(row), target=None if targets is None else targets[i])
            for i, row in enumerate(ids)]


def _captum(kind: str, model: torch.nn.Module, row: list[int], target: int, baseline: str, method: str
            ) -> torch.Tensor:
    """Captum's ``LayerIntegratedGradients`` on the eager model's token-embedding layer: token attributions
    ``(L,)`` (summed over the embedding dimension), with the baseline token at every content position."""
    ids = torch.tensor([row])
    token = PAD if baseline == "pad" else MASK
    base = torch.tensor([[t if t in (PAD, CLS) else token for t in row]])
    if kind == "bag":
        lig = LayerIntegratedGradients(lambda i, m: model(i, m), model.embed)
        attr = lig.attribute(ids, baselines=base, additional_forward_args=((ids != PAD).long(),), target=target,
                             n_steps=STEPS, method=method)
    else:
        lig = LayerIntegratedGradients(model, model.tokens)
        attr = lig.attribute(ids, baselines=base, target=target, n_steps=STEPS, method=method)
    return attr[0].sum(-1).double()


@pytest.mark.parametrize(("kind", "baseline", "method"), [
    ("bag", "pad", "gausslegendre"), ("bag", "mask", "gausslegendre"), ("bag", "pad", "riemann_right"),
    ("transformer", "pad", "gausslegendre"), ("transformer", "mask", "riemann_middle"),
])
def test_equals_captum_layer_integrated_gradients_on_the_eager_model(models, kind, baseline, method):
    model, _, clf = models[kind]
    ids = BAG_IDS if kind == "bag" else TRANSFORMER_IDS
    targets = [i % len(LABELS) for i in range(len(ids))]
    report = explain(clf, _samples(ids, targets), ExportOptions(n_steps=STEPS, method=method, baseline=baseline,
                                                               precision="fp32"))
    assert report["errors"] == [] and len(report["samples"]) == len(ids)
    for row, target, rec in zip(ids, targets, report["samples"], strict=True):
        theirs = _captum(kind, model, row, target, baseline, method)
        ours = np.array(rec["token_attributions"])
        scale = float(theirs.abs().max())
        assert scale > 1e-4  # the comparison is not between zeros
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=RTOL, atol=RTOL * scale, err_msg=str(row))
        x = torch.tensor([row])
        with torch.no_grad():
            eager = model(x, (x != PAD).long()) if kind == "bag" else model(x)
        assert rec["score"] == pytest.approx(float(eager[0, target]), rel=RTOL, abs=1e-6)
        assert rec["target"] == {"index": target, "label": LABELS[target], "source": "request"}
        SampleRecord.model_validate(rec)


def test_records_show_the_vocabularys_words_and_padding_gets_nothing(models):
    _, _, clf = models["bag"]
    report = explain(clf, _samples([BAG_IDS[1], BAG_IDS[2]]), ExportOptions(n_steps=8, baseline="zero"))
    rec, padded = report["samples"]
    assert rec["tokens"] == [VOCAB[t] for t in BAG_IDS[1]]
    assert rec["words"] == ["acting", "plot", "but", "not", "funny"]  # act ##ing, fun ##ny
    assert rec["display_words"] == rec["words"] and rec["spans"][0] == [0, 6] and rec["spans"][1] == [7, 11]
    assert rec["token_attributions"][0] == 0.0  # [CLS] keeps its embedding in the baseline
    assert padded["token_attributions"][-2:] == [0.0, 0.0] and padded["words"] == ["story", "ended", "well"]
    for r in (rec, padded):
        assert sum(r["word_attributions"]) == pytest.approx(r["attribution_sum"], rel=1e-9, abs=1e-12)
        assert abs(r["relative_delta"]) < 0.05
    assert report["summary"]["views"] == ["text"] and report["summary"]["baseline"] == "zero"
    assert {s["word"] for s in report["word_stats"]["unlabelled"]} >= {"acting", "funny"}


def test_adaptive_tolerance_precision_occlusion_and_faithfulness(models):
    _, _, clf = models["transformer"]
    samples = _samples(TRANSFORMER_IDS, ["positive", 0, None])
    adaptive = explain(clf, samples, ExportOptions(n_steps=256, tolerance=1e-4, baseline="pad", faithfulness=True))
    assert adaptive["summary"]["tolerance_met"] is True
    assert all(r["relative_delta"] <= 1e-4 and r["n_steps"]["text"] >= 16 for r in adaptive["samples"])
    assert adaptive["samples"][0]["target"]["label"] == "positive"
    assert adaptive["samples"][2]["target"]["source"] == "predicted"
    assert adaptive["faithfulness"]["n_samples"] == 3
    assert set(adaptive["samples"][0]["faithfulness"]["orders"]) == {"ig", "random", "occlusion"}
    fixed = explain(clf, samples, ExportOptions(n_steps=64, baseline="pad", precision="fp32"))
    for a, b in zip(adaptive["samples"], fixed["samples"], strict=True):
        np.testing.assert_allclose(a["token_attributions"], b["token_attributions"], rtol=2e-3, atol=2e-4)
    bf16 = explain(clf, samples, ExportOptions(n_steps=16, baseline="pad", precision="bf16"))
    assert bf16["summary"]["precision"] == "bf16"
    for a, b in zip(bf16["samples"], fixed["samples"], strict=True):
        np.testing.assert_allclose(a["word_attributions"], b["word_attributions"], atol=0.1 * max(
            abs(v) for v in b["word_attributions"]))
    occ = explain(clf, samples[:1], ExportOptions(method="occlusion", baseline="mask"))
    assert occ["summary"]["method"] == "occlusion" and occ["samples"][0]["token_attributions"][0] == 0.0
    reference = explain(clf, samples[:1], ExportOptions(n_steps=8, baseline="pad", optimized=False))
    fast = explain(clf, samples[:1], ExportOptions(n_steps=8, baseline="pad"))
    np.testing.assert_allclose(reference["samples"][0]["token_attributions"],
                               fast["samples"][0]["token_attributions"], rtol=1e-5, atol=1e-7)


def test_inputs_the_model_cannot_read_become_errors(models):
    _, _, clf = models["transformer"]
    report = explain(clf, [TensorSample("short", np.array([CLS, 3])), TensorSample("oov", np.array([CLS] + [3] * 6 + [99])),
                           TensorSample("empty", np.array([CLS] + [PAD] * 7)),
                           TensorSample("ok", np.array(TRANSFORMER_IDS[0]))], ExportOptions(n_steps=4))
    errors = {e["id"]: e["error"] for e in report["errors"]}
    assert "exactly 8" in errors["short"] and "values[7] is 99" in errors["oov"]
    assert "padding and special" in errors["empty"] and [r["id"] for r in report["samples"]] == ["ok"]
    with pytest.raises(ValueError, match="for token inputs"):
        explain(clf, _samples(TRANSFORMER_IDS[:1]), ExportOptions(baseline="blur"))


# --------------------------------------------------------------------------------------------------- the spec
def test_the_checked_spec_round_trips_and_says_what_the_graph_has(models):
    _, directory, clf = models["bag"]
    info = inspect_program(directory / "model.pt2")
    assert "aten.__and__.Tensor" in info.operators and "aten.embedding.default" in info.operators
    assert clf.spec.to_json()["input"] == {
        "name": "ids", "kind": "tokens", "dtype": "int64", "shape": ["batch", "tokens"], "embedding": "embed.weight",
        "vocab_size": len(VOCAB), "max_tokens": 32, "min_tokens": 1, "pad_id": PAD, "mask_id": MASK,
        "attention_mask": "mask", "special_ids": [CLS], "vocabulary": "vocab.txt"}
    read = {"vocab.txt": (directory / "vocab.txt").read_bytes()}.__getitem__
    again = check_spec(clf.spec.to_json(), info, read)
    assert again.tokens == clf.spec.tokens
    _, tdir, tclf = models["transformer"]
    assert tclf.spec.to_json()["input"]["shape"] == ["batch", STATIC_LENGTH]


def _refusal(models, kind, change, read=None) -> SpecError:
    _, directory, _ = models[kind]
    spec = copy.deepcopy(BAG_SPEC if kind == "bag" else TRANSFORMER_SPEC)
    change(spec["input"])
    info = inspect_program(directory / "model.pt2")
    with pytest.raises(SpecError) as caught:
        check_spec(spec, info, read or (lambda name: (directory / "vocab.txt").read_bytes()))
    return caught.value


@pytest.mark.parametrize(("kind", "change", "field", "says"), [
    ("bag", lambda i: i.update(embedding="embeddings.weight"), "embedding",
     "no parameter or buffer 'embeddings.weight'; the graph's embedding calls read 'embed.weight' with indices "
     "input 'ids'"),
    ("bag", lambda i: i.update(embedding="hidden.weight"), "embedding",
     "'hidden.weight' is not read by an aten.embedding.default call"),
    ("transformer", lambda i: i.update(embedding="positions.weight"), "embedding",
     "'positions.weight' is not the table of an embedding call whose indices are the input 'ids'"),
    ("bag", lambda i: i.pop("embedding"), "embedding", "names its embedding table"),
    ("bag", lambda i: i.update(pad_id=24), "pad_id", "0..23"),
    ("bag", lambda i: i.update(special_ids=[2, -1]), "special_ids", "special_ids[1] must be a token id"),
    ("bag", lambda i: i.pop("pad_id"), "pad_id", "with an attention mask, give pad_id"),
    ("bag", lambda i: i.pop("attention_mask"), "attention_mask", "the program takes 2 inputs (ids, mask)"),
    ("bag", lambda i: i.update(attention_mask="attn"), "attention_mask", "no input 'attn'"),
    ("bag", lambda i: i.update(max_tokens=64), "max_tokens", "exported for 1 to 32 tokens"),
    ("transformer", lambda i: i.update(max_tokens=16), "max_tokens", "reads exactly 8 tokens"),
    ("bag", lambda i: i.update(vocabulary="../vocab.txt"), "vocabulary", "plain name"),
    ("bag", lambda i: i.update(vocab_size=30), "vocab_size", "has 24 rows"),
    ("bag", lambda i: i.update(features=["a"]), "features", "unknown input field 'features'"),
])
def test_a_spec_the_graph_disagrees_with_is_refused_naming_the_field(models, kind, change, field, says):
    err = _refusal(models, kind, change)
    assert err.field[:2] == ("input", field) and says in str(err), str(err)


@pytest.mark.parametrize(("change", "field"), [
    (lambda i: i.update(attention_mask=["mask"]), "attention_mask"), (lambda i: i.update(embedding=7), "embedding"),
    (lambda i: i.update(max_tokens=True), "max_tokens"), (lambda i: i.update(special_ids={"a": 1}), "special_ids"),
    (lambda i: i.update(vocabulary=["vocab.txt"]), "vocabulary"), (lambda i: i.update(pad_id=1.0), "pad_id"),
])
def test_a_hostile_spec_is_a_spec_error_not_a_crash(models, change, field):
    assert _refusal(models, "bag", change).field[:2] == ("input", field)


def test_odd_range_constraints_are_read_as_unknown_bounds(models, tmp_path):
    _, directory, _ = models["bag"]
    crafted = rewrite(directory / "model.pt2", tmp_path / "odd.pt2",
                      edit_program(lambda p: p.update(range_constraints=["s0"])))
    with pytest.raises(SpecError, match="give max_tokens"):
        check_spec({**BAG_SPEC, "input": {k: v for k, v in BAG_SPEC["input"].items() if k != "max_tokens"}},
                   inspect_program(crafted), lambda name: (directory / "vocab.txt").read_bytes())


def test_a_vocabulary_of_the_wrong_size_or_not_text_is_refused(models):
    err = _refusal(models, "bag", lambda i: None, lambda name: "\n".join(VOCAB[:-1]).encode())
    assert err.field == ("input", "vocabulary") and "23 lines; the embedding table has 24 rows" in str(err)
    err = _refusal(models, "bag", lambda i: None, lambda name: b"\xff\xfe" * 30)
    assert "not UTF-8" in str(err)
    err = _refusal(models, "bag", lambda i: None, lambda name: ("\n".join(VOCAB[:5] + [""] + VOCAB[6:])).encode())
    assert "line 6 must be a printable token" in str(err)


def test_a_crafted_archive_whose_table_is_indexed_by_another_input_is_refused(models, tmp_path):
    """The bag's archive rewritten so that its embedding call takes the attention mask as indices: the spec's
    table is in the graph, but not read with the ids."""
    _, directory, _ = models["bag"]

    def indices_from_mask(program):
        node = next(n for n in program["graph_module"]["graph"]["nodes"]
                    if n["target"] == "torch.ops.aten.embedding.default")
        node["inputs"][1]["arg"] = {"as_tensor": {"name": "mask"}}

    crafted = rewrite(directory / "model.pt2", tmp_path / "crafted.pt2", edit_program(indices_from_mask))
    with pytest.raises(SpecError) as caught:
        check_spec(BAG_SPEC, inspect_program(crafted), lambda name: (directory / "vocab.txt").read_bytes())
    assert caught.value.field == ("input", "embedding")
    assert "indices input 'mask'" in str(caught.value) and "whose indices are the input 'ids'" in str(caught.value)


def test_a_float_input_is_still_not_a_token_input(tmp_path):
    from tests.export_fixtures import IMAGE_SPEC, digit_cnn, export

    path = export(digit_cnn(), torch.randn(2, 1, 8, 8), tmp_path / "img.pt2")
    with pytest.raises(SpecError, match="token ids are int64"):
        check_spec({"input": {"kind": "tokens", "embedding": "conv.weight"}, "labels": IMAGE_SPEC["labels"]},
                   inspect_program(path))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_token_path_equals_the_cpu_run(models):
    _, directory, cpu = models["transformer"]
    gpu = build(directory / "model.pt2", json.loads((directory / "spec.json").read_text()), device="cuda")
    samples = _samples(TRANSFORMER_IDS, [0, 1, 2])
    ref = explain(cpu, samples, ExportOptions(n_steps=STEPS, baseline="pad", precision="fp32"))
    out = explain(gpu, samples, ExportOptions(n_steps=STEPS, baseline="pad", precision="fp32", faithfulness=True))
    for a, b in zip(out["samples"], ref["samples"], strict=True):
        np.testing.assert_allclose(a["token_attributions"], b["token_attributions"], rtol=1e-4, atol=1e-5)
    half = explain(gpu, samples, ExportOptions(n_steps=STEPS, baseline="pad", precision="bf16"))
    assert half["summary"]["precision"] == "bf16" and half["errors"] == []


@pytest.mark.slow  # 13 s on 2 shared cores (the export); the bag and transformer oracles above are the fast ones
def test_an_exported_bert_classifier_equals_captum_on_the_eager_model(tmp_path):
    """A BERT-family classifier (random, from a config: ``tests.hf_fixtures``) exported with its input ids and
    attention mask: the spec names its word-embedding table; IG over it equals Captum's
    ``LayerIntegratedGradients`` on the eager model's ``get_input_embeddings()`` (position and token-type
    embeddings, LayerNorm and every layer computing on the real ids)."""
    from models.hf.checkpoint import load as load_hf
    from tests.hf_fixtures import save_classifier

    hf = load_hf(save_classifier(tmp_path / "hf", "bert"))
    model, tok = hf.model.eval(), hf.tokenizer

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, mask):
            return self.m(input_ids=ids, attention_mask=mask).logits

    enc = tok(["the movie was good", "a dull plot"], padding=True, return_tensors="pt")
    batch, tokens = torch.export.Dim("batch", max=1024), torch.export.Dim("tokens", min=2, max=64)
    program = torch.export.export(Logits(model).eval(), (enc["input_ids"], enc["attention_mask"]),
                                  dynamic_shapes=({0: batch, 1: tokens}, {0: batch, 1: tokens}))
    torch.export.save(program, str(tmp_path / "model.pt2"))
    (tmp_path / "vocab.txt").write_text("\n".join(tok.convert_ids_to_tokens(list(range(model.config.vocab_size))))
                                        + "\n")
    special = [tok.cls_token_id, tok.sep_token_id]
    spec = {"input": {"kind": "tokens", "name": "ids", "embedding": "m.bert.embeddings.word_embeddings.weight",
                      "pad_id": tok.pad_token_id, "mask_id": tok.mask_token_id, "special_ids": special,
                      "vocabulary": "vocab.txt", "attention_mask": "mask"}, "labels": hf.labels}
    clf = build(tmp_path / "model.pt2", spec)
    rows = [tok(t)["input_ids"] for t in ("the movie was good", "a dull plot but great acting")]
    report = explain(clf, _samples(rows, [2, 0]), ExportOptions(n_steps=STEPS, baseline="mask", precision="fp32"))
    lig = LayerIntegratedGradients(lambda i, m: model(input_ids=i, attention_mask=m).logits,
                                   model.get_input_embeddings())
    for row, target, rec in zip(rows, [2, 0], report["samples"], strict=True):
        ids = torch.tensor([row])
        base = torch.tensor([[t if t in special else tok.mask_token_id for t in row]])
        theirs = lig.attribute(ids, baselines=base, additional_forward_args=(torch.ones_like(ids),), target=target,
                               n_steps=STEPS)[0].sum(-1).double()
        scale = float(theirs.abs().max())
        assert scale > 1e-4
        np.testing.assert_allclose(rec["token_attributions"], theirs.numpy(), rtol=RTOL, atol=RTOL * scale)
        assert rec["tokens"][0] == "[CLS]" and rec["token_attributions"][0] == 0.0
