"""Classifiers brought as ``torch.export`` programs (``models.export``): the archive read as data, the service's
interpreter equal to the eager model it was exported from, IG equal to Captum's ``IntegratedGradients`` on the
input, and crafted archives refused or made harmless.

Each crafted archive is first shown to be a real attack where that can be shown (``torch.export.load`` runs its
payload), so that the refusal cannot pass vacuously.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from captum.attr import IntegratedGradients

from models.export.attribution import ExportOptions, TensorSample, baselines, explain, layout
from models.export.files import ProgramError, inspect_program
from models.export.program import ProgramRunError, build, dry_run
from models.export.spec import SpecError, check_spec
from tests.export_fixtures import (
    COLOUR_SPEC,
    IMAGE_SPEC,
    TABULAR_SPEC,
    colour_cnn,
    digit_cnn,
    edit_program,
    export,
    hostile_pickle,
    members,
    rewrite,
    tabular_net,
)

RTOL = 1e-5


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    models = {"image": (digit_cnn(), torch.randn(2, 1, 8, 8), IMAGE_SPEC),
              "colour": (colour_cnn(), torch.randn(2, 3, 12, 12), COLOUR_SPEC),
              "tabular": (tabular_net(), torch.randn(2, 6), TABULAR_SPEC)}
    out = {}
    for name, (model, example, spec) in models.items():
        path = export(model, example, root / f"{name}.pt2")
        out[name] = (model, path, spec, build(path, spec))
    return out


def _inputs(name: str, n: int = 5, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    shape = {"image": (1, 8, 8), "colour": (3, 12, 12), "tabular": (6,)}[name]
    return torch.randn((n, *shape), generator=g)


# ----------------------------------------------------------------------------------------- the interpreter
@pytest.mark.parametrize("name", ["image", "colour", "tabular"])
def test_the_interpreter_equals_the_eager_model_and_its_gradients(programs, name):
    model, _, _, clf = programs[name]
    for n in (1, 5, 33):  # the batch is dynamic
        x = _inputs(name, n)
        with torch.no_grad():
            torch.testing.assert_close(clf.logits(x), model(x), rtol=1e-6, atol=1e-6)
    x = _inputs(name).requires_grad_(True)
    (g_clf,) = torch.autograd.grad(clf.forward(x)[:, 1].sum(), x)
    y = x.detach().clone().requires_grad_(True)
    (g_eager,) = torch.autograd.grad(model(y)[:, 1].sum(), y)
    torch.testing.assert_close(g_clf, g_eager, rtol=1e-5, atol=1e-7)


def test_the_archive_is_described_as_data(programs):
    _, path, _, clf = programs["image"]
    info = inspect_program(path)
    assert [(i.name, i.dtype, i.shape) for i in info.inputs] == [("x", "float32", (None, 1, 8, 8))]
    assert info.outputs[0].shape == (None, 10)
    assert "aten.conv2d.default" in info.operators and "aten.sym_size.int" in info.operators
    assert info.parameters == sum(p.numel() for p in digit_cnn().parameters()) + 4 + 4 + 1 + 1  # + BN stats, shift
    assert clf.labels == IMAGE_SPEC["labels"] and clf.spec.mean == [0.3]


def test_the_dry_run_bounds_every_value(programs, tmp_path):
    _, path, spec, clf = programs["image"]
    assert dry_run(clf.info, clf.spec) == clf.elements_per_example > 64  # per example, counted without memory

    def huge(program):  # the reshape's leading size replaced by a 2**30 constant: a zeros-like blow-up
        for node in program["graph_module"]["graph"]["nodes"]:
            if node["target"] == "torch.ops.aten.relu.default":
                node["target"] = "torch.ops.aten.repeat.default"
                node["inputs"].append({"name": "repeats", "arg": {"as_ints": [1, 1, 1 << 15, 1 << 15]}, "kind": 1})
    bad = rewrite(path, tmp_path / "huge.pt2", edit_program(huge))
    with pytest.raises(ProgramRunError, match="most the service runs"):
        build(bad, spec)


# ------------------------------------------------------------------------------------------------ the oracle
@pytest.mark.parametrize(("name", "baseline"), [("image", "zero"), ("image", "blur"), ("image", "mean"),
                                                ("colour", "blur"), ("colour", "custom"), ("tabular", "zero"),
                                                ("tabular", "mean")])
@pytest.mark.parametrize("method", ["gausslegendre", "riemann_middle"])
def test_equals_captum_integrated_gradients(programs, name, baseline, method):
    model, _, _, clf = programs[name]
    x = _inputs(name)
    custom = np.full(tuple(x.shape[1:]), 0.2)
    opts = ExportOptions(n_steps=24, method=method, baseline=baseline, precision="fp32",
                         baseline_values=custom if baseline == "custom" else None)
    targets = [i % len(clf.labels) for i in range(x.shape[0])]
    report = explain(clf, [TensorSample(f"s{i}", x[i].numpy(), target=t) for i, t in enumerate(targets)], opts)
    b = baselines(clf, x, opts)
    theirs = IntegratedGradients(model).attribute(x, baselines=b, target=targets, n_steps=24, method=method)
    theirs = theirs.sum(1).reshape(x.shape[0], -1) if name != "tabular" else theirs  # per pixel or feature
    mine = torch.tensor([r["word_attributions"] for r in report["samples"]], dtype=torch.float32)
    scale = float(theirs.abs().max())
    torch.testing.assert_close(mine, theirs, rtol=RTOL, atol=RTOL * scale)
    for rec, t in zip(report["samples"], targets, strict=True):
        assert rec["target"] == {"index": t, "label": clf.labels[t], "source": "request"}


def test_records_heatmap_cells_features_and_targets(programs):
    _, _, _, img = programs["image"]
    _, _, _, tab = programs["tabular"]
    x = _inputs("image", 2)
    (rec, _) = explain(img, [TensorSample(f"s{i}", x[i].numpy()) for i in range(2)],
                       ExportOptions(n_steps=8))["samples"]
    assert rec["input"]["kind"] == "image" and rec["input"]["grid"] == [8, 8] and rec["input"]["patch"] == 1
    assert len(rec["words"]) == 64 and rec["words"][9] == "r1c1"
    assert rec["input"]["values"][9] == pytest.approx(float(x[0, 0, 1, 1]))
    assert rec["target"]["source"] == "predicted" and rec["predicted"]["index"] == rec["target"]["index"]
    t = _inputs("tabular", 1)
    (rec,) = explain(tab, [TensorSample("r", t[0].numpy(), target="leave")], ExportOptions(n_steps=8))["samples"]
    assert rec["words"] == TABULAR_SPEC["input"]["features"] and rec["target"]["index"] == 1
    assert rec["input"] == {"kind": "tabular", "shape": [6], "grid": None, "patch": None,
                            "values": pytest.approx(t[0].tolist())}


def test_a_large_image_is_drawn_in_patches():
    from models.export.spec import ModelSpec

    class Fake:
        spec = ModelSpec("image", "x", "float32", (3, 200, 130), ["a"])

    lay = layout(Fake())
    assert lay.patch == 4 and lay.grid == (50, 33)
    assert sorted(p for _, cell in lay.cells for p in cell) == list(range(200 * 130))  # every pixel once
    values = np.random.default_rng(0).normal(size=200 * 130)
    np.testing.assert_allclose(lay.cell_sums(values), [values[cell].sum() for _, cell in lay.cells], rtol=1e-12,
                               atol=1e-12)


def test_adaptive_reference_occlusion_and_faithfulness(programs):
    _, _, _, clf = programs["colour"]
    x = _inputs("colour", 4)
    samples = [TensorSample(f"s{i}", x[i].numpy()) for i in range(4)]
    adaptive = explain(clf, samples, ExportOptions(n_steps=256, tolerance=1e-3, baseline="blur"))
    assert adaptive["summary"]["tolerance_met"] is True
    assert all(r["relative_delta"] <= 1e-3 for r in adaptive["samples"])
    ref = explain(clf, samples, ExportOptions(n_steps=8, optimized=False))
    fast = explain(clf, samples, ExportOptions(n_steps=8, precision="fp32"))
    for r, f in zip(ref["samples"], fast["samples"], strict=True):
        np.testing.assert_allclose(r["word_attributions"], f["word_attributions"], rtol=1e-5, atol=1e-7)
    occ = explain(clf, samples, ExportOptions(method="occlusion"))
    assert occ["summary"]["n_steps"] is None
    faith = explain(clf, samples, ExportOptions(n_steps=8, faithfulness=True, faithfulness_seed=2))
    assert faith["faithfulness"]["n_samples"] == 4 and set(faith["faithfulness"]["orders"]) == {
        "ig", "random", "occlusion"}
    for rec in faith["samples"]:
        f = rec["faithfulness"]
        assert f["n_words"] == 144
        assert f["orders"]["ig"]["deletion"][0] == pytest.approx(rec["score"], rel=1e-5)  # nothing deleted yet
        assert f["orders"]["ig"]["insertion"][0] == pytest.approx(rec["baseline_score"], rel=1e-5, abs=1e-6)


def test_wrong_shapes_and_unknown_targets_become_errors(programs):
    _, _, _, clf = programs["tabular"]
    report = explain(clf, [TensorSample("ok", np.zeros(6)), TensorSample("short", np.zeros(5)),
                           TensorSample("nan", np.full(6, np.nan)), TensorSample("cls", np.zeros(6), target="x")],
                     ExportOptions(n_steps=4))
    assert [r["id"] for r in report["samples"]] == ["ok"]
    assert {e["id"] for e in report["errors"]} == {"short", "nan", "cls"}


# --------------------------------------------------------------------------------------------- the spec
def test_the_spec_must_agree_with_the_program(programs, tmp_path):
    _, path, _, _ = programs["image"]
    info = inspect_program(path)
    for spec, field, says in [
        ({"input": {"kind": "image", "shape": ["batch", 3, 8, 8]}}, ("input", "shape"), "has shape"),
        ({"input": {"kind": "image", "name": "pixels"}}, ("input", "name"), "named 'x'"),
        ({"input": {"kind": "tabular"}}, ("input", "kind"), "tabular input is"),
        ({"input": {"kind": "image"}, "labels": ["a", "b"]}, ("labels",), "list of 10"),
        ({"input": {"kind": "image", "mean": [0.1, 0.2]}}, ("input", "mean"), "one per channel"),
        ({"input": {"kind": "audio"}}, ("input", "kind"), "one of"),
        ({"input": {"kind": "image"}, "extra": 1}, ("extra",), "unknown spec field"),
    ]:
        with pytest.raises(SpecError, match=says) as err:
            check_spec(spec, info)
        assert err.value.field == field
    assert check_spec({"input": {"kind": "image", "shape": ["batch", 1, 8, 8], "dtype": "float32"}},
                      info).labels == [str(i) for i in range(10)]


def test_token_ids_and_a_static_batch_are_refused_with_the_way_out(tmp_path):
    class Ids(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(20, 4)
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, ids):
            return self.fc(self.emb(ids).mean(1))

    ids = export(Ids().eval(), torch.randint(0, 20, (2, 5)), tmp_path / "ids.pt2")
    with pytest.raises(SpecError, match="embedding table") as err:
        check_spec({"input": {"kind": "tabular"}}, inspect_program(ids))
    assert err.value.field == ("input", "dtype")
    static = export(tabular_net(), torch.randn(2, 6), tmp_path / "static.pt2", dynamic=False)
    with pytest.raises(SpecError, match="dynamic batch"):
        check_spec(TABULAR_SPEC, inspect_program(static))


# --------------------------------------------------------------------------------------- crafted archives
def test_a_hostile_sample_inputs_pickle_is_never_opened(programs, tmp_path):
    _, path, spec, _ = programs["tabular"]
    marker = tmp_path / "pwned-sample-inputs"
    name = next(n for n in members(path) if "sample_inputs" in n)
    bad = rewrite(path, tmp_path / "sample.pt2", lambda files: {**files, name: hostile_pickle(marker)})
    with pytest.raises(Exception):  # noqa: B017 - the attack is real: torch's own loader unpickles it, then fails
        torch.export.load(str(bad))
    assert marker.exists()
    marker.unlink()
    clf = build(bad, spec)  # the service's loader never reads the member
    assert not marker.exists()
    assert clf.logits(torch.zeros(1, 6)).shape == (1, 3)


def test_guards_code_and_symbolic_expressions_are_never_run(programs, tmp_path):
    _, path, spec, _ = programs["image"]
    marker = tmp_path / "pwned-guards"
    code = f"open({str(marker)!r}, 'w') is None"

    def poison(program):
        program["guards_code"] = [code]
        for meta in program["graph_module"]["graph"]["tensor_values"].values():
            for size in meta["sizes"]:
                if "as_expr" in size:
                    size["as_expr"]["expr_str"] = f"__import__('builtins').open({str(marker)!r}, 'w')"

    bad = rewrite(path, tmp_path / "guards.pt2", edit_program(poison))
    with pytest.raises(Exception):  # noqa: B017 - torch's loader evaluates the expression (and fails after it)
        torch.export.load(str(bad)).module()
    assert marker.exists()
    marker.unlink()
    clf = build(bad, spec)
    assert clf.logits(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
    assert not marker.exists()


def test_a_pickled_weight_is_refused(programs, tmp_path):
    _, path, _, _ = programs["image"]

    def pickled(files):
        name = next(n for n in files if n.endswith("_weights_config.json"))
        config = json.loads(files[name])
        fqn = next(iter(config["config"]))
        config["config"][fqn]["use_pickle"] = True
        return {**files, name: json.dumps(config).encode()}

    with pytest.raises(ProgramError, match="pickle, which the service never opens"):
        inspect_program(rewrite(path, tmp_path / "pickled.pt2", pickled))


@pytest.mark.parametrize(("target", "says"), [
    ("torch.ops.evil.run.default", "not an ATen operator"),
    ("torch.ops.aten.from_file.default", "does not run"),
    ("torch.ops.higher_order.cond", "higher-order"),
    ("builtins.exec", "not an ATen operator"),
    ("torch.ops.aten.relu.default.__call__", "does not run"),
])
def test_an_unknown_or_custom_operator_is_refused(programs, tmp_path, target, says):
    _, path, _, _ = programs["image"]

    def swap(program):
        program["graph_module"]["graph"]["nodes"][0]["target"] = target

    with pytest.raises(ProgramError, match=says):
        inspect_program(rewrite(path, tmp_path / "op.pt2", edit_program(swap)))


@pytest.mark.parametrize(("change", "says"), [
    (lambda f: {**f, "../evil": b"x"}, "outside one top folder"),
    (lambda f: {**f, next(iter(f)).split("/")[0] + "/data/aotinductor/model/model.so": b"\x7fELF"},
     "compiled code"),
    (lambda f: {k: (b"zip" if k.endswith("archive_format") else v) for k, v in f.items()}, "archive_format"),
    (lambda f: {k: (v[:4] if k.endswith("weight_4") else v) for k, v in f.items()}, "past the end"),
    (lambda f: {k: v for k, v in f.items() if "/models/" not in k}, "holds 0 programs"),
    (edit_program(lambda p: p["schema_version"].update(major=3)), "schema version 3"),
    (edit_program(lambda p: p["graph_module"]["graph"]["nodes"][0]["inputs"][0].update(
        arg={"as_graph": {"graph": {}, "name": "g"}})), "sub-graph"),
    (edit_program(lambda p: p["graph_module"]["signature"]["output_specs"].append(
        {"buffer_mutation": {"arg": {"name": "x"}, "buffer_name": "shift"}})), "mutates a buffer"),
])
def test_malformed_archives_are_refused(programs, tmp_path, change, says):
    _, path, _, _ = programs["image"]
    with pytest.raises(ProgramError, match=says):
        inspect_program(rewrite(path, tmp_path / "bad.pt2", change))


def test_not_a_zip_is_refused(tmp_path):
    bad = tmp_path / "model.pt2"
    bad.write_bytes(b"\x80\x04not a zip")
    with pytest.raises(ProgramError, match="not a zip archive"):
        inspect_program(bad)


@pytest.mark.parametrize("name", ["colour", "tabular"])
def test_the_adaptive_stop_meets_the_tolerance_on_every_token(programs, name):
    """The per-token stop: every token's attribution within the tolerance (of the sample's largest attribution)
    of a 1024-step Gauss-Legendre reference, not only the sum; no sample stops at its first level."""
    from models.explain.ig import integrated_gradients
    from models.export.attribution import build_batch, layout, prepare

    _, _, _, clf = programs[name]
    x = _inputs(name, 6)
    samples = [TensorSample(f"s{i}", x[i].numpy()) for i in range(6)]
    tol = 1e-3
    report = explain(clf, samples, ExportOptions(n_steps=256, tolerance=tol, precision="fp32", baseline="zero"))
    assert report["summary"]["tolerance_met"] is True
    assert report["summary"]["max_token_error"] <= tol
    lay = layout(clf)
    batch, _, _ = build_batch(clf, prepare(clf, samples, []), ExportOptions(), lay)
    batch.targets = torch.tensor([r["target"]["index"] for r in report["samples"]])
    ref = integrated_gradients(batch.forward, batch.x, batch.base, n_steps=1024, method="gausslegendre")
    ref_cells = ref.attributions.sum(-1).double().numpy()
    for j, rec in enumerate(report["samples"]):
        assert rec["n_steps"]["input"] > 16 and rec["token_error"]["input"] <= tol
        want = lay.cell_sums(ref_cells[j])
        err = np.abs(np.asarray(rec["word_attributions"]) - want).max() / np.abs(want).max()
        assert err <= tol, (rec["id"], err)
