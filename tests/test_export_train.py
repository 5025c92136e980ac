"""Training exported classifiers (``models.export.train``, ``POST /train/classifier``) and the digits demo.

Training through the service's interpreter equals training the eager model the program was exported from (same
initial weights, data order and optimizer), element-wise; the written archives (final and checkpoints) load with
exactly the trained weights; the service registers a ``tensors`` dataset, trains, registers the result with its
checkpoints, and the trained model is explained like any other; the digits demo learns its task.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from models.export.program import build, load
from models.export.train import Split, TrainOptions, parameters, save_model, train
from tests.export_fixtures import IMAGE_SPEC, digit_cnn, export


def _data(n: int = 96, seed: int = 0) -> Split:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((n, 1, 8, 8), generator=g)
    y = (x[:, 0, :4].sum((1, 2)) > x[:, 0, 4:].sum((1, 2))).long() + 2 * (x[:, 0, :, :4].mean((1, 2)) > 0).long()
    return Split(x, y)


def _eager_train(model: torch.nn.Module, data: Split, opts: TrainOptions) -> torch.nn.Module:
    """The reference: the eager model (eval mode, as exported) trained with the same order and optimizer."""
    params = list(model.parameters())
    optim = (torch.optim.Adam(params, lr=opts.lr, weight_decay=opts.weight_decay) if opts.optimizer == "adam"
             else torch.optim.SGD(params, lr=opts.lr, momentum=opts.momentum, weight_decay=opts.weight_decay))
    gen = torch.Generator().manual_seed(opts.seed)
    n = data.labels.shape[0]
    for _ in range(opts.epochs):
        order = torch.randperm(n, generator=gen)
        for k in range(0, n, opts.batch_size):
            idx = order[k:k + opts.batch_size]
            loss = torch.nn.functional.cross_entropy(model(data.inputs[idx]), data.labels[idx])
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
    return model


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_training_through_the_interpreter_equals_training_the_eager_model(tmp_path, optimizer):
    model = digit_cnn(seed=3)
    path = export(model, torch.randn(2, 1, 8, 8), tmp_path / "m.pt2")
    clf = build(path, IMAGE_SPEC)
    opts = TrainOptions(epochs=2, batch_size=16, lr=0.05 if optimizer == "sgd" else 0.01, optimizer=optimizer,
                        weight_decay=1e-3, seed=5)
    data = _data()
    trained = train(clf, data, opts)
    eager = _eager_train(model, data, opts)
    ours = parameters(clf)
    for name, p in eager.named_parameters():
        torch.testing.assert_close(ours[name], p.detach(), rtol=1e-5, atol=1e-6)
    assert [h["epoch"] for h in trained.history] == [1, 2] and trained.history[1]["loss"] < trained.history[0]["loss"]
    # buffers (batch-norm statistics) stay as exported: the program is in eval mode
    torch.testing.assert_close(clf.program.state_tensor("b_bn_running_mean"), digit_cnn(seed=3).bn.running_mean)


def test_written_archives_hold_exactly_the_trained_weights(tmp_path):
    clf = build(export(digit_cnn(seed=1), torch.randn(2, 1, 8, 8), tmp_path / "m.pt2"), IMAGE_SPEC)
    trained = train(clf, _data(), TrainOptions(epochs=3, batch_size=32, checkpoint_every=2))
    listed = save_model(tmp_path / "out", clf, trained)
    assert listed == [{"file": "checkpoints/epoch-2.pt2", "epoch": 2, "lr": 0.05},
                      {"file": "checkpoints/epoch-3.pt2", "epoch": 3, "lr": 0.05}]
    assert json.loads((tmp_path / "out" / "checkpoints.json").read_text()) == listed
    again = load(tmp_path / "out")
    x = _data(10, seed=9).inputs
    torch.testing.assert_close(again.logits(x), clf.logits(x), rtol=0, atol=0)
    at2 = build(tmp_path / "out" / "checkpoints" / "epoch-2.pt2", IMAGE_SPEC)
    for fqn, t in trained.checkpoints[0][2].items():
        torch.testing.assert_close(parameters(at2)[fqn], t, rtol=0, atol=0)
    assert not torch.equal(parameters(at2)["fc.weight"], parameters(clf)["fc.weight"])


def test_labels_outside_the_models_classes_are_refused(tmp_path):
    clf = build(export(digit_cnn(), torch.randn(2, 1, 8, 8), tmp_path / "m.pt2"), IMAGE_SPEC)
    with pytest.raises(ValueError, match="class indices 0..9"):
        train(clf, Split(torch.zeros(4, 1, 8, 8), torch.tensor([0, 1, 2, 10])), TrainOptions(epochs=1))


# ------------------------------------------------------------------------------------------------ the service
def _write_tensors(directory: Path, data: Split, valid: Split | None = None) -> Path:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file({"inputs": data.inputs.contiguous(), "labels": data.labels}, str(directory / "train.safetensors"))
    if valid is not None:
        save_file({"inputs": valid.inputs.contiguous(), "labels": valid.labels}, str(directory / "valid.safetensors"))
    return directory


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    from tests.export_fixtures import save_model_dir
    from tests.service import Service

    home = tmp_path_factory.mktemp("train-clf") / "home"
    data = home / "data"
    save_model_dir(data / "cnn", "image", seed=0)
    save_model_dir(data / "tab", "tabular", seed=0)
    _write_tensors(data / "blocks", _data(128), _data(64, seed=1))
    _write_tensors(data / "wide", Split(torch.zeros(8, 1, 6, 6), torch.zeros(8, dtype=torch.long)))
    (data / "nolabels").mkdir()
    from safetensors.torch import save_file

    save_file({"inputs": torch.zeros(4, 1, 8, 8)}, str(data / "nolabels" / "train.safetensors"))
    with Service(home, heartbeat_ttl_s=30) as service:
        for name, path in (("cnn", "cnn"), ("tab", "tab")):
            r = service.client.post("/models/import", json={"name": name, "kind": "export", "path": path})
            assert r.status_code == 202, r.text
            assert service.wait(r.json()["id"], timeout_s=120)["status"] == "succeeded", service.worker_logs()
        yield service


def test_a_tensors_dataset_registers_with_its_counts(svc):
    r = svc.client.post("/datasets", json={"name": "blocks", "path": "blocks"})
    assert r.status_code == 201, r.text
    assert r.json()["kind"] == "tensor_classification" and r.json()["format"] == "tensors"
    assert r.json()["counts"] == {"train": 128, "valid": 64, "input_shape": [1, 8, 8]}
    r = svc.client.post("/datasets", json={"name": "nolabels", "path": "nolabels"})
    assert r.status_code == 422 and "'inputs' and 'labels'" in r.json()["detail"][0]["msg"]


def test_train_register_and_explain(svc):
    r = svc.client.post("/train/classifier", json={"name": "cnn-trained", "model": "cnn", "dataset": "blocks",
                                                   "epochs": 3, "batch_size": 16, "lr": 0.01, "checkpoint_every": 2})
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=300)
    assert job["status"] == "succeeded", (job.get("error"), svc.worker_logs()[-3000:])
    result = svc.client.get(f"/jobs/{r.json()['id']}/result").json()
    assert result["model"] == "cnn-trained" and result["started_from"] == "cnn"
    assert result["examples"] == {"train": 128, "valid": 64}
    assert [c["epoch"] for c in result["checkpoints"]] == [2, 3]
    assert [h["epoch"] for h in result["history"]] == [1, 2, 3] and result["steps"]
    assert result["history"][-1]["loss"] < result["history"][0]["loss"]
    assert result["accuracy"]["train"] == pytest.approx(result["history"][-1]["train_accuracy"])
    assert result["accuracy"]["valid"] == pytest.approx(result["history"][-1]["valid_accuracy"])
    listed = {m["name"]: m for m in svc.client.get("/models").json()["models"]}
    assert listed["cnn-trained"]["kind"] == "exported_classifier"
    r = svc.client.post("/attributions", json={"model": "cnn-trained", "n_steps": 8,
                                               "inputs": [{"id": "a", "values": np.zeros((1, 8, 8)).tolist()}],
                                               "baseline": "mean"})
    assert r.status_code == 202, r.text
    assert svc.wait(r.json()["id"], timeout_s=120)["status"] == "succeeded"


def test_a_dataset_too_large_for_a_worker_or_too_long_a_run_is_refused(svc):
    from core import registry

    data = svc.settings.data_roots[0] / "blocks"
    registry.register_dataset(svc.settings, "huge", kind="tensor_classification", path=data,
                              meta={"format": "tensors", "counts": {"train": 10**8, "input_shape": [1, 8, 8]}})
    registry.register_dataset(svc.settings, "long", kind="tensor_classification", path=data,
                              meta={"format": "tensors", "counts": {"train": 2 * 10**6, "input_shape": [1, 8, 8]}})
    r = svc.client.post("/train/classifier", json={"name": "x", "model": "cnn", "dataset": "huge"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "dataset"]
    assert "worker memory" in r.json()["detail"][0]["msg"]
    r = svc.client.post("/train/classifier", json={"name": "x", "model": "cnn", "dataset": "long", "epochs": 600})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "epochs"]
    assert "example steps" in r.json()["detail"][0]["msg"]


@pytest.mark.parametrize(("body", "loc", "says"), [
    ({"model": "tab", "dataset": "blocks"}, ("body", "dataset"), "takes [6]"),
    ({"model": "cnn", "dataset": "wide"}, ("body", "dataset"), "[1, 6, 6] per example"),
    ({"model": "cnn", "dataset": "nope"}, ("body", "dataset"), "unknown dataset"),
    ({"model": "nope", "dataset": "blocks"}, ("body", "model"), "nope"),
    ({"model": "cnn", "dataset": "blocks", "epochs": 10**6}, ("body", "epochs"), "less than or equal"),
])
def test_what_training_cannot_take_is_a_422_naming_the_field(svc, body, loc, says):
    r = svc.client.post("/train/classifier", json={"name": "x", **body})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert tuple(detail["loc"]) == loc and says in detail["msg"], detail


def test_the_digits_demo_learns_its_task(tmp_path):
    from core import registry
    from tests.service import Service
    from workers.jobs.train_classifier import DEMO_DATASET, DEMO_MODEL, prepare_demo

    service = Service(tmp_path / "home", start=False)
    try:
        # the Vision-BDH demo's "digits" (image_classification) is prepared first at a first start: no clash
        from workers.jobs.train_bdh import prepare_demo as prepare_vision

        prepare_vision(service.settings, progress=False)
        assert registry.get_dataset(service.settings, "digits")["kind"] == "image_classification"
        prepare_demo(service.settings, progress=False)
        entry = registry.get_model(service.settings, DEMO_MODEL)
        assert entry["kind"] == "exported_classifier" and entry["meta"]["accuracy"]["test"] >= 0.9
        assert registry.get_dataset(service.settings, DEMO_DATASET)["meta"]["counts"]["train"] == 1200
        assert len(entry["meta"]["checkpoints"]) == 4
        created = entry["created_at"]
        prepare_demo(service.settings, progress=False)  # idempotent: kept as registered
        assert registry.get_model(service.settings, DEMO_MODEL)["created_at"] == created
        _demo_equals_captum(load(registry.local_path(service.settings, entry)))
    finally:
        service.stop()


def _demo_equals_captum(clf) -> None:
    """The oracle on the demo: explainq's IG of the trained digits CNN equals Captum's IntegratedGradients on the
    eager DigitsCNN given the program's weights (same inputs, targets, baseline, steps and rule)."""
    from captum.attr import IntegratedGradients

    from models.export.attribution import ExportOptions, TensorSample, baselines, explain
    from models.export.demo import DigitsCNN, digits_arrays

    eager = DigitsCNN().eval()
    eager.load_state_dict(parameters(clf))
    x = torch.as_tensor(digits_arrays()["test"][0][:6])
    targets = [int(t) for t in digits_arrays()["test"][1][:6]]
    opts = ExportOptions(n_steps=32, baseline="mean", precision="fp32")
    report = explain(clf, [TensorSample(f"t{i}", x[i].numpy(), target=t) for i, t in enumerate(targets)], opts)
    theirs = IntegratedGradients(eager).attribute(x, baselines=baselines(clf, x, opts), target=targets,
                                                  n_steps=32, method="gausslegendre").sum(1).reshape(6, -1)
    mine = torch.tensor([r["word_attributions"] for r in report["samples"]], dtype=torch.float32)
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5 * float(theirs.abs().max()))


def test_the_digits_demo_refuses_a_dataset_of_its_name_and_another_kind(tmp_path):
    from core import registry
    from tests.service import Service
    from workers.jobs.train_classifier import DEMO_DATASET, DEMO_MODEL, prepare_demo

    service = Service(tmp_path / "home", start=False)
    try:
        other = tmp_path / "home" / "data" / "kg"
        other.mkdir(parents=True)
        (other / "train.txt").write_text("a\tr\tb\n")
        registry.register_dataset(service.settings, DEMO_DATASET, kind="triples", path=other)
        with pytest.raises(ValueError, match="registered with kind 'triples'"):
            prepare_demo(service.settings, progress=False)
        assert registry.get_model(service.settings, DEMO_MODEL) is None
    finally:
        service.stop()
