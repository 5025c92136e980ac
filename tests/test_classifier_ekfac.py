"""EK-FAC influence functions through Kronfluence on classifiers of any format (``models.explain.ekfac``): the
scores are Kronfluence's own (equal to calling Kronfluence directly on the eager model and the same data), an
exported program's linear and convolution calls become real modules computing the same thing, Hugging Face
``Conv1D`` layers become ``nn.Linear`` of the same map, and a program Kronfluence cannot cover says why."""

from __future__ import annotations

import contextlib
import gc

import pytest
import torch
from torch import nn

from models.export.demo import DIGITS_LABELS, DigitsCNN, digits_arrays, digits_program
from models.export.program import build, load
from models.export.train import Split, parameters, save_model, train
from models.training import TrainOptions

SPEC = {"input": {"kind": "image", "mean": [0.3]}, "labels": DIGITS_LABELS}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small operations (8x8 images, batches of 32): one thread, which on a shared machine is many times faster
    than two contending ones (im2col measured 0.03 s on one against 3.9 s on two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, _one_thread):
    """The digits CNN trained on 96 digits for two epochs (a checkpoint each), saved as the service saves it."""
    tmp = tmp_path_factory.mktemp("ekfac")
    init = digits_program(tmp / "init")
    clf = build(init / "model.pt2", SPEC)
    a = digits_arrays()
    data = Split(torch.tensor(a["train"][0][:96]), torch.tensor(a["train"][1][:96]))
    save_model(tmp / "out", clf, train(clf, data, TrainOptions(epochs=2, batch_size=32, lr=0.05, checkpoint_every=1)))
    return tmp / "out", data


def _exported(out):
    from models.export.influence import ProgramModule, classifier, read_checkpoints

    module = ProgramModule(load(out))
    return classifier(module, read_checkpoints(out, module).states)


def test_the_layered_program_computes_what_the_program_computes(trained):
    from models.explain.gradients import per_example_gradients
    from models.export.influence import LayeredProgram, rows

    out, data = trained
    clf = _exported(out)
    module = clf.at(clf.checkpoints[0])  # an earlier checkpoint: the view takes the module's current weights
    layered = LayeredProgram(module)
    assert sorted(layered.layers) == ["conv1", "conv2", "fc"]
    assert isinstance(layered.layers["conv1"], nn.Conv2d) and isinstance(layered.layers["fc"], nn.Linear)
    x = data.inputs[:9]
    torch.testing.assert_close(layered(x), module(x), rtol=0, atol=0)
    # and the same gradients (the layers' parameters are the program's)
    for p in layered.parameters():
        p.requires_grad_(True)
    loss = nn.functional.cross_entropy(layered(x[:1]), data.labels[:1])
    grads = dict(zip([n for n, _ in layered.layers.named_parameters()],
                     torch.autograd.grad(loss, list(layered.layers.parameters())), strict=True))
    want = per_example_gradients(module, [n for n, _ in module.named_parameters()], clf.loss,
                                 rows(x[:1], data.labels[:1]))[0]
    got = torch.cat([grads[f"{layer}.{kind}"].reshape(-1) for layer in ("conv1", "conv2", "fc")
                     for kind in ("weight", "bias")])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


class _EagerTask:
    """A Kronfluence task written for the eager DigitsCNN and (images, labels) batches, as its documentation
    shows: the summed cross-entropy (labels sampled from the model for the true Fisher, from a seeded generator)
    and the negated margin."""

    def __new__(cls, seed: int = 0, output: str = "margin"):
        from kronfluence.task import Task

        class Eager(Task):
            def __init__(self):
                super().__init__()
                self.generator = torch.Generator().manual_seed(seed)

            def compute_train_loss(self, batch, model, sample=False):
                x, y = batch
                logits = model(x)
                if sample:
                    with torch.no_grad():
                        probs = torch.softmax(logits.detach().double(), -1)
                        y = torch.multinomial(probs, 1, generator=self.generator).flatten()
                return nn.functional.cross_entropy(logits, y, reduction="sum")

            def compute_measurement(self, batch, model):
                x, y = batch
                logits = model(x)
                if output == "loss":
                    return nn.functional.cross_entropy(logits, y, reduction="sum")
                bindex = torch.arange(logits.shape[0])
                correct = logits[bindex, y]
                others = logits.clone()
                others[bindex, y] = -torch.inf
                return -(correct - others.logsumexp(-1)).sum()

        return Eager()


@contextlib.contextmanager
def _frozen_gc():
    """Kronfluence calls gc.collect() between passes; with the test process's objects frozen it is quick."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _kronfluence_directly(model, train_set, query_set, tmp_path, batch: int, output: str = "margin"):
    with _frozen_gc():
        return _kronfluence(model, train_set, query_set, tmp_path, batch, output)


def _kronfluence(model, train_set, query_set, tmp_path, batch: int, output: str):
    from kronfluence.analyzer import Analyzer, prepare_model
    from kronfluence.arguments import FactorArguments, ScoreArguments

    task = _EagerTask(0, output)
    model = prepare_model(model, task)
    an = Analyzer("direct", model, task, cpu=True, disable_tqdm=True, output_dir=str(tmp_path))
    an.fit_all_factors("f", train_set, per_device_batch_size=batch, factor_args=FactorArguments(strategy="ekfac"))
    args = ScoreArguments(damping_factor=None)
    an.compute_pairwise_scores("p", "f", query_set, train_set, per_device_query_batch_size=len(query_set),
                               per_device_train_batch_size=batch, score_args=args)
    an.compute_self_scores("s", "f", train_set, per_device_train_batch_size=batch, score_args=args)
    return an.load_pairwise_scores("p")["all_modules"], an.load_self_scores("s")["all_modules"]


@pytest.mark.parametrize("output", ["margin", "loss"])
def test_ekfac_scores_are_kronfluences_own_on_the_eager_model(trained, tmp_path, output):
    from models.explain.ekfac import EKFAC
    from models.export.influence import rows

    out, data = trained
    clf = _exported(out)
    a = digits_arrays()
    test_x, test_y = torch.tensor(a["test"][0][:5]), torch.tensor(a["test"][1][:5])
    with EKFAC(clf, output=output, batch_size=32) as ek:
        ek.fit(rows(data.inputs, data.labels))
        mine = ek.scores(rows(test_x, test_y), rows(data.inputs, data.labels))
        mine_self = ek.self_scores(rows(data.inputs, data.labels))
        assert ek.covered == ["layers.conv1", "layers.conv2", "layers.fc"]

    eager = DigitsCNN()
    eager.load_state_dict(parameters(build(out / "model.pt2", SPEC)))
    theirs, theirs_self = _kronfluence_directly(
        eager.eval(), torch.utils.data.TensorDataset(data.inputs, data.labels),
        torch.utils.data.TensorDataset(test_x, test_y), tmp_path, 32, output)
    assert mine.shape == (5, 96) and mine_self.shape == (96,)
    torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4 * float(theirs.abs().max()))
    torch.testing.assert_close(mine_self, theirs_self, rtol=1e-4, atol=1e-4 * float(theirs_self.abs().max()))
    # the scores are no constant: helpful and harmful examples both appear
    assert bool((mine > 0).any()) and bool((mine < 0).any())


def test_a_program_without_linear_or_convolution_calls_says_why(tmp_path):
    from models.explain.ekfac import EKFAC, NotSupported
    from models.export.influence import ProgramModule, classifier
    from models.export.kfac import WHY_NONE, program_layers

    class Matmul(nn.Module):  # a parameter used through matmul: no module Kronfluence knows
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(64, 10))

        def forward(self, x):
            return x.flatten(1) @ self.w

    program = torch.export.export(Matmul().eval(), (torch.zeros(2, 1, 8, 8),),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=1024)},))
    torch.export.save(program, str(tmp_path / "model.pt2"))
    exported = build(tmp_path / "model.pt2", SPEC)
    assert program_layers(exported.info) == []
    clf = classifier(ProgramModule(exported), [])
    assert clf.kfac_problem == WHY_NONE and "aten.linear" in WHY_NONE
    with pytest.raises(NotSupported, match="nn.Linear and nn.Conv2d"):
        EKFAC(clf)


def test_shared_and_decomposed_layers_are_left_out(tmp_path):
    """A weight two calls use, and a program decomposed to core ATen (addmm, convolution), give no layer."""
    from models.export.files import inspect_program
    from models.export.kfac import program_layers

    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 64, bias=False)  # shared by two calls, no bias: the weight alone decides
            self.out = nn.Linear(64, 10, bias=False)

        def forward(self, x):
            return self.out(self.fc(self.fc(x.flatten(1))))

    program = torch.export.export(Shared().eval(), (torch.zeros(2, 1, 8, 8),))
    torch.export.save(program, str(tmp_path / "shared.pt2"))
    assert [(layer.name, layer.bias) for layer in program_layers(inspect_program(tmp_path / "shared.pt2"))] == \
        [("out", None)]

    class SharedBias(nn.Module):  # two layers with their own weights and one bias
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(64, 10), nn.Linear(10, 10), nn.Linear(10, 10)
            self.c.bias = self.b.bias

        def forward(self, x):
            return self.c(self.b(self.a(x.flatten(1))))

    torch.export.save(torch.export.export(SharedBias().eval(), (torch.zeros(2, 1, 8, 8),)),
                      str(tmp_path / "bias.pt2"))
    assert [layer.name for layer in program_layers(inspect_program(tmp_path / "bias.pt2"))] == ["a"]
    decomposed = torch.export.export(DigitsCNN().eval(), (torch.zeros(2, 1, 8, 8),)).run_decompositions()
    torch.export.save(decomposed, str(tmp_path / "decomposed.pt2"))
    assert program_layers(inspect_program(tmp_path / "decomposed.pt2")) == []


# ---------------------------------------------------------------------------------------------------- texts
def test_conv1d_becomes_the_linear_of_the_same_map(tmp_path):
    from models.hf.checkpoint import load as load_hf
    from models.hf.influence import TextModule, linear_layers, rows, width
    from tests.hf_fixtures import TEXTS, save_classifier

    clf = load_hf(save_classifier(tmp_path / "gpt2", "gpt2"))
    module = TextModule(clf)
    length = width(clf, TEXTS, 64)
    r = rows(clf, TEXTS, [0, 1, 2, 0, 1], 64, length)
    import copy

    converted = linear_layers(copy.deepcopy(module))
    from transformers.pytorch_utils import Conv1D

    assert not any(isinstance(m, Conv1D) for m in converted.modules())
    assert sum(isinstance(m, nn.Linear) for m in converted.modules()) > sum(isinstance(m, nn.Linear)
                                                                            for m in module.modules())
    ids, mask = r[:, :length].long(), r[:, length:2 * length].long()
    torch.testing.assert_close(converted(ids, mask), module(ids, mask), rtol=1e-5, atol=1e-6)


def test_text_ekfac_scores_are_kronfluences_own(tmp_path):
    """A BERT classifier: the rows (ids, mask, label) through the service's task give the scores Kronfluence
    gives on the Hugging Face model called with its own tokenizer's batches and attention mask."""
    from models.explain.ekfac import EKFAC
    from models.explain.tracin import MemoryCheckpoint
    from models.hf.checkpoint import load as load_hf
    from models.hf.influence import TextModule, classifier, rows, width
    from tests.hf_fixtures import TEXTS, save_classifier

    hf = load_hf(save_classifier(tmp_path / "bert", "bert"))
    module = TextModule(hf)
    labels = [0, 1, 2, 0, 1]
    length = width(hf, TEXTS, 64)
    r = rows(hf, TEXTS, labels, 64, length)
    state = MemoryCheckpoint({k: v.detach().clone() for k, v in module.state_dict().items()}, 1.0)
    clf = classifier(module, [state])
    with EKFAC(clf, batch_size=5) as ek:
        ek.fit(r)
        mine, mine_self = ek.scores(r[:2], r), ek.self_scores(r)

    from kronfluence.analyzer import Analyzer, prepare_model
    from kronfluence.arguments import FactorArguments, ScoreArguments
    from kronfluence.task import Task

    enc = hf.tokenizer(TEXTS, padding="max_length", max_length=length, return_tensors="pt")
    data = [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
             "labels": torch.tensor(labels[i])} for i in range(len(TEXTS))]

    class TextTask(Task):
        def __init__(self):
            super().__init__()
            self.generator = torch.Generator().manual_seed(0)

        def _logits(self, batch, model):
            return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits

        def compute_train_loss(self, batch, model, sample=False):
            logits = self._logits(batch, model)
            y = batch["labels"]
            if sample:
                with torch.no_grad():
                    y = torch.multinomial(torch.softmax(logits.detach().double(), -1), 1,
                                          generator=self.generator).flatten()
            return nn.functional.cross_entropy(logits, y, reduction="sum")

        def compute_measurement(self, batch, model):
            logits, y = self._logits(batch, model), batch["labels"]
            bindex = torch.arange(logits.shape[0])
            others = logits.clone()
            others[bindex, y] = -torch.inf
            return -(logits[bindex, y] - others.logsumexp(-1)).sum()

        def get_attention_mask(self, batch):
            return batch["attention_mask"]

    task = TextTask()
    import copy

    model = prepare_model(copy.deepcopy(hf.model).eval(), task)
    an = Analyzer("text", model, task, cpu=True, disable_tqdm=True, output_dir=str(tmp_path / "kf"))
    args = ScoreArguments(damping_factor=None)
    with _frozen_gc():
        an.fit_all_factors("f", data, per_device_batch_size=5, factor_args=FactorArguments(strategy="ekfac"))
        an.compute_pairwise_scores("p", "f", data[:2], data, per_device_query_batch_size=2,
                                   per_device_train_batch_size=5, score_args=args)
        an.compute_self_scores("s", "f", data, per_device_train_batch_size=5, score_args=args)
    theirs, theirs_self = an.load_pairwise_scores("p")["all_modules"], an.load_self_scores("s")["all_modules"]
    # the rows pass the attention mask in its 4D additive form; the model's own 2D-mask path rounds alike
    torch.testing.assert_close(mine, theirs, rtol=1e-3, atol=1e-3 * float(theirs.abs().max()))
    torch.testing.assert_close(mine_self, theirs_self, rtol=1e-3, atol=1e-3 * float(theirs_self.abs().max()))
