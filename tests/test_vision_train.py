"""Vision-BDH trainer: accuracy on digits, determinism, exact resume, cancellation, accumulation, schedule."""

from __future__ import annotations

import csv
import dataclasses
from functools import cache
from pathlib import Path

import pytest
import torch

from models.vision.checkpoint import load, load_state_dict
from models.vision.config import VisionBDHConfig
from models.vision.data import ImageArrays, load_arrays
from models.vision.train import (
    CSV_COLUMNS,
    BatchEvent,
    ResumeError,
    ResumeMismatch,
    TrainConfig,
    TrainingDiverged,
    lr_at,
    train,
)

SMALL = VisionBDHConfig(n_layer=2, n_embd=32, n_head=2, mlp_multiplier=8, dropout=0.0)
TINY = VisionBDHConfig(n_layer=1, n_embd=16, n_head=2, mlp_multiplier=2, dropout=0.1)


@cache
def digits() -> ImageArrays:
    return load_arrays("digits")


def tiny_config(**overrides) -> TrainConfig:
    base = dict(dataset="digits", epochs=3, batch_size=16, lr=3e-3, warmup_steps=3, model=TINY, seed=7,
                deterministic=True, max_train_samples=96, val_fraction=0.1, precision="fp32")
    return TrainConfig(**{**base, **overrides})


def comparable(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "epoch_time_s"} for row in history]


@pytest.mark.slow
def test_small_model_learns_digits(tmp_path: Path) -> None:
    """A 28k-parameter Vision-BDH reaches ≥ 0.85 validation accuracy on digits in a few CPU seconds."""
    config = TrainConfig(dataset="digits", epochs=6, batch_size=32, lr=3e-3, warmup_steps=20, model=SMALL, seed=0,
                         deterministic=True, precision="fp32")
    result = train(config, tmp_path, device="cpu", data=digits())
    assert result.best_val_accuracy >= 0.85, result.history
    assert result.test_accuracy is not None and result.test_accuracy >= 0.8
    assert result.parameters == result.expected_parameters == SMALL.expected_parameters()
    assert [row["epoch"] for row in result.history] == list(range(1, 7))
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert list(rows[0]) == CSV_COLUMNS and len(rows) == 6
    ckpts = tmp_path / "checkpoints"
    assert {p.name for p in ckpts.iterdir()} == {"best", "last"}  # no copy per epoch by default
    # the registry loader gives back the best model, which scores the reported test accuracy
    bundle = load(tmp_path, "cpu")
    assert bundle.meta["epoch"] == result.best_epoch and bundle.classes[9] == "9"
    data = digits()
    mean, std = torch.tensor(bundle.mean).view(1, 3, 1, 1), torch.tensor(bundle.std).view(1, 3, 1, 1)
    with torch.no_grad():
        logits = bundle.model((data.test_images.float() / 255 - mean) / std)
    acc = (logits.argmax(1) == data.test_labels).float().mean().item()
    assert acc == pytest.approx(result.test_accuracy, abs=1e-6)


def test_seeded_deterministic_runs_are_identical(tmp_path: Path) -> None:
    a = train(tiny_config(epochs=2), tmp_path / "a", device="cpu", data=digits())
    b = train(tiny_config(epochs=2), tmp_path / "b", device="cpu", data=digits())
    assert comparable(a.history) == comparable(b.history)
    wa, wb = load_state_dict(tmp_path / "a/checkpoints/last"), load_state_dict(tmp_path / "b/checkpoints/last")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    c = train(tiny_config(epochs=2, seed=8), tmp_path / "c", device="cpu", data=digits())
    assert comparable(c.history) != comparable(a.history)


def test_resume_continues_exactly(tmp_path: Path) -> None:
    """2 epochs, then resume for 1, equals 3 straight: weights, optimizer, schedule, dropout RNG, data order."""
    straight = train(tiny_config(), tmp_path / "straight", device="cpu", data=digits())
    first = train(tiny_config(), tmp_path / "first", device="cpu", data=digits(), stop_after_epoch=2)
    assert first.epochs_completed == 2 and first.test_accuracy is not None
    resumed = train(tiny_config(), tmp_path / "resumed", device="cpu", data=digits(), resume_from=tmp_path / "first")
    assert comparable(resumed.history) == comparable(straight.history)
    ws = load_state_dict(tmp_path / "straight/checkpoints/last")
    wr = load_state_dict(tmp_path / "resumed/checkpoints/last")
    assert all(torch.equal(ws[k], wr[k]) for k in ws)
    assert resumed.best_epoch == straight.best_epoch and resumed.test_accuracy == straight.test_accuracy
    # resuming a finished run, or with another architecture, is refused with a reason
    with pytest.raises(ResumeError, match="already has 3 epochs"):
        train(tiny_config(), tmp_path / "again", device="cpu", data=digits(), resume_from=tmp_path / "straight")
    other = dataclasses.replace(TINY, n_embd=32)
    with pytest.raises(ResumeError, match="model.n_embd: checkpoint 16, requested 32"):
        train(tiny_config(epochs=5, model=other), tmp_path / "x", device="cpu", data=digits(),
              resume_from=tmp_path / "first")
    with pytest.raises(ResumeError, match="no resumable checkpoint"):
        train(tiny_config(), tmp_path / "y", device="cpu", data=digits(), resume_from=tmp_path / "nothing")


def test_cancel_at_batch_end_keeps_last_checkpoint(tmp_path: Path) -> None:
    events: list[BatchEvent] = []

    def cancel_in_epoch_two(event: BatchEvent) -> bool:
        events.append(event)
        return event.epoch == 2 and event.batch == 3

    result = train(tiny_config(), tmp_path / "run", device="cpu", data=digits(), on_batch_end=cancel_in_epoch_two)
    assert result.canceled and result.epochs_completed == 1 and result.test_accuracy is None
    assert events[-1].done_batches == events[-1].batches_per_epoch + 3
    assert events[0].total_batches == 3 * events[0].batches_per_epoch == 18
    state = torch.load(tmp_path / "run/checkpoints/last/trainer_state.pt", weights_only=True)
    assert state["epoch"] == 1
    # and the canceled run resumes to the same end point as an uninterrupted one
    resumed = train(tiny_config(), tmp_path / "resumed", device="cpu", data=digits(), resume_from=tmp_path / "run")
    straight = train(tiny_config(), tmp_path / "straight", device="cpu", data=digits())
    assert comparable(resumed.history) == comparable(straight.history)


def test_exception_in_callback_propagates_with_checkpoints_intact(tmp_path: Path) -> None:
    def boom(event: BatchEvent) -> None:
        if event.epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(), tmp_path, device="cpu", data=digits(), on_batch_end=boom)
    assert (tmp_path / "checkpoints/last/model.safetensors").is_file()
    assert not (tmp_path / "checkpoints/last.tmp").exists()


def test_gradient_accumulation_matches_the_big_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The accumulated gradient of 2×16 samples is the gradient of the 32-sample batch (pre-clip norms agree)."""
    norms: list[float] = []
    clip = torch.nn.utils.clip_grad_norm_

    def recording_clip(params, max_norm):  # noqa: ANN001, ANN202
        norm = clip(params, max_norm)
        norms.append(float(norm))
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording_clip)
    model = dataclasses.replace(TINY, dropout=0.0)
    big = train(tiny_config(epochs=1, batch_size=32, model=model, max_train_samples=80), tmp_path / "big",
                device="cpu", data=digits())
    big_norms, norms[:] = list(norms), []
    acc = train(tiny_config(epochs=1, batch_size=16, grad_accum_steps=2, model=model, max_train_samples=80),
                tmp_path / "acc", device="cpu", data=digits())
    assert len(big_norms) == len(norms) == 3  # 80 samples: steps of 32, 32 and 16
    # the first step sees identical weights: the gradients agree to float rounding
    assert norms[0] == pytest.approx(big_norms[0], rel=1e-5)
    # later steps inherit rounding differences that Adam's normalisation amplifies a little
    assert norms == pytest.approx(big_norms, rel=1e-2)
    assert big.history[0]["train_loss"] == pytest.approx(acc.history[0]["train_loss"], rel=1e-3)


def test_lr_schedule_warmup_then_cosine() -> None:
    lrs = [lr_at(s, 1.0, 4, 20) for s in range(20)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[4] == 1.0 and all(a > b for a, b in zip(lrs[4:], lrs[5:], strict=False))
    assert lrs[12] == pytest.approx(0.5)  # half-way through the cosine
    assert lr_at(0, 1.0, 0, 10) == 1.0


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="epochs"):
        TrainConfig(epochs=0)
    with pytest.raises(ValueError, match="compile"):
        TrainConfig(compile="fast")
    assert TrainConfig(model={"n_layer": 1}).model.n_layer == 1


def test_determinism_switch_is_restored(tmp_path: Path) -> None:
    assert not torch.are_deterministic_algorithms_enabled()
    train(tiny_config(epochs=1, max_train_samples=32), tmp_path, device="cpu", data=digits())
    assert not torch.are_deterministic_algorithms_enabled()


def test_resume_refuses_a_different_configuration_naming_the_fields(tmp_path: Path) -> None:
    train(tiny_config(), tmp_path / "first", device="cpu", data=digits(), stop_after_epoch=2)  # 2 of 3 done
    for overrides, fields in [({"seed": 8}, ["seed"]), ({"batch_size": 32, "lr": 1e-3}, ["batch_size", "lr"]),
                              ({"max_train_samples": 64, "val_fraction": 0.2}, ["val_fraction", "max_train_samples"]),
                              ({"warmup_steps": 5}, ["warmup_steps"]), ({"epochs": 1}, ["epochs"])]:
        with pytest.raises(ResumeMismatch) as err:
            train(tiny_config(**overrides), tmp_path / "x", device="cpu", data=digits(),
                  resume_from=tmp_path / "first")
        assert sorted(err.value.fields) == sorted(fields)
        for f in fields:
            assert f in str(err.value)
    # a longer run is allowed, and so are settings that do not change the trajectory
    longer = train(tiny_config(epochs=4, keep_checkpoints="all"), tmp_path / "longer", device="cpu",
                   data=digits(), resume_from=tmp_path / "first")
    assert [r["epoch"] for r in longer.history] == [1, 2, 3, 4]
    assert {"epoch_003", "epoch_004"} <= {p.name for p in (tmp_path / "longer/checkpoints").iterdir()}


def test_a_run_restarted_after_its_last_epoch_finishes(tmp_path: Path) -> None:
    first = train(tiny_config(epochs=2), tmp_path / "run", device="cpu", data=digits())
    again = train(tiny_config(epochs=2), tmp_path / "run", device="cpu", data=digits(),
                  resume_from=tmp_path / "run")
    assert again.epochs_completed == 2 and not again.canceled
    assert comparable(again.history) == comparable(first.history)
    assert again.test_accuracy == first.test_accuracy and again.best_epoch == first.best_epoch


def test_compile_failure_falls_back_to_eager_with_a_warning(tmp_path: Path, monkeypatch) -> None:
    def broken_compile(model, mode=None, **kwargs):  # noqa: ANN001, ANN003, ANN202
        def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            raise RuntimeError("backend failed: no C compiler\ndetails")
        return call

    monkeypatch.setattr(torch, "compile", broken_compile)
    result = train(tiny_config(epochs=1, compile="default"), tmp_path, device="cpu", data=digits())
    assert result.epochs_completed == 1 and result.history[0]["val_accuracy"] > 0
    assert len(result.warnings) == 1 and "backend failed: no C compiler" in result.warnings[0]
    assert "eager" in result.warnings[0]


def test_a_diverging_loss_fails_naming_epoch_and_batch(tmp_path: Path) -> None:
    with pytest.raises(TrainingDiverged, match="epoch 1, batch 2") as err:
        train(tiny_config(epochs=1, lr=float("inf"), warmup_steps=0), tmp_path, device="cpu", data=digits())
    assert err.value.epoch == 1


def test_running_loss_is_read_lazily(tmp_path: Path) -> None:
    losses: list[float] = []
    result = train(tiny_config(epochs=1), tmp_path, device="cpu", data=digits(),
                   on_batch_end=lambda e: losses.append(e.loss) if e.batch == e.batches_per_epoch else None)
    assert losses == [pytest.approx(result.history[0]["train_loss"])]


class _FakeCompiled(torch.nn.Module):
    """A stand-in for ``torch.compile``'s module that runs the model but raises when ``fails(model, images)``."""

    def __init__(self, model: torch.nn.Module, fails) -> None:  # noqa: ANN001
        super().__init__()
        self._orig_mod = model
        self.fails = fails

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.fails(self._orig_mod, images):
            raise RuntimeError("recompile failed: inductor error\ndetails")
        return self._orig_mod(images)


def _fake_compile(monkeypatch: pytest.MonkeyPatch, fails) -> None:  # noqa: ANN001
    monkeypatch.setattr(torch, "compile", lambda model, mode=None, **kwargs: _FakeCompiled(model, fails))


def test_compile_failing_on_the_short_last_batch_falls_back(tmp_path: Path, monkeypatch) -> None:
    shapes: set = set()

    def new_shape(model, images):  # noqa: ANN001, ANN202
        if shapes and tuple(images.shape) not in shapes:
            return True
        shapes.add(tuple(images.shape))
        return False

    _fake_compile(monkeypatch, new_shape)
    config = tiny_config(epochs=2, compile="default", batch_size=20)  # 86 training samples: a short last batch
    result = train(config, tmp_path, device="cpu", data=digits())
    assert result.n_train % 20 != 0
    assert result.epochs_completed == 2 and result.test_accuracy is not None
    assert len(result.warnings) == 1 and "recompile failed" in result.warnings[0] and "eager" in result.warnings[0]


def test_compile_failing_in_eval_mode_falls_back(tmp_path: Path, monkeypatch) -> None:
    _fake_compile(monkeypatch, lambda model, images: not model.training)
    result = train(tiny_config(epochs=2, compile="default"), tmp_path, device="cpu", data=digits())
    assert result.epochs_completed == 2 and result.test_accuracy is not None
    assert len(result.warnings) == 1 and "recompile failed" in result.warnings[0]


def test_compile_fallback_in_training_repeats_the_batch_exactly(tmp_path: Path, monkeypatch) -> None:
    """A compiled call that fails mid-run is redone eagerly with the same dropout draws: same result as eager."""
    eager = train(tiny_config(epochs=2), tmp_path / "eager", device="cpu", data=digits())
    calls = {"n": 0}

    def fifth_call(model, images):  # noqa: ANN001, ANN202
        calls["n"] += 1
        if calls["n"] == 5:
            torch.rand(3)  # a failing compiled call may have drawn from the generator before failing
            return True
        return False

    _fake_compile(monkeypatch, fifth_call)
    fallen = train(tiny_config(epochs=2, compile="default"), tmp_path / "fallen", device="cpu", data=digits())
    assert len(fallen.warnings) == 1
    assert comparable(fallen.history) == comparable(eager.history)


def test_own_checkpoint_copied_elsewhere_after_the_last_epoch_finishes_without_best(tmp_path: Path) -> None:
    """A job restarted on another host finds its own ``checkpoints/last`` in the store (not under its out_dir, and
    without ``checkpoints/best``): it evaluates and returns instead of refusing a finished checkpoint."""
    import shutil

    first = train(tiny_config(epochs=2), tmp_path / "host1", device="cpu", data=digits(), run_id="job-1")
    store = tmp_path / "store/artifacts/job-1/checkpoints/last"
    shutil.copytree(tmp_path / "host1/checkpoints/last", store)
    again = train(tiny_config(epochs=2), tmp_path / "host2", device="cpu", data=digits(), resume_from=store,
                  run_id="job-1")
    assert again.epochs_completed == 2 and not again.canceled
    assert comparable(again.history) == comparable(first.history)
    assert again.test_accuracy is not None and (tmp_path / "host2/checkpoints/best").is_dir()
    assert again.best_epoch == 2 and any("checkpoints/best" in w for w in again.warnings)
    # another run's finished checkpoint still has nothing left to train
    with pytest.raises(ResumeError, match="already has 2 epochs"):
        train(tiny_config(epochs=2), tmp_path / "other", device="cpu", data=digits(), resume_from=store,
              run_id="job-2")


def test_resume_without_best_trains_on_and_measures_the_test_accuracy(tmp_path: Path) -> None:
    import shutil

    train(tiny_config(), tmp_path / "first", device="cpu", data=digits(), stop_after_epoch=2)
    shutil.copytree(tmp_path / "first/checkpoints/last", tmp_path / "copy/last")  # no best beside it
    state_file = tmp_path / "copy/last/trainer_state.pt"
    state = torch.load(state_file, weights_only=True)
    state.update(best_epoch=1, best_val_accuracy=1.0)  # a best that no later epoch beats, and its weights gone
    torch.save(state, state_file)
    result = train(tiny_config(), tmp_path / "second", device="cpu", data=digits(), resume_from=tmp_path / "copy")
    assert result.epochs_completed == 3 and result.test_accuracy is not None
    assert result.best_epoch in (2, 3) and (tmp_path / "second/checkpoints/best").is_dir()


def test_resume_refuses_a_model_change_with_one_error_naming_every_field(tmp_path: Path) -> None:
    train(tiny_config(), tmp_path / "first", device="cpu", data=digits(), stop_after_epoch=1)
    changed = dataclasses.replace(TINY, n_embd=32, dropout=0.0)
    with pytest.raises(ResumeMismatch) as err:
        train(tiny_config(model=changed, seed=8), tmp_path / "x", device="cpu", data=digits(),
              resume_from=tmp_path / "first")
    assert sorted(err.value.fields) == ["model.dropout", "model.n_embd", "seed"]
    for text in ("model.n_embd: checkpoint 16, requested 32", "model.dropout: checkpoint 0.1, requested 0.0",
                 "seed: checkpoint 7, requested 8"):
        assert text in str(err.value)


def test_resume_records_allowed_changes(tmp_path: Path) -> None:
    train(tiny_config(), tmp_path / "first", device="cpu", data=digits(), stop_after_epoch=1)
    result = train(tiny_config(epochs=4, deterministic=False, precision="bf16", keep_checkpoints="all",
                               optimizations={"fast_dropout": False}),
                   tmp_path / "second", device="cpu", data=digits(), resume_from=tmp_path / "first")
    assert result.changed_on_resume == {
        "epochs": {"checkpoint": 3, "requested": 4},
        "precision": {"checkpoint": "fp32", "requested": "bf16"},
        "deterministic": {"checkpoint": True, "requested": False},
        "optimizations.fast_dropout": {"checkpoint": True, "requested": False},
        "keep_checkpoints": {"checkpoint": "last_best", "requested": "all"},
    }
    assert any("not continue exactly" in w for w in result.warnings)
    same = train(tiny_config(epochs=4), tmp_path / "third", device="cpu", data=digits(),
                 resume_from=tmp_path / "first")
    assert same.changed_on_resume == {"epochs": {"checkpoint": 3, "requested": 4}} and not same.warnings


def test_a_checkpoint_without_scaler_state_resumed_in_fp16_gets_a_fresh_scaler(tmp_path: Path, monkeypatch) -> None:
    train(tiny_config(precision="bf16"), tmp_path / "first", device="cpu", data=digits(), stop_after_epoch=1)
    import models.vision.train as train_module

    monkeypatch.setattr(train_module, "resolve_precision", lambda *a, **k: "fp16")  # CPU maps fp16 to bf16
    result = train(tiny_config(precision="fp16"), tmp_path / "second", device="cpu", data=digits(),
                   resume_from=tmp_path / "first")
    assert result.epochs_completed == 3 and result.precision == "fp16"
    assert result.changed_on_resume["precision"] == {"checkpoint": "bf16", "requested": "fp16"}
    state = torch.load(tmp_path / "second/checkpoints/last/trainer_state.pt", weights_only=True)
    assert state["scaler"]["scale"] > 0  # a working, enabled scaler was saved


@pytest.mark.slow  # the real torch.compile: forward and backward, the short last batch's recompile, eval mode
def test_real_compile_trains_short_batches_and_evaluates(tmp_path: Path) -> None:
    config = tiny_config(epochs=1, compile="default", batch_size=20, max_train_samples=50)
    result = train(config, tmp_path, device="cpu", data=digits())
    assert result.n_train % 20 != 0
    assert result.epochs_completed == 1 and result.test_accuracy is not None
    assert result.warnings == []  # compiled throughout, no fallback
