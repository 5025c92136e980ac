"""TracIn-CP on exported classifiers (``models.export.influence``, ``POST /tracin/classifier``): per-example
gradients through the interpreter equal a loop of ``torch.autograd.grad``; the scores and self-influence equal
Captum's ``TracInCP`` on the eager model with the same checkpoints; through the service, the lists are the dense
scores' top-k, mislabelled training examples rank high on self-influence, and what it cannot take is a 422 naming
the field."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest
import torch

from models.export.demo import DIGITS_LABELS, DigitsCNN, digits_arrays, digits_program
from models.export.program import build, load
from models.export.train import Split, save_model, train
from models.training import TrainOptions
from tests.browser import BROWSER_MARKS
from tests.test_ui_browser_analysis import show as show  # noqa: PLC0414 - the page fixture, used by name


def _trained(tmp_path, n: int = 160, epochs: int = 3):
    """The digits CNN trained on ``n`` digits with a checkpoint per epoch, saved as the service saves it."""
    init = digits_program(tmp_path / "init")
    clf = build(init / "model.pt2", {"input": {"kind": "image", "mean": [0.3]}, "labels": DIGITS_LABELS})
    a = digits_arrays()
    data = Split(torch.tensor(a["train"][0][:n]), torch.tensor(a["train"][1][:n]))
    trained = train(clf, data, TrainOptions(epochs=epochs, batch_size=32, lr=0.05, checkpoint_every=1))
    save_model(tmp_path / "out", clf, trained)
    return tmp_path / "out", data


def test_per_example_gradients_through_the_interpreter_equal_an_autograd_loop(tmp_path):
    from models.explain.gradients import per_example_gradients
    from models.export.influence import ProgramModule, loss_of, rows

    out, data = _trained(tmp_path, n=40, epochs=1)
    module = ProgramModule(load(out))
    names = [n for n, _ in module.named_parameters()]
    x, y = data.inputs[:6], data.labels[:6]
    got = per_example_gradients(module, names, loss_of(module.shape), rows(x, y))
    for i in range(6):
        loss = torch.nn.functional.cross_entropy(module(x[i:i + 1]), y[i:i + 1])
        want = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(module.parameters()))])
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-7)


def test_tracin_equals_captums_tracincp_on_the_eager_model(tmp_path):
    from captum.influence import TracInCP

    from models.explain.tracin import FuncGradients, TracIn
    from models.export.influence import ProgramModule, loss_of, read_checkpoints, rows
    from models.export.train import parameters

    out, data = _trained(tmp_path, n=48, epochs=3)
    module = ProgramModule(load(out))
    ckpts = read_checkpoints(out, module)
    assert [c["epoch"] for c in ckpts.listed] == [1, 2, 3]
    test_x, test_y = torch.tensor(digits_arrays()["test"][0][:5]), torch.tensor(digits_arrays()["test"][1][:5])
    engine = TracIn(FuncGradients(module, loss_of(module.shape)), ckpts.states, batch_size=16)
    mine, mine_self = engine.influence(rows(test_x, test_y), rows(data.inputs, data.labels))
    train_self = engine.self_influence(rows(data.inputs, data.labels))

    paths, lrs = [], {}
    for c in ckpts.listed:  # the same checkpoints as eager state dicts, with their learning rates
        path = str(tmp_path / f"eager-{c['epoch']}.pt")
        torch.save(parameters(build(out / c["file"], {"input": {"kind": "image", "mean": [0.3]},
                                                      "labels": DIGITS_LABELS})), path)
        paths.append(path)
        lrs[path] = c["lr"]

    def load_checkpoint(model, path):
        model.load_state_dict(torch.load(path, weights_only=True))
        return lrs[path]

    theirs = TracInCP(DigitsCNN(), torch.utils.data.TensorDataset(data.inputs, data.labels), paths,
                      checkpoints_load_func=load_checkpoint,
                      loss_fn=torch.nn.CrossEntropyLoss(reduction="none"), batch_size=8)
    want = theirs.influence((test_x, test_y))
    scale = float(want.abs().max())
    torch.testing.assert_close(mine, want, rtol=1e-4, atol=1e-5 * scale)
    want_self = theirs.self_influence()
    torch.testing.assert_close(train_self, want_self, rtol=1e-4, atol=1e-5 * float(want_self.abs().max()))
    assert mine_self.shape == (5,)


# ---------------------------------------------------------------------------------------------------- service
FLIPPED = 12  # training examples whose label is wrong on purpose


def _write(directory, split: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    for name, (x, y) in split.items():
        save_file({"inputs": torch.tensor(x).contiguous(), "labels": torch.tensor(y)},
                  str(directory / f"{name}.safetensors"))


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    from tests.service import Service

    home = tmp_path_factory.mktemp("clf-influence") / "home"
    data = home / "data"
    a = digits_arrays()
    x, y = a["train"][0][:240], a["train"][1][:240].copy()
    y[:FLIPPED] = (y[:FLIPPED] + 1 + np.arange(FLIPPED) % 9) % 10  # the first FLIPPED get another class
    _write(data / "digits-noisy", {"train": (x, y), "test": (a["test"][0][:40], a["test"][1][:40])})
    program = digits_program(data / "cnn")
    (program / "spec.json").write_text('{"input": {"kind": "image", "mean": [0.3]}, "labels": '
                                        + str(DIGITS_LABELS).replace("'", '"') + "}")
    with Service(home, heartbeat_ttl_s=30) as service:
        r = service.client.post("/models/import", json={"name": "cnn", "kind": "export", "path": "cnn"})
        assert r.status_code == 202, r.text
        assert service.wait(r.json()["id"], timeout_s=120)["status"] == "succeeded", service.worker_logs()
        r = service.client.post("/datasets", json={"name": "digits-noisy", "path": "digits-noisy"})
        assert r.status_code == 201, r.text
        r = service.client.post("/train/classifier", json={"name": "cnn-noisy", "model": "cnn",
                                                           "dataset": "digits-noisy", "epochs": 4, "batch_size": 32,
                                                           "lr": 0.05, "checkpoint_every": 2})
        assert r.status_code == 202, r.text
        assert service.wait(r.json()["id"], timeout_s=300)["status"] == "succeeded", service.worker_logs()
        yield service


def _run(svc, body: dict) -> dict:
    r = svc.client.post("/tracin/classifier", json=body)
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=300)
    assert job["status"] == "succeeded", (job.get("error"), svc.worker_logs()[-3000:])
    return svc.client.get(f"/jobs/{job['id']}/result").json() | {"id": job["id"]}


def _artifact(svc, job_id: str, name: str) -> list[dict[str, str]]:
    r = svc.client.get(f"/jobs/{job_id}/artifacts/{name}")
    assert r.status_code == 200, r.text
    return list(csv.DictReader(io.StringIO(r.text)))


def test_mode_test_lists_the_dense_scores_top_k(svc, tmp_path):
    from core import registry
    from models.explain.tracin import FuncGradients, TracIn
    from models.export.influence import ProgramModule, loss_of, read_checkpoints, rows
    from models.export.train import read_split

    result = _run(svc, {"model": "cnn-noisy", "test_indices": [0, 3, 7], "top_k": 5})
    assert result["dataset"] == "digits-noisy" and result["train_examples"] == 240
    assert [c["epoch"] for c in result["checkpoints"]] == [2, 4]
    assert [t["id"] for t in result["tests"]] == ["test[0]", "test[3]", "test[7]"]
    # the oracle: the dense scores of the same engine, sorted
    source = registry.local_path(svc.settings, registry.get_model(svc.settings, "cnn-noisy"))
    module = ProgramModule(load(source))
    engine = TracIn(FuncGradients(module, loss_of(module.shape)), read_checkpoints(source, module).states)
    data = svc.settings.data_roots[0] / "digits-noisy"
    train_split, test_split = read_split(data / "train.safetensors"), read_split(data / "test.safetensors")
    idx = torch.tensor([0, 3, 7])
    scores, _ = engine.influence(rows(test_split.inputs[idx], test_split.labels[idx]),
                                 rows(train_split.inputs, train_split.labels))
    for i, test in enumerate(result["tests"]):
        assert test["target"] == DIGITS_LABELS[int(test_split.labels[idx[i]])]
        want = torch.argsort(scores[i], descending=True, stable=True)[:5].tolist()
        assert [p["index"] for p in test["proponents"]] == want
        assert [p["score"] for p in test["proponents"]] == pytest.approx(scores[i, want].tolist(), rel=1e-5)
        assert test["n_positive"] + test["n_negative"] <= 240
    listed = _artifact(svc, result["id"], "influence.csv")
    assert len(listed) == sum(len(t["proponents"]) + len(t["opponents"]) for t in result["tests"])
    _check_page(svc, result)


def _check_page(svc, result: dict) -> str:
    """The job page draws every listed example: a thumbnail with its index, label and score as text."""
    from app.ui.views import signed

    page = svc.client.get(f"/ui/jobs/{result['id']}")
    assert page.status_code == 200, page.text
    html = page.text
    for test in result["tests"]:
        assert f'<span class="mono">{test["id"]}</span>' in html
        for e in [*test["proponents"], *test["opponents"]]:
            assert f'data-index="{e["index"]}"' in html and signed(e["score"], 4) in html
    listed = sum(len(t["proponents"]) + len(t["opponents"]) for t in result["tests"])
    assert html.count('class="example"') == listed and html.count('class="thumb"') == listed + len(result["tests"])
    return html


def test_the_sdk_reads_the_result_as_rows_and_draws_it(svc):
    from explainq_client import ClassifierInfluenceResult
    from explainq_client.results import CLASSIFIER_INFLUENCE_COLUMNS, make_result

    data = _run(svc, {"model": "cnn-noisy", "test_indices": [1], "top_k": 3})
    result = make_result("classifier_influence", data, "classifier_influence")
    assert isinstance(result, ClassifierInfluenceResult)
    rows = result.rows()
    test = data["tests"][0]
    assert [(r["role"], r["rank"], r["index"]) for r in rows] == \
        [("proponent", i, e["index"]) for i, e in enumerate(test["proponents"], 1)] + \
        [("opponent", i, e["index"]) for i, e in enumerate(test["opponents"], 1)]
    frame = result.to_pandas()
    assert list(frame.columns) == CLASSIFIER_INFLUENCE_COLUMNS and len(frame) == len(rows)
    html = result._repr_html_()
    assert html.count("display:inline-grid") == 1 + len(rows)  # the test image and every listed one
    assert test["proponents"][0]["label"] in result.text()


def _dense_trak(source, train, test_x, test_y, proj_dim: int, damping: float, seed: int,
                projection: str = "kronecker"):
    """The float64 reference (TRAK's Algorithm 1, the checkpoints as its models): per checkpoint c every per-example
    margin gradient by autograd, the explicit projection matrix of c's own seed (the documented derivation, restated
    here), the damped Gauss-Newton inverse solved densely; the kernels averaged over the checkpoints, columns times
    1 - p(label) averaged over the checkpoints, each at its own weights."""
    import hashlib

    from models.explain.gradients import classification_margin
    from models.explain.trak import projection_matrix
    from models.export.influence import ProgramModule, read_checkpoints

    module = ProgramModule(load(source)).double()
    shapes = {n: tuple(p.shape) for n, p in module.named_parameters()}

    def grads(x, y):
        out = []
        for i in range(len(x)):
            value = classification_margin(module(x[i:i + 1].double()), y[i:i + 1])
            out.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(value, list(module.parameters()))]))
        return torch.stack(out)

    total, q = 0, 0
    states = read_checkpoints(source, ProgramModule(load(source))).states
    for c, ck in enumerate(states):
        digest = hashlib.sha256(f"trak|{seed}|model 0|checkpoint {c}".encode()).digest()
        proj = projection_matrix(shapes, proj_dim, int.from_bytes(digest[:8], "little") & (2**63 - 1),
                                 projection=projection)
        module.load_state_dict({k: v.double() for k, v in ck.state.items()})
        phi, phi_t = grads(train.inputs, train.labels) @ proj, grads(test_x, test_y) @ proj
        gram = phi.t() @ phi
        lam = damping * float(torch.trace(gram)) / proj_dim
        total = total + phi_t @ torch.linalg.solve(gram + lam * torch.eye(proj_dim, dtype=torch.float64), phi.t())
        with torch.no_grad():
            probs = torch.softmax(module(train.inputs.double()), 1)
        q = q + 1 - probs[torch.arange(len(train.labels)), train.labels]
    return total / len(states) * (q / len(states))[None]


def test_trak_equals_a_dense_float64_reference(svc):
    from core import registry
    from models.export.train import read_split

    result = _run(svc, {"model": "cnn-noisy", "test_indices": [4, 9], "top_k": 5, "estimator": "trak",
                        "proj_dim": 64, "damping": 0.05, "seed": 3})
    assert result["estimator"] == "trak" and result["output"] == "margin" and result["proj_dim"] == 64
    source = registry.local_path(svc.settings, registry.get_model(svc.settings, "cnn-noisy"))
    data = svc.settings.data_roots[0] / "digits-noisy"
    train, test = read_split(data / "train.safetensors"), read_split(data / "test.safetensors")
    idx = torch.tensor([4, 9])
    want = _dense_trak(source, train, test.inputs[idx], test.labels[idx], 64, 0.05, 3)
    for i, t in enumerate(result["tests"]):
        order = torch.argsort(want[i], descending=True, stable=True)[:5].tolist()
        assert [e["index"] for e in t["proponents"]] == order
        scale = float(want[i].abs().max())
        assert [e["score"] for e in t["proponents"]] == pytest.approx(want[i, order].tolist(), abs=1e-4 * scale)
        assert t["self_influence"] is None and t["n_positive"] == int((want[i] > 0).sum())
    ranked = _run(svc, {"model": "cnn-noisy", "mode": "self", "estimator": "trak", "top_k": 240})
    scores = {e["index"]: e["score"] for e in ranked["self_influence"]}
    from sklearn.metrics import roc_auc_score

    auc = roc_auc_score([1 if i < FLIPPED else 0 for i in range(240)], [scores[i] for i in range(240)])
    print(f"TRAK self-influence AUC of the {FLIPPED} flipped labels: {auc:.3f}")
    assert auc >= 0.7, auc


def test_trak_with_a_dense_projection_equals_the_reference_with_that_matrix(svc):
    from core import registry
    from models.export.train import read_split

    result = _run(svc, {"model": "cnn-noisy", "test_indices": [4], "top_k": 5, "estimator": "trak",
                        "proj_dim": 32, "damping": 0.05, "seed": 3, "projection": "dense"})
    assert result["projection"] == "dense" and result["proj_dim"] == 32
    source = registry.local_path(svc.settings, registry.get_model(svc.settings, "cnn-noisy"))
    data = svc.settings.data_roots[0] / "digits-noisy"
    train, test = read_split(data / "train.safetensors"), read_split(data / "test.safetensors")
    want = _dense_trak(source, train, test.inputs[[4]], test.labels[[4]], 32, 0.05, 3, projection="dense")[0]
    order = torch.argsort(want, descending=True, stable=True)[:5].tolist()
    got = result["tests"][0]["proponents"]
    assert [e["index"] for e in got] == order
    assert [e["score"] for e in got] == pytest.approx(want[order].tolist(), abs=1e-4 * float(want.abs().max()))


def test_mode_test_takes_inputs_with_a_target_or_the_prediction(svc):
    x = digits_arrays()["test"][0][:2]
    result = _run(svc, {"model": "cnn-noisy", "top_k": 3, "inputs": [
        {"id": "a", "values": x[0].tolist(), "target": "3"}, {"id": "b", "values": x[1].tolist()}]})
    a, b = result["tests"]
    assert a["target"] == "3" and b["target"] == b["predicted"]
    assert len(a["proponents"]) == 3 and all(p["label"] in DIGITS_LABELS for p in a["proponents"])


def test_mode_self_ranks_the_flipped_labels_first(svc):
    from sklearn.metrics import roc_auc_score

    result = _run(svc, {"model": "cnn-noisy", "mode": "self", "top_k": 20})
    assert len(result["self_influence"]) == 20
    ranking = _artifact(svc, result["id"], "self_influence.csv")
    assert len(ranking) == 240 and [int(r["rank"]) for r in ranking] == list(range(1, 241))
    scores = {int(r["index"]): float(r["self_influence"]) for r in ranking}
    flipped = [1 if i < FLIPPED else 0 for i in range(240)]
    auc = roc_auc_score(flipped, [scores[i] for i in range(240)])
    print(f"self-influence AUC of the {FLIPPED} flipped labels: {auc:.3f}")
    assert auc >= 0.8, auc  # mislabelled examples have large self-influence (Pruthi et al., section 4)


@pytest.mark.parametrize(("body", "loc", "says"), [
    ({"model": "cnn"}, ("body", "model"), "no training checkpoints"),
    ({"model": "cnn-noisy"}, ("body", "inputs"), "mode test needs test examples"),
    ({"model": "cnn-noisy", "mode": "self", "test_indices": [1]}, ("body", "test_indices"), "takes no test"),
    ({"model": "cnn-noisy", "test_indices": [40]}, ("body", "test_indices", 0), "not a position"),
    ({"model": "cnn-noisy", "test_indices": [1], "test_split": "valid"}, ("body", "test_split"), "no valid split"),
    ({"model": "cnn-noisy", "inputs": [{"id": "a", "values": [[0.0]]}]}, ("body", "inputs", 0, "values", 0), "8 there"),
    ({"model": "cnn-noisy", "inputs": [{"id": "a", "values": np.zeros((1, 8, 8)).tolist(), "target": "cat"}]},
     ("body", "inputs", 0, "target"), "'cat' is not a class"),
    ({"model": "cnn-noisy", "mode": "self", "batch_size": 4096, "top_k": 5000}, ("body", "top_k"), "less than"),
])
def test_what_tracin_cannot_take_is_a_422_naming_the_field(svc, body, loc, says):
    r = svc.client.post("/tracin/classifier", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert tuple(detail["loc"]) == loc and says in detail["msg"], detail


# ---------------------------------------------------------------------------------------------------- texts
@pytest.mark.parametrize("model_type", ["bert", "roberta", "gpt2"])
def test_text_rows_give_each_texts_unpadded_gradients(tmp_path, model_type):
    """A text held as a padded row (ids, mask, label), differentiated under vmap, has the gradients of the text
    alone (no padding), element-wise."""
    from models.explain.gradients import per_example_gradients
    from models.hf.checkpoint import load as load_hf
    from models.hf.influence import TextModule, loss_of, rows, width
    from tests.hf_fixtures import TEXTS, save_classifier

    clf = load_hf(save_classifier(tmp_path / model_type, model_type))
    module = TextModule(clf)
    names = [n for n, _ in module.named_parameters()]
    labels = [0, 2, 1, 0, 2]
    length = width(clf, TEXTS, 64)
    got = per_example_gradients(module, names, loss_of(length), rows(clf, TEXTS, labels, 64, length))
    params = [p for _, p in module.named_parameters()]
    for p in params:
        p.requires_grad_(True)
    for i, text in enumerate(TEXTS):
        logits = clf.model(**clf.tokenizer(text, return_tensors="pt")).logits
        grads = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, torch.tensor([labels[i]])), params,
                                    allow_unused=True)
        want = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params,
                                                                                                  strict=True)])
        # fp32 summation order differs between the padded and unpadded runs (seen: 2.3e-6 on a few elements)
        torch.testing.assert_close(got[i], want, rtol=1e-4, atol=5e-6 * max(1.0, float(want.abs().max())))


@pytest.fixture(scope="module")
def svc_text(tmp_path_factory):
    from tests.hf_fixtures import save_classifier
    from tests.service import Service
    from tests.test_hf_train import _write_csv

    home = tmp_path_factory.mktemp("clf-influence-text") / "home"
    data = home / "data"
    save_classifier(data / "bert", "bert", hidden=32, scale=None)
    reviews = _write_csv(data / "reviews", {"train": 64, "test": 16})
    with Service(home, heartbeat_ttl_s=30) as service:
        r = service.client.post("/models/import", json={"name": "bert", "kind": "huggingface", "path": "bert"})
        assert r.status_code == 202, r.text
        assert service.wait(r.json()["id"], timeout_s=120)["status"] == "succeeded", service.worker_logs()
        r = service.client.post("/datasets", json={"name": "reviews", "path": reviews.name})
        assert r.status_code == 201, r.text
        r = service.client.post("/train/classifier", json={"name": "bert-reviews", "model": "bert",
                                                           "dataset": "reviews", "epochs": 4, "batch_size": 16,
                                                           "lr": 5e-3, "checkpoint_every": 2})
        assert r.status_code == 202, r.text
        assert service.wait(r.json()["id"], timeout_s=300)["status"] == "succeeded", service.worker_logs()
        yield service


def test_text_influence_lists_the_dense_scores_top_k_with_the_texts(svc_text):
    from core import registry
    from models.explain.tracin import FuncGradients, TracIn
    from models.hf.checkpoint import load as load_hf
    from models.hf.influence import TextModule, loss_of, read_checkpoints, rows, width
    from models.textdata import label_indices, read_split

    result = _run(svc_text, {"model": "bert-reviews", "top_k": 4, "texts": [
        {"id": "a", "text": "the plot was dull", "target": "negative"}, {"id": "b", "text": "a great film"}]})
    assert result["dataset"] == "reviews" and result["train_examples"] == 64
    assert [c["epoch"] for c in result["checkpoints"]] == [2, 4]
    a, b = result["tests"]
    assert a["target"] == "negative" and b["target"] == b["predicted"]
    source = registry.local_path(svc_text.settings, registry.get_model(svc_text.settings, "bert-reviews"))
    clf = load_hf(source)
    module = TextModule(clf)
    train = read_split(svc_text.settings.data_roots[0] / "reviews" / "train.csv")
    labels, _ = label_indices(train.labels, clf.labels)
    length = width(clf, train.texts + ["the plot was dull"], 128)
    engine = TracIn(FuncGradients(module, loss_of(length)), read_checkpoints(source, module)[1])
    scores, _ = engine.influence(rows(clf, ["the plot was dull"], [0], 128, length),
                                 rows(clf, train.texts, labels, 128, length))
    want = torch.argsort(scores[0], descending=True, stable=True)[:4].tolist()
    assert [p["index"] for p in a["proponents"]] == want
    assert [p["text"] for p in a["proponents"]] == [train.texts[j] for j in want]
    assert [p["score"] for p in a["proponents"]] == pytest.approx(scores[0, want].tolist(), rel=1e-4)


def test_text_self_influence_and_test_indices(svc_text):
    result = _run(svc_text, {"model": "bert-reviews", "mode": "self", "top_k": 5})
    assert len(result["self_influence"]) == 5 and all(e["text"] for e in result["self_influence"])
    scores = [e["score"] for e in result["self_influence"]]
    assert scores == sorted(scores, reverse=True)
    assert len(_artifact(svc_text, result["id"], "self_influence.csv")) == 64
    result = _run(svc_text, {"model": "bert-reviews", "test_indices": [0, 5], "top_k": 2})
    assert [t["id"] for t in result["tests"]] == ["test[0]", "test[5]"]
    assert all(t["label"] == t["target"] for t in result["tests"])
    trak = _run(svc_text, {"model": "bert-reviews", "test_indices": [0], "top_k": 3, "estimator": "trak",
                           "proj_dim": 128})
    pro = trak["tests"][0]["proponents"]
    assert trak["output"] == "margin" and pro and [e["score"] for e in pro] == sorted((e["score"] for e in pro),
                                                                                      reverse=True)
    assert all(e["score"] > 0 and e["text"] for e in pro)
    # EK-FAC over the transformer's linear layers (Kronfluence), the head and the attention projections included
    ekfac = _run(svc_text, {"model": "bert-reviews", "test_indices": [0], "top_k": 3, "estimator": "ekfac"})
    assert "classifier" in ekfac["layers"] and any("attention" in n for n in ekfac["layers"])
    assert ekfac["tests"][0]["n_positive"] + ekfac["tests"][0]["n_negative"] == 64


@pytest.mark.parametrize(("body", "loc", "says"), [
    ({"model": "bert-reviews", "inputs": [{"id": "a", "values": [0.0]}]}, ("body", "inputs"), "reads texts"),
    ({"model": "bert-reviews", "texts": [{"id": "a", "text": "x", "target": "meh"}]}, ("body", "texts", 0, "target"),
     "'meh' is not a class"),
    ({"model": "bert", "texts": [{"id": "a", "text": "x"}]}, ("body", "model"), "no training checkpoints"),
])
def test_what_text_tracin_cannot_take_is_a_422_naming_the_field(svc_text, body, loc, says):
    r = svc_text.client.post("/tracin/classifier", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert tuple(detail["loc"]) == loc and says in detail["msg"], detail


# ---------------------------------------------------------------------------------------------------- browser
def _in_a_browser(test):
    for mark in BROWSER_MARKS:
        test = mark(test)
    return test


@_in_a_browser
@pytest.mark.parametrize("width", [1280, 390])
def test_the_influence_grid_and_the_text_list_in_a_browser(svc, svc_text, show, width):
    """The grid of training images for an image classifier and the list of training texts for a text classifier,
    at 1280 and 390 px: every example's label and score readable as text, bars from zero, no sideways scroll."""
    from tests.analysis_pages import job_page
    from tests.browser import expect
    from tests.test_ui_browser_analysis import _no_sideways_scroll

    result = _run(svc, {"model": "cnn-noisy", "test_indices": [2], "top_k": 6})
    pg = show(job_page(result, kind="classifier_influence"), width)
    gallery = pg.locator("article.influence-test .gallery").first
    expect(gallery).to_be_visible()
    items = gallery.locator(".example")
    assert items.count() == len(result["tests"][0]["proponents"])
    first = result["tests"][0]["proponents"][0]
    assert first["label"] in items.first.inner_text() and f"#{first['index']}" in items.first.inner_text()
    box = items.first.locator(".thumb").bounding_box()
    assert 40 <= box["width"] <= 120 and abs(box["width"] - box["height"]) < 2
    widths = [float(w) for w in pg.locator("article.influence-test .example .bar > span").evaluate_all(
        "els => els.map(e => e.style.width.replace('%', ''))")]
    assert max(widths) == pytest.approx(100.0, abs=0.1) and min(widths) >= 0.0  # from zero, one scale per test
    if width == 390:
        _no_sideways_scroll(pg)
    text = _run(svc_text, {"model": "bert-reviews", "texts": [{"id": "q", "text": "the plot was dull"}], "top_k": 3})
    pg = show(job_page(text, kind="classifier_influence"), width)
    rows = pg.locator("article.influence-test table.influence").first.locator("tbody tr")
    assert rows.count() == 3
    top = text["tests"][0]["proponents"][0]
    expect(rows.first.locator("td.text")).to_have_text(top["text"])
    assert "the plot was dull" in pg.locator("blockquote.test-text").inner_text()
    if width == 390:
        _no_sideways_scroll(pg)


# ---------------------------------------------------------------------------------------------------- estimators
def _source(svc, name):
    from core import registry

    return registry.local_path(svc.settings, registry.get_model(svc.settings, name))


def _digits_classifier(svc, name):
    from models.export.influence import ProgramModule, classifier, read_checkpoints

    source = _source(svc, name)
    module = ProgramModule(load(source))
    return classifier(module, read_checkpoints(source, module).states, name)


def _digits_rows(svc, indices):
    from models.export.influence import rows
    from models.export.train import read_split

    data = svc.settings.data_roots[0] / "digits-noisy"
    train_split, test_split = read_split(data / "train.safetensors"), read_split(data / "test.safetensors")
    idx = torch.tensor(indices)
    return rows(test_split.inputs[idx], test_split.labels[idx]), rows(train_split.inputs, train_split.labels)


def _listed_equal(result, dense, k):
    for i, t in enumerate(result["tests"]):
        want = torch.argsort(dense[i], descending=True, stable=True)[:k].tolist()
        want = [j for j in want if dense[i, j] > 0]
        assert [e["index"] for e in t["proponents"]] == want
        scale = float(dense[i].abs().max())
        assert [e["score"] for e in t["proponents"]] == pytest.approx(dense[i, want].tolist(), abs=1e-4 * scale)


def test_ekfac_through_the_service_is_kronfluences_on_the_trained_model(svc):
    from sklearn.metrics import roc_auc_score

    from models.explain.ekfac import EKFAC

    result = _run(svc, {"model": "cnn-noisy", "test_indices": [2, 5], "top_k": 5, "estimator": "ekfac",
                        "batch_size": 48})
    assert result["estimator"] == "ekfac" and result["output"] == "margin"
    assert result["layers"] == ["conv1", "conv2", "fc"] and [c["epoch"] for c in result["checkpoints"]] == [4]
    clf = _digits_classifier(svc, "cnn-noisy")
    test, train_rows = _digits_rows(svc, [2, 5])
    with EKFAC(clf, batch_size=48) as ek:
        ek.fit(train_rows)
        dense = ek.scores(test, train_rows)
        own = ek.self_scores(train_rows)
    _listed_equal(result, dense, 5)
    ranked = _run(svc, {"model": "cnn-noisy", "mode": "self", "estimator": "ekfac", "top_k": 240, "batch_size": 48})
    scores = {e["index"]: e["score"] for e in ranked["self_influence"]}
    assert [scores[i] for i in range(240)] == pytest.approx(own.tolist(), rel=1e-4)
    auc = roc_auc_score([1 if i < FLIPPED else 0 for i in range(240)], [scores[i] for i in range(240)])
    print(f"EK-FAC self-influence AUC of the {FLIPPED} flipped labels: {auc:.3f}")
    assert auc >= 0.7, auc


def test_projected_tracin_and_margin_tracin_through_the_service(svc):
    from models.explain import classifier_estimators as table

    clf = _digits_classifier(svc, "cnn-noisy")
    test, train_rows = _digits_rows(svc, [1, 6])
    result = _run(svc, {"model": "cnn-noisy", "test_indices": [1, 6], "top_k": 4, "estimator": "tracin_projected",
                        "proj_dim": 64, "seed": 5})
    assert result["output"] == "cross_entropy" and result["proj_dim"] == 64
    _listed_equal(result, table.tracin_projected_scores(clf, "all", test, train_rows, output="loss", proj_dim=64,
                                                        seed=5), 4)
    margin = _run(svc, {"model": "cnn-noisy", "test_indices": [1, 6], "top_k": 4, "output": "margin"})
    assert margin["output"] == "margin" and margin["factorised"] == ["layers.fc"]
    _listed_equal(margin, table.tracin_scores(clf, "all", test, train_rows, output="margin", ghost="none"), 4)
    plain = _run(svc, {"model": "cnn-noisy", "test_indices": [1, 6], "top_k": 4, "output": "margin",
                       "method": "vmap"})
    assert plain["factorised"] == [] and [e["index"] for e in plain["tests"][0]["proponents"]] == \
        [e["index"] for e in margin["tests"][0]["proponents"]]


@pytest.fixture(scope="module")
def member(svc):
    """A second digits CNN of the same recipe, another seed: an ensemble member."""
    r = svc.client.post("/train/classifier", json={"name": "cnn-noisy-b", "model": "cnn", "dataset": "digits-noisy",
                                                   "epochs": 4, "batch_size": 32, "lr": 0.05, "checkpoint_every": 2,
                                                   "seed": 1})
    assert r.status_code == 202, r.text
    assert svc.wait(r.json()["id"], timeout_s=300)["status"] == "succeeded", svc.worker_logs()
    return "cnn-noisy-b"


def test_trak_ensemble_through_the_service(svc, member):
    from models.explain import classifier_estimators as table

    result = _run(svc, {"model": "cnn-noisy", "test_indices": [3], "top_k": 5, "estimator": "trak_ensemble",
                        "ensemble": [member], "proj_dim": 64, "damping": 0.05})
    assert result["ensemble"] == [member]
    test, train_rows = _digits_rows(svc, [3])
    want = table.trak_ensemble_scores(_digits_classifier(svc, "cnn-noisy"), "all", test, train_rows,
                                      members=[_digits_classifier(svc, member)], proj_dim=64, damping=0.05)
    _listed_equal(result, want, 5)
    ranked = _run(svc, {"model": "cnn-noisy", "mode": "self", "estimator": "trak_ensemble", "ensemble": [member],
                        "proj_dim": 64, "top_k": 3})
    assert len(ranked["self_influence"]) == 3


@pytest.fixture(scope="module")
def matmul_model(svc):
    """An exported classifier computing with matmul only (no aten.linear or conv2d call), trained by the service."""
    from torch import nn

    class Matmul(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(64, 10) * 0.1)

        def forward(self, x):
            return x.flatten(1) @ self.w

    directory = svc.settings.data_roots[0] / "mm"
    directory.mkdir(parents=True, exist_ok=True)
    program = torch.export.export(Matmul().eval(), (torch.zeros(2, 1, 8, 8),),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=1 << 20)},))
    torch.export.save(program, str(directory / "model.pt2"))
    (directory / "spec.json").write_text('{"input": {"kind": "image", "mean": [0.3]}, "labels": '
                                         + str(DIGITS_LABELS).replace("'", '"') + "}")
    r = svc.client.post("/models/import", json={"name": "mm", "kind": "export", "path": "mm"})
    assert r.status_code == 202, r.text
    assert svc.wait(r.json()["id"], timeout_s=120)["status"] == "succeeded", svc.worker_logs()
    r = svc.client.post("/train/classifier", json={"name": "mm-trained", "model": "mm", "dataset": "digits-noisy",
                                                   "epochs": 1, "batch_size": 64})
    assert r.status_code == 202, r.text
    assert svc.wait(r.json()["id"], timeout_s=300)["status"] == "succeeded", svc.worker_logs()
    return "mm-trained"


@pytest.mark.parametrize(("body", "loc", "says"), [
    ({"estimator": "ekfac", "checkpoints": "all"}, ("body", "checkpoints"), "trained model"),
    ({"estimator": "trak", "output": "loss"}, ("body", "output"), "margin"),
    ({"estimator": "trak_ensemble"}, ("body", "ensemble"), "needs ensemble"),
    ({"estimator": "trak", "ensemble": ["cnn"]}, ("body", "ensemble"), "for estimator trak_ensemble"),
    ({"estimator": "trak_ensemble", "ensemble": ["cnn-noisy"]}, ("body", "ensemble", 0), "already in"),
    ({"estimator": "trak_ensemble", "ensemble": ["cnn"]}, ("body", "ensemble", 0), "no training checkpoints"),
    ({"estimator": "trak", "method": "vmap"}, ("body", "method"), "for estimator tracin"),
    ({"estimator": "nope"}, ("body", "estimator"), "'tracin'"),
])
def test_what_the_estimators_cannot_take_is_a_422_naming_the_field(svc, body, loc, says):
    r = svc.client.post("/tracin/classifier", json={"model": "cnn-noisy", "test_indices": [0], **body})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert tuple(detail["loc"]) == loc and says in detail["msg"], detail


def test_self_mode_takes_no_output(svc):
    r = svc.client.post("/tracin/classifier", json={"model": "cnn-noisy", "mode": "self", "output": "margin"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "output"], r.text


def test_ekfac_on_a_program_without_linear_layers_is_a_422_that_says_why(svc, matmul_model):
    r = svc.client.post("/tracin/classifier", json={"model": matmul_model, "test_indices": [0],
                                                    "estimator": "ekfac"})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"] == ["body", "estimator"] and "nn.Linear and nn.Conv2d" in detail["msg"], detail
    # the other estimators take it (gradients through the interpreter need no modules)
    result = _run(svc, {"model": matmul_model, "test_indices": [0], "top_k": 3, "estimator": "trak",
                        "proj_dim": 32})
    assert result["tests"][0]["proponents"]


def test_featurize_once_then_stored_queries_equal_the_direct_ones(svc):
    """POST /featurize/classifier stores the features (a repeat computes nothing, the features are recorded with
    the model version), and stored TRAK lists what the direct TRAK lists; a stored query of other settings fails
    saying what to featurize."""
    import json

    from core import registry
    from core.filestore import get_store

    body = {"model": "cnn-noisy", "proj_dim": 64, "seed": 2}
    r = svc.client.post("/featurize/classifier", json=body)
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=300)
    assert job["status"] == "succeeded", (job.get("error"), svc.worker_logs()[-3000:])
    first = svc.client.get(f"/jobs/{job['id']}/result").json()
    assert first["serves"] == ["trak"] and first["rows_computed"] == 2 * 240 and first["n_train"] == 240
    assert first["examples_per_second"] > 0
    r = svc.client.post("/featurize/classifier", json=body)
    again = svc.client.get(f"/jobs/{svc.wait(r.json()['id'], timeout_s=300)['id']}/result").json()
    assert again["rows_computed"] == 0 and [c["key"] for c in again["checkpoints"]] == \
        [c["key"] for c in first["checkpoints"]]
    store = get_store(svc.settings)
    location = registry.get_model(svc.settings, "cnn-noisy")["location"]
    for c in first["checkpoints"]:
        assert location in json.loads(store.read_bytes(f"features/{c['key']}/models.json"))
    query = {"model": "cnn-noisy", "test_indices": [4, 9], "top_k": 5, "estimator": "trak", "proj_dim": 64,
             "seed": 2, "damping": 0.05}
    stored, direct = _run(svc, {**query, "stored": True}), _run(svc, query)
    assert stored["stored"] is True and direct["stored"] is False
    for s, d in zip(stored["tests"], direct["tests"], strict=True):
        assert [e["index"] for e in s["proponents"]] == [e["index"] for e in d["proponents"]]
        assert [e["score"] for e in s["proponents"]] == pytest.approx([e["score"] for e in d["proponents"]],
                                                                       rel=1e-3)
    ranked = _run(svc, {"model": "cnn-noisy", "mode": "self", "estimator": "trak", "proj_dim": 64, "seed": 2,
                        "stored": True, "top_k": 240})
    assert len(ranked["self_influence"]) == 240
    r = svc.client.post("/tracin/classifier", json={**query, "seed": 3, "stored": True})
    job = svc.wait(r.json()["id"], timeout_s=300)
    assert job["status"] == "failed" and job["error"]["code"] == "not_featurized", job
    assert "POST /featurize/classifier" in job["error"]["message"], job


@pytest.mark.parametrize(("body", "loc", "says"), [
    ({"estimator": "tracin", "stored": True}, ("body", "stored"), "serve trak and tracin_projected"),
    ({"estimator": "tracin_projected", "stored": True, "output": "margin"}, ("body", "output"), "of the loss"),
    ({"estimator": "trak", "stored": True, "projection": "dense"}, ("body", "projection"), "Kronecker-projected"),
    ({"estimator": "ekfac", "projection": "dense"}, ("body", "projection"), "is for trak"),
])
def test_what_stored_queries_cannot_take_is_a_422(svc, body, loc, says):
    r = svc.client.post("/tracin/classifier", json={"model": "cnn-noisy", "test_indices": [0], **body})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert tuple(detail["loc"]) == loc and says in detail["msg"], detail


@pytest.mark.parametrize(("estimator", "title"), [("ekfac", "EK-FAC influence functions"),
                                                  ("trak_ensemble", "TRAK (ensemble)"),
                                                  ("tracin_projected", "TracIn-CP (projected)")])
def test_the_sdk_reads_every_estimators_result(estimator, title):
    from explainq_client import ClassifierInfluenceResult
    from explainq_client.results import make_result

    example = {"index": 3, "label": "7", "score": 0.5, "preview": [[0.0, 1.0], [1.0, 0.0]]}
    data = {"model": "m", "dataset": "d", "mode": "test", "estimator": estimator, "output": "margin",
            "parameters": 10, "train_examples": 4, "checkpoints": [{"file": "c", "epoch": 1, "lr": 0.1}],
            "labels": ["7", "1"], "seconds": 1.0, "layers": ["fc"], "ensemble": ["m2"],
            "tests": [{"id": "t", "target": "7", "predicted": "7", "self_influence": None, "n_positive": 1,
                       "n_negative": 0, "proponents": [example], "opponents": []}]}
    result = make_result("classifier_influence", data, "classifier_influence")
    assert isinstance(result, ClassifierInfluenceResult)
    assert [(r["role"], r["index"], r["score"]) for r in result.rows()] == [("proponent", 3, 0.5)]
    assert title in result.text() and title in result._repr_html_()
