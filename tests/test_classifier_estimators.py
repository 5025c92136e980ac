"""The classifiers' estimator table (``models.explain.classifier_estimators``): it implements exactly the names the
one registry marks ``classifier_evaluated``; TracIn factorised for linear layers (ghost dot products) equals the
materialised path element-wise (exported programs through their layered view, BERT over tokens, GPT-2's Conv1D);
TracIn's margin test side equals explicit autograd gradients; TRAK and its ensemble equal a dense float64
reference; projected TracIn approaches TracIn as k grows."""

from __future__ import annotations

import pytest
import torch

from models.export.demo import DIGITS_LABELS, digits_arrays, digits_program
from models.export.program import build, load
from models.export.train import Split, save_model, train
from models.training import TrainOptions

SPEC = {"input": {"kind": "image", "mean": [0.3]}, "labels": DIGITS_LABELS}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _train(tmp, seed: int, n: int = 64, epochs: int = 2):
    init = digits_program(tmp / f"init-{seed}", seed=seed)
    clf = build(init / "model.pt2", SPEC)
    a = digits_arrays()
    data = Split(torch.tensor(a["train"][0][:n]), torch.tensor(a["train"][1][:n]))
    save_model(tmp / f"out-{seed}", clf, train(clf, data, TrainOptions(epochs=epochs, batch_size=32, lr=0.05,
                                                                        checkpoint_every=1, seed=seed)))
    return tmp / f"out-{seed}", data


@pytest.fixture(scope="module")
def digits(tmp_path_factory, _one_thread):
    from models.export.influence import ProgramModule, classifier, read_checkpoints, rows

    tmp = tmp_path_factory.mktemp("estimators")
    out, data = _train(tmp, 0)
    module = ProgramModule(load(out))
    clf = classifier(module, read_checkpoints(out, module).states)
    a = digits_arrays()
    test = rows(torch.tensor(a["test"][0][:4]), torch.tensor(a["test"][1][:4]))
    return clf, test, rows(data.inputs, data.labels), tmp


def test_the_table_implements_the_names_the_registry_marks_for_classifiers():
    from core import estimators as registry
    from models.explain import classifier_estimators as table

    assert table.names() == registry.names(classifier_evaluated=True)
    assert table.ensembles() == registry.names(classifier_evaluated=True, ensemble=True)
    for name in table.names():
        scores, self_scores = table.get(name).load()
        assert callable(scores) and callable(self_scores)


@pytest.mark.parametrize("output", ["loss", "margin"])
def test_ghost_tracin_equals_the_materialised_path_on_an_exported_program(digits, output):
    from models.explain.classifier_estimators import gradient_model, tracin_scores, tracin_self_scores

    clf, test, train_rows, _ = digits
    ghost = gradient_model(clf, clf.checkpoints, output, ghost="all")
    ghost.load(clf.checkpoints[-1])
    ghost.features(train_rows[:3])
    assert ghost.factorised == ("layers.fc",)  # the only linear layer; the convolutions are materialised
    plain = tracin_scores(clf, "all", test, train_rows, output=output, ghost="none")
    fast = tracin_scores(clf, "all", test, train_rows, output=output, ghost="all")
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-6 * float(plain.abs().max()))
    torch.testing.assert_close(tracin_self_scores(clf, "all", train_rows, ghost="all"),
                               tracin_self_scores(clf, "all", train_rows, ghost="none"), rtol=1e-5, atol=1e-6)


def test_the_margin_test_side_is_the_negated_margins_autograd_gradient(digits):
    from models.explain.classifier_estimators import graddot_scores
    from models.explain.gradients import classification_margin

    clf, test, train_rows, _ = digits
    module = clf.at(clf.checkpoints[-1]).double()
    for p in module.parameters():
        p.requires_grad_(True)

    def grad(value):
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(value, list(module.parameters()))])

    x_test, y_test = clf.inputs(test)[0].double(), clf.labels(test)
    x_train, y_train = clf.inputs(train_rows)[0].double(), clf.labels(train_rows)
    g_test = torch.stack([grad(-classification_margin(module(x_test[i:i + 1]), y_test[i:i + 1]))
                          for i in range(len(test))])
    g_train = torch.stack([grad(torch.nn.functional.cross_entropy(module(x_train[j:j + 1]), y_train[j:j + 1]))
                           for j in range(len(train_rows))])
    want = g_test @ g_train.t()
    got = graddot_scores(clf, "all", test, train_rows, output="margin")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("model_type", ["bert", "gpt2"])
def test_ghost_tracin_equals_the_materialised_path_on_texts(tmp_path, model_type):
    """Tokens: each linear layer's factors hold every position of the text; GPT-2's Conv1D counts as linear."""
    from models.explain.classifier_estimators import gradient_model, tracin_scores
    from models.explain.tracin import MemoryCheckpoint
    from models.hf.checkpoint import load as load_hf
    from models.hf.influence import TextModule, classifier, rows, width
    from tests.hf_fixtures import TEXTS, save_classifier

    hf = load_hf(save_classifier(tmp_path / model_type, model_type))
    module = TextModule(hf)
    length = width(hf, TEXTS, 64)
    r = rows(hf, TEXTS, [0, 1, 2, 0, 1], 64, length)
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    clf = classifier(module, [MemoryCheckpoint(state, 0.5), MemoryCheckpoint(state, 0.25)])
    ghost = gradient_model(clf, clf.checkpoints, "loss", ghost="all")
    ghost.load(clf.checkpoints[0])
    ghost.features(r[:2])
    assert len(ghost.factorised) >= 4
    plain = tracin_scores(clf, "all", r[:2], r, output="margin", ghost="none")
    fast = tracin_scores(clf, "all", r[:2], r, output="margin", ghost="all")
    torch.testing.assert_close(fast, plain, rtol=1e-4, atol=1e-5 * float(plain.abs().max()))
    auto = gradient_model(clf, clf.checkpoints, "loss", ghost="auto")
    auto.load(clf.checkpoints[0])
    auto.features(r[:2])
    # where it pays: the head over one position, not the layers over every token of these short, narrow texts
    assert set(auto.factorised) < set(ghost.factorised)


def _projection_seed(seed, checkpoint, model=0):
    """The per-checkpoint projection seed as the estimator documents it (restated here, not imported)."""
    import hashlib

    digest = hashlib.sha256(f"trak|{seed}|model {model}|checkpoint {checkpoint}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def _dense_trak(clf, test, train_rows, proj_dim, damping, seed, model=0, only_last=False, projection="kronecker"):
    """float64 reference of TRAK (Park et al. 2023, Algorithm 1, the checkpoints as its models): per checkpoint c
    explicit margin gradients by autograd, an explicit projection matrix of its own seed, a dense solve; returns
    the kernel averaged over the checkpoints and Q = 1 - p(label) averaged over the checkpoints, each at its own
    weights (``only_last``: the last checkpoint alone, at its position among the model's checkpoints)."""
    from models.explain.gradients import classification_margin
    from models.explain.trak import projection_matrix

    total, q, n_ck = 0, 0, 0
    shapes = {n: tuple(p.shape) for n, p in clf.module.named_parameters()}
    numbered = list(enumerate(clf.checkpoints))
    for c, ck in numbered[-1:] if only_last else numbered:
        proj = projection_matrix(shapes, proj_dim, _projection_seed(seed, c, model), projection=projection)
        module = clf.at(ck).double()
        for p in module.parameters():
            p.requires_grad_(True)

        def grads(rows, module=module):
            x, y = clf.inputs(rows)[0].double(), clf.labels(rows)
            return torch.stack([torch.cat([g.reshape(-1) for g in torch.autograd.grad(
                classification_margin(module(x[i:i + 1]), y[i:i + 1]), list(module.parameters()))])
                for i in range(len(rows))])

        phi, phi_t = grads(train_rows) @ proj, grads(test) @ proj
        gram = phi.t() @ phi
        lam = damping * float(torch.trace(gram)) / proj_dim
        total = total + phi_t @ torch.linalg.solve(gram + lam * torch.eye(proj_dim, dtype=torch.float64), phi.t())
        with torch.no_grad():
            probs = torch.softmax(module(clf.inputs(train_rows)[0].double()), 1)
        q = q + 1 - probs[torch.arange(len(train_rows)), clf.labels(train_rows)]
        n_ck += 1
    return total / n_ck, q / n_ck


def test_trak_and_its_ensemble_equal_a_dense_float64_reference(digits):
    from models.explain.classifier_estimators import (
        trak_ensemble_scores,
        trak_ensemble_self_scores,
        trak_scores,
        trak_self_scores,
    )
    from models.export.influence import ProgramModule, classifier, read_checkpoints

    clf, test, train_rows, tmp = digits
    assert len(clf.checkpoints) >= 2
    kw = {"proj_dim": 32, "damping": 0.05, "seed": 2}
    s0, q0 = _dense_trak(clf, test, train_rows, 32, 0.05, 2)
    got = trak_scores(clf, "all", test, train_rows, **kw)
    want = s0 * q0[None]
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4 * float(want.abs().max()))
    self_want = torch.diagonal(_dense_trak(clf, train_rows, train_rows, 32, 0.05, 2)[0]) * q0
    torch.testing.assert_close(trak_self_scores(clf, "all", train_rows, **kw), self_want, rtol=1e-3,
                               atol=1e-4 * float(self_want.abs().max()))
    # "last" alone: the last checkpoint keeps its own projection (its position among the model's checkpoints)
    last = trak_scores(clf, "last", test, train_rows, **kw)
    s_last, q_last = _dense_trak(clf, test, train_rows, 32, 0.05, 2, only_last=True)
    torch.testing.assert_close(last, s_last * q_last[None], rtol=1e-3, atol=1e-4 * float(last.abs().max()))
    # a second model of the same recipe, another seed (model 1: its own projections): the ensemble averages the
    # kernels and the Q weights over every (model, checkpoint)
    out1, _ = _train(tmp, 1)
    module1 = ProgramModule(load(out1))
    member = classifier(module1, read_checkpoints(out1, module1).states)
    assert len(member.checkpoints) == len(clf.checkpoints)
    s1, q1 = _dense_trak(member, test, train_rows, 32, 0.05, 2, model=1)
    ens = trak_ensemble_scores(clf, "all", test, train_rows, members=[member], **kw)
    want = (s0 + s1) / 2 * ((q0 + q1) / 2)[None]
    torch.testing.assert_close(ens, want, rtol=1e-3, atol=1e-4 * float(want.abs().max()))
    assert not torch.allclose(ens, got, rtol=1e-2)
    d1, _ = _dense_trak(member, train_rows, train_rows, 32, 0.05, 2, model=1)
    ens_self = (torch.diagonal(_dense_trak(clf, train_rows, train_rows, 32, 0.05, 2)[0]) + torch.diagonal(d1)) / 2 \
        * (q0 + q1) / 2
    torch.testing.assert_close(trak_ensemble_self_scores(clf, "all", train_rows, members=[member], **kw), ens_self,
                               rtol=1e-3, atol=1e-4 * float(ens_self.abs().max()))


def test_trak_with_a_dense_projection_equals_the_reference_with_that_projection(digits):
    """``projection="dense"`` (the TRAK paper's and dattri's choice) goes through TRAK, its self-scores and its
    ensemble: equal to the float64 reference built on the explicit dense matrix, and not the Kronecker result."""
    from models.explain.classifier_estimators import trak_scores, trak_self_scores

    clf, test, train_rows, _ = digits
    kw = {"proj_dim": 32, "damping": 0.05, "seed": 2}
    s0, q0 = _dense_trak(clf, test, train_rows, 32, 0.05, 2, projection="dense")
    got = trak_scores(clf, "all", test, train_rows, projection="dense", **kw)
    want = s0 * q0[None]
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4 * float(want.abs().max()))
    self_want = torch.diagonal(_dense_trak(clf, train_rows, train_rows, 32, 0.05, 2, projection="dense")[0]) * q0
    torch.testing.assert_close(trak_self_scores(clf, "all", train_rows, projection="dense", **kw), self_want,
                               rtol=1e-3, atol=1e-4 * float(self_want.abs().max()))
    assert not torch.allclose(got, trak_scores(clf, "all", test, train_rows, **kw), rtol=1e-2)


def test_projected_tracin_approaches_tracin(digits):
    from models.explain.classifier_estimators import tracin_projected_scores, tracin_scores

    clf, test, train_rows, _ = digits
    exact = tracin_scores(clf, "last", test, train_rows, output="loss", ghost="none")
    errors = []
    for k in (16, 1024):
        approx = tracin_projected_scores(clf, "last", test, train_rows, output="loss", proj_dim=k, seed=1,
                                         projection="dense")
        errors.append(float((approx - exact).norm() / exact.norm()))
    assert errors[1] < errors[0] / 3 and errors[1] < 0.15, errors


def test_a_model_whose_examples_interact_is_not_factorised():
    """A batch-coupled model (each row minus the batch's mean) would give wrong factors: the check on the first
    batch finds it, TracIn materialises every gradient (a warning says so) and still equals the plain path."""
    from torch import nn

    from models.explain.classifier import Classifier
    from models.explain.classifier_estimators import gradient_model, tracin_scores
    from models.explain.gradients import classification_margin
    from models.explain.tracin import MemoryCheckpoint

    class Coupled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 3)

        def forward(self, x):
            return self.fc(x - x.mean(0, keepdim=True))

    torch.manual_seed(0)
    module = Coupled()

    def loss(forward, row):
        return nn.functional.cross_entropy(forward(row[None, :-1]), row[-1:].long())

    def margin(forward, row):
        return classification_margin(forward(row[None, :-1]), row[-1:].long())

    clf = Classifier(module, [MemoryCheckpoint({k: v.clone() for k, v in module.state_dict().items()}, 1.0)],
                     loss, margin, inputs=lambda r: (r[:, :-1],), labels=lambda r: r[:, -1].long())
    rows_ = torch.cat([torch.randn(8, 6), torch.randint(0, 3, (8, 1)).float()], 1)
    ghost = gradient_model(clf, clf.checkpoints, "loss", ghost="all")
    ghost.load(clf.checkpoints[0])
    ghost.features(rows_[:4])
    assert ghost.factorised == () and "interact" in ghost.warnings[0]
    torch.testing.assert_close(tracin_scores(clf, "all", rows_[:2], rows_, output="loss", ghost="all"),
                               tracin_scores(clf, "all", rows_[:2], rows_, output="loss", ghost="none"))
