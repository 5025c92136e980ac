"""Vision-BDH trainer: AdamW, accumulation, warmup + cosine, clipping, checkpoints, exact resume, cancellation.

Optimisation. AdamW (``fused=True`` where the build supports it) with decoupled weight decay on the matrices only
(E, E_v, Dec, conv and head weights; not biases, position embedding or CLS token). The learning rate at optimizer
step s (0-based) of S is

    lr(s) = lr · (s + 1) / W                                   for s < W  (linear warmup, W = warmup_steps)
    lr(s) = lr · ½ (1 + cos(π (s − W) / (S − W)))              otherwise  (cosine to zero)

with S = epochs · ⌈batches per epoch / grad_accum_steps⌉. Gradient accumulation sums per-sample losses over the
micro-batches of one optimizer step and divides by the number of samples in that step, so ``batch_size=b,
grad_accum_steps=k`` takes the same steps as ``batch_size=k·b`` (up to dropout draws). The global gradient norm
is clipped to ``grad_clip`` (1.0).

Reproducibility. ``seed`` fixes the initialisation, the validation split, the shuffling and the augmentation (the
sampler draws them from ``(seed, epoch)``); dropout uses the global torch generator, whose state is saved with
every checkpoint. ``deterministic`` also asks torch for deterministic kernels. Resuming from the checkpoint of
epoch e with the same configuration therefore continues exactly as the uninterrupted run: ``epochs`` is the total
number of epochs (the cosine horizon), and a resumed run trains epochs e+1 … ``epochs``.

Resuming compares the whole configuration with the checkpoint's (``compare_resume_config``): a different seed,
split, sample limit, batch size, schedule or model field is refused with one ``ResumeMismatch`` naming every
such field with both values; ``precision``, ``optimizations``, ``deterministic`` and ``compile`` may change (the
continuation is then not bit-exact, with a warning), ``epochs`` may grow (the cosine is re-planned over it), and
every change is reported in ``TrainResult.changed_on_resume``. A run restarted from its own checkpoint (the same
path, or the same ``run_id`` wherever the checkpoint now lies) after its last epoch finishes (evaluates and
returns) instead of failing. Without a ``best`` beside the checkpoint, ``best`` restarts from its weights.

Checkpoints (under ``out_dir/checkpoints``): ``last/`` (weights, optimizer, scaler, RNG, history; rewritten
atomically after every epoch) and ``best/`` (weights of the best validation accuracy); with
``keep_checkpoints="all"`` also ``epoch_NNN/`` (weights of every epoch).

Device work: running loss and accuracy are summed on the device and read once per report (``BatchEvent.loss``
is read lazily), so a CUDA step never waits for a ``.item()``. A non-finite loss raises ``TrainingDiverged``
naming the epoch and batch at the next read. On CUDA, the fast mode (``deterministic=False``) turns on TF32
matmuls and ``cudnn.benchmark``; ``torch.compile`` that fails on any call (first compile, a recompile for a short
batch or eval mode, the backward) falls back to eager mode for the rest of the run with a warning in the result. ``metrics.csv`` holds one row per epoch. Cancellation: ``on_batch_end`` is called after
every micro-batch; returning True stops at once (the partial epoch is dropped, the last checkpoint is kept) and an
exception raised there propagates with the checkpoints on disk intact.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from models.common import autocast, default_device, resolve_precision, seed_everything
from models.curves import StepCurve
from models.tables import TableWriter
from models.vision.bdh import VisionBDH
from models.vision.checkpoint import (
    MODEL_FILE,
    STATE_FILE,
    load_state_dict,
    read_config,
    replace_dir,
    save_model_dir,
)
from models.vision.config import Optimizations, VisionBDHConfig
from models.vision.data import ImageArrays, Loaders, load_arrays, make_loaders
from models.vision.perf import tune_cpu_allocator

log = logging.getLogger(__name__)

COMPILE_MODES = ("off", "default", "max-autotune")
KEEP_CHECKPOINTS = ("last_best", "all")
# Settings that define the run's trajectory: resuming with any of them changed is refused (``epochs`` may grow).
RESUME_FIELDS = ("dataset", "seed", "val_fraction", "max_train_samples", "augment", "batch_size",
                 "grad_accum_steps", "lr", "weight_decay", "warmup_steps", "grad_clip", "label_smoothing", "model")
# Settings that may change on resume but change the numbers: the run goes on, not bit-exactly (a warning says so).
INEXACT_FIELDS = ("precision", "optimizations", "deterministic", "compile")
# Everything else (``epochs`` not below the epochs done, data_dir, num_workers, keep_checkpoints,
# tune_cpu_allocator) may change freely. Every change is reported in ``TrainResult.changed_on_resume``.
LOG_EVERY_BATCHES = 50  # the progress bar reads the running loss (a device sync) this often
CSV_COLUMNS = ["epoch", "train_loss", "val_accuracy", "epoch_time_s", "lr", "train_accuracy", "val_loss"]


class ResumeError(ValueError):
    """The checkpoint to resume from is missing or does not match the requested run."""


class ResumeMismatch(ResumeError):
    """The requested run's configuration differs from the checkpoint's; ``fields`` names the differences."""

    def __init__(self, fields: list[str], saved: dict[str, Any], requested: dict[str, Any]) -> None:
        detail = "; ".join(f"{f}: checkpoint {saved.get(f)!r}, requested {requested.get(f)!r}" for f in fields)
        super().__init__(f"resume_from: the checkpoint was trained with a different {', '.join(fields)} ({detail}); "
                         "the model and the trajectory settings cannot change on resume, and epochs not fall below "
                         "the epochs already done")
        self.fields = fields


class TrainingDiverged(FloatingPointError):
    """The training loss became NaN or infinite."""

    def __init__(self, epoch: int, batch: int, step: int) -> None:
        super().__init__(f"the training loss became non-finite at epoch {epoch}, batch {batch} (optimizer step "
                         f"{step}); lower lr, raise warmup_steps or use precision fp32/bf16")
        self.epoch, self.batch, self.step = epoch, batch, step


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def compare_resume_config(
    saved: dict[str, Any], requested: TrainConfig, epochs_done: int, *, saved_model: dict[str, Any] | None = None,
    requested_model: dict[str, Any] | None = None, saved_precision: str | None = None,
    requested_precision: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Compare the checkpoint's ``saved`` training configuration with ``requested``, field by field (nested ones
    as ``model.n_embd``). Raise one ``ResumeMismatch`` naming every refused difference: a trajectory setting
    (``RESUME_FIELDS``), a model field (also those sized from the data, compared on ``saved_model`` against
    ``requested_model`` when given) or ``epochs`` below ``epochs_done``. Otherwise return every difference as
    ``{field: {"checkpoint": old, "requested": new}}``. ``precision`` compares the resolved precisions when
    both are given (``auto`` may resolve differently on another machine)."""
    want = _flatten(_plain(requested.to_dict()))
    have = _flatten(saved)
    if saved_model is not None and requested_model is not None:
        want.update({f"model.{k}": v for k, v in requested_model.items()})
        have.update({f"model.{k}": v for k, v in saved_model.items()})
    if saved_precision is not None and requested_precision is not None:
        have["precision"], want["precision"] = saved_precision, requested_precision
    diff = {k: {"checkpoint": have[k], "requested": want[k]} for k in want if k in have and have[k] != want[k]}
    refused = [k for k in diff if k.split(".")[0] in RESUME_FIELDS]
    if requested.epochs < epochs_done:
        refused.append("epochs")
    if refused:
        raise ResumeMismatch(refused, have, want)
    return diff


@dataclass
class TrainConfig:
    """Everything that defines a training run (the API's request, minus service fields)."""

    dataset: str = "digits"
    data_dir: str | None = None
    epochs: int = 10
    batch_size: int = 64
    grad_accum_steps: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_steps: int = 50
    grad_clip: float = 1.0
    model: VisionBDHConfig = field(default_factory=VisionBDHConfig)
    optimizations: Optimizations = field(default_factory=Optimizations)
    compile: str = "off"
    precision: str = "auto"
    deterministic: bool = False
    seed: int = 0
    val_fraction: float = 0.1
    max_train_samples: int | None = None
    augment: bool = True
    label_smoothing: float = 0.0
    num_workers: int = 0
    keep_checkpoints: str = "last_best"
    tune_cpu_allocator: bool = True

    def __post_init__(self) -> None:
        if self.epochs <= 0:
            raise ValueError("epochs must be positive")
        if self.batch_size <= 0 or self.grad_accum_steps <= 0:
            raise ValueError("batch_size and grad_accum_steps must be positive")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"compile must be one of {COMPILE_MODES}, got {self.compile!r}")
        if self.keep_checkpoints not in KEEP_CHECKPOINTS:
            raise ValueError(f"keep_checkpoints must be one of {KEEP_CHECKPOINTS}, got {self.keep_checkpoints!r}")
        if isinstance(self.model, dict):
            self.model = VisionBDHConfig.from_dict(self.model)
        if isinstance(self.optimizations, dict):
            self.optimizations = Optimizations(**self.optimizations)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class BatchEvent:
    """What ``on_batch_end`` sees after each micro-batch."""

    epoch: int
    epochs: int
    batch: int
    batches_per_epoch: int
    done_batches: int
    total_batches: int
    lr: float
    history: list[dict[str, float]]
    loss_sum: torch.Tensor | float = 0.0
    seen: int = 1
    steps: StepCurve | None = None  # the run's per-step running-loss curve so far (``steps.rows()``)

    @property
    def loss(self) -> float:
        """Running mean training loss of the epoch. Reading it synchronises with the device, so the loop never
        does it per micro-batch; a consumer reads it when it reports."""
        return float(self.loss_sum) / max(self.seen, 1)


@dataclass
class TrainResult:
    history: list[dict[str, float]]
    best_epoch: int | None
    best_val_accuracy: float | None
    test_accuracy: float | None
    parameters: int
    expected_parameters: int
    epochs_completed: int
    canceled: bool
    out_dir: Path
    checkpoints: dict[str, str]
    device: str
    precision: str
    optimizer: str
    model_config: dict[str, Any]
    n_train: int
    n_val: int
    n_test: int
    warnings: list[str] = field(default_factory=list)
    changed_on_resume: dict[str, dict[str, Any]] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)  # the per-step running loss (models.curves)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["out_dir"] = str(self.out_dir)
        return d


# -- pieces --------------------------------------------------------------------------------------------------------


def lr_at(step: int, base_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warmup over ``warmup_steps`` optimizer steps, then cosine decay to zero at ``total_steps``."""
    warmup = min(warmup_steps, max(total_steps - 1, 0))
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on the matrices (≥2-D weights); none on biases, the position embedding and the CLS token."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or name in ("pos_embed", "cls") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(groups: list[dict[str, Any]], lr: float) -> tuple[torch.optim.Optimizer, str]:
    """AdamW with ``fused=True`` when this build supports it for the parameters' device, else ``foreach``."""
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=True), "adamw-fused"
    except (RuntimeError, ValueError) as exc:  # fused kernels missing for this device/dtype in this build
        log.warning("fused AdamW unavailable (%s); using foreach", exc)
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), foreach=True), "adamw-foreach"


@torch.no_grad()
def evaluate(
    model: Callable[[torch.Tensor], torch.Tensor], loader: torch.utils.data.DataLoader, device: torch.device,
    precision: str | None,
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy over ``loader``. ``model`` is a module (put in eval mode and called under
    autocast for ``precision``) or, with ``precision=None``, a callable returning logits."""
    module = model if isinstance(model, torch.nn.Module) else None
    was_training = module.training if module is not None else False
    if module is not None:
        module.eval()
    total, correct, loss_sum = 0, 0, 0.0
    for images, labels in loader:
        images = _to_device(images, device)
        labels = labels.to(device, non_blocking=True)
        if precision is None:
            logits = model(images)
        else:
            with autocast(device, precision):
                logits = model(images)
        logits = logits.float()
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += (logits.argmax(dim=1) == labels).sum().item()
        total += labels.numel()
    if module is not None:
        module.train(was_training)
    return loss_sum / max(total, 1), correct / max(total, 1)


def _to_device(images: torch.Tensor, device: torch.device) -> torch.Tensor:
    return images.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)


def _write_csv(path: Path, history: list[dict[str, float]]) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        TableWriter(fh, CSV_COLUMNS).rows([row[k] for k in CSV_COLUMNS] for row in history)
    tmp.replace(path)


def find_checkpoint(path: Path | str) -> Path:
    """The ``last`` checkpoint directory of a run directory, its ``checkpoints`` directory, or itself."""
    path = Path(path)
    for candidate in (path, path / "last", path / "checkpoints" / "last"):
        if (candidate / STATE_FILE).is_file() and (candidate / MODEL_FILE).is_file():
            return candidate
    raise ResumeError(f"no resumable checkpoint under {path} (expected checkpoints/last/{STATE_FILE})")


# -- the loop ------------------------------------------------------------------------------------------------------


def train(
    config: TrainConfig,
    out_dir: Path | str,
    *,
    device: torch.device | str | None = None,
    data: ImageArrays | None = None,
    resume_from: Path | str | None = None,
    on_batch_end: Callable[[BatchEvent], bool | None] | None = None,
    stop_after_epoch: int | None = None,
    progress_bar: bool = False,
    run_id: str | None = None,
) -> TrainResult:
    """Train Vision-BDH per ``config`` into ``out_dir``; see the module docstring for the semantics.

    ``data`` overrides loading ``config.dataset``; ``stop_after_epoch`` ends the run early after that epoch (the
    schedule still spans ``config.epochs``), which is how an interrupted run is simulated in tests. ``run_id``
    names the run (the job id) in its checkpoints: a checkpoint with the same ``run_id`` is this run's own
    wherever it is read from (the store, another host), so a restart after the last epoch just finishes.
    The process-wide determinism switches are restored on return, since a worker runs many jobs.
    """
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
                torch.backends.cudnn.allow_tf32)
    try:
        return _train(config, Path(out_dir), device, data, resume_from, on_batch_end, stop_after_epoch, progress_bar,
                      run_id)
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.backends.cudnn.benchmark = previous[2]
        torch.backends.cuda.matmul.allow_tf32 = previous[3]
        torch.backends.cudnn.allow_tf32 = previous[4]


def _device_modes(device: torch.device, deterministic: bool) -> None:
    """Fast mode on CUDA: TF32 matmuls and convolutions, cuDNN autotuning. Deterministic mode: neither (TF32
    results depend on the kernel chosen, autotuning picks per run), and ``seed_everything`` has made torch
    raise on non-deterministic kernels."""
    if device.type != "cuda":
        return
    fast = not deterministic
    torch.backends.cuda.matmul.allow_tf32 = fast
    torch.backends.cudnn.allow_tf32 = fast
    torch.backends.cudnn.benchmark = fast


def _prepare_process(config: TrainConfig, device: torch.device) -> str:
    """Seeds, determinism and device switches, the CPU allocator; returns the resolved precision."""
    precision = resolve_precision(config.precision, device, cuda_half="bf16", cpu_native_bf16=True)
    seed_everything(config.seed, config.deterministic)
    _device_modes(device, config.deterministic)
    if device.type == "cpu" and config.tune_cpu_allocator:
        tune_cpu_allocator()
    return precision


@dataclass
class _Model:
    """The model and what trains it, plus the metadata written with every checkpoint."""

    config: VisionBDHConfig
    model: VisionBDH
    optimizer: torch.optim.Optimizer
    optimizer_name: str
    scaler: torch.amp.GradScaler
    meta: dict[str, Any]


def _build_model(
    config: TrainConfig, data: ImageArrays, loaders: Loaders, device: torch.device, precision: str
) -> _Model:
    """Vision-BDH sized for the data (classes, image size, channels), AdamW and the fp16 gradient scaler."""
    model_config = dataclasses.replace(
        config.model, num_classes=loaders.num_classes, img_size=int(data.train_images.shape[-1]),
        in_channels=int(data.train_images.shape[1]),
    )
    model = VisionBDH(model_config, config.optimizations).to(device, memory_format=torch.channels_last)
    optimizer, optimizer_name = make_optimizer(param_groups(model, config.weight_decay), config.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    meta = {"classes": loaders.classes, "mean": loaders.mean, "std": loaders.std, "dataset": data.name}
    return _Model(model_config, model, optimizer, optimizer_name, scaler, meta)


@dataclass
class _RunState:
    """What the ``last`` checkpoint carries besides weights, optimizer and RNG: the history, the best epoch so
    far and the position in the schedule (the next epoch, optimizer steps taken)."""

    history: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int | None = None
    best_acc: float | None = None
    start_epoch: int = 1
    step: int = 0
    warnings: list[str] = field(default_factory=list)
    changed: dict[str, dict[str, Any]] = field(default_factory=dict)
    steps_state: dict[str, Any] | None = None  # the step curve saved with the checkpoint


def _read_resume_state(
    last: Path, config: TrainConfig, ckpt_dir: Path, m: _Model, precision: str, run_id: str | None
) -> tuple[dict, dict[str, dict[str, Any]]]:
    """The trainer state of checkpoint ``last`` and the settings changed since (``compare_resume_config``);
    refused when a model or trajectory setting differs, or when another run's checkpoint has no epoch left."""
    state = torch.load(last / STATE_FILE, map_location="cpu", weights_only=True)
    saved_meta = read_config(last)
    changed = compare_resume_config(
        state.get("train_config") or {}, config, int(state["epoch"]), saved_model=saved_meta["model"],
        requested_model=m.config.to_dict(), saved_precision=state.get("precision"), requested_precision=precision,
    )
    # A restart of this run after its last epoch (the worker stopped before registering) just finishes: its own
    # checkpoint is the one under out_dir, or one saved with the same run_id (the job id) wherever it is now.
    own = last.resolve() == (ckpt_dir / "last").resolve() or (
        run_id is not None and saved_meta.get("run_id") == run_id)
    if state["epoch"] >= config.epochs and not own:
        raise ResumeError(f"the checkpoint already has {state['epoch']} epochs; ask for more than that")
    return state, changed


def _resume(
    resume_from: Path | str, config: TrainConfig, ckpt_dir: Path, m: _Model, device: torch.device, precision: str,
    run_id: str | None,
) -> _RunState:
    """Restore weights, optimizer, scaler and RNG from the checkpoint; its ``best`` is copied into this run.

    Without a ``best`` beside the checkpoint (only ``last`` was kept), ``best`` restarts from the checkpoint's
    weights and epoch, with a warning. A scaler state is loaded only when the checkpoint has one (it was trained
    in fp16); otherwise an fp16 run starts with a fresh scaler."""
    last = find_checkpoint(resume_from)
    state, changed = _read_resume_state(last, config, ckpt_dir, m, precision, run_id)
    m.model.load_state_dict(load_state_dict(last))
    m.optimizer.load_state_dict(state["optimizer"])
    if state.get("scaler"):
        m.scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng_cpu"])
    if device.type == "cuda" and state.get("rng_cuda") is not None:
        torch.cuda.set_rng_state(state["rng_cuda"], device)
    run = _RunState(history=list(state["history"]), best_epoch=state["best_epoch"],
                    best_acc=state["best_val_accuracy"], start_epoch=state["epoch"] + 1, step=state["global_step"],
                    changed=changed, steps_state=state.get("steps"))
    inexact = [k for k in changed if k.split(".")[0] in INEXACT_FIELDS]
    if inexact:
        run.warnings.append(f"resumed with {', '.join(inexact)} changed: the run does not continue exactly as an "
                            "uninterrupted one would")
    previous_best = last.parent / "best"
    if previous_best.resolve() != (ckpt_dir / "best").resolve() and (previous_best / MODEL_FILE).is_file():
        shutil.copytree(previous_best, ckpt_dir / "best", dirs_exist_ok=True)
    if not (ckpt_dir / "best" / MODEL_FILE).is_file() and run.history:
        epoch = int(state["epoch"])
        run.best_epoch, run.best_acc = epoch, float(run.history[-1]["val_accuracy"])
        tmp = ckpt_dir / "best.tmp"
        save_model_dir(tmp, m.model, m.config, {**m.meta, "epoch": epoch, "val_accuracy": run.best_acc})
        replace_dir(tmp, ckpt_dir / "best")
        run.warnings.append(f"no checkpoints/best beside the checkpoint resumed from: best restarts from its "
                            f"epoch {epoch} (val accuracy {run.best_acc:.4f})")
    return run


class _Forward:
    """Every compiled call of the run: ``torch.compile`` unless off. Any call through the compiled model that fails
    (the first compile, a recompile for a new shape such as a short last batch or for eval mode, or the compiled
    backward) switches the run to eager mode for good, with one warning, and is redone eagerly: the global RNG
    state is restored first, so the redone micro-batch draws the same dropout masks."""

    def __init__(self, model: torch.nn.Module, mode: str) -> None:
        self.model, self.mode = model, mode
        self.net: Any = model
        self.warnings: list[str] = []
        self.compiled = mode != "off"
        if self.compiled:
            # static shapes: the short last batch and the evaluation batches get their own graphs (a bounded
            # handful); with torch 2.13 the dynamic-shape recompile for them fails in inductor
            self.net = torch.compile(model, mode=mode, dynamic=False)

    def __call__(self, images: torch.Tensor, device: torch.device, precision: str) -> torch.Tensor:
        """The forward pass (logits) under autocast, guarded."""
        return self.guarded(lambda: self._logits(images, device, precision), device)

    def _logits(self, images: torch.Tensor, device: torch.device, precision: str) -> torch.Tensor:
        with autocast(device, precision):
            return self.net(images)

    def guarded(self, fn: Callable[[], Any], device: torch.device, before_retry: Callable[[], None] | None = None
                ) -> Any:
        """``fn()`` (which calls ``self.net``); when compiled and it fails, fall back to eager mode, restore the
        RNG, call ``before_retry`` and run ``fn()`` again."""
        if not self.compiled:
            return fn()
        rng_cpu = torch.get_rng_state()
        rng_cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - any compiler failure; eager mode is always available
            self.fall_back(exc)
        torch.set_rng_state(rng_cpu)
        if rng_cuda is not None:
            torch.cuda.set_rng_state(rng_cuda, device)
        if before_retry is not None:
            before_retry()
        return fn()

    def fall_back(self, exc: BaseException) -> None:
        self.compiled = False
        self.net = self.model
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        self.warnings.append(f"torch.compile(mode={self.mode!r}) failed ({type(exc).__name__}: {first}); "
                             "continued in eager mode")
        log.warning(self.warnings[-1])

    def train(self, mode: bool = True) -> None:
        self.model.train(mode)
        if isinstance(self.net, torch.nn.Module) and self.net is not self.model:
            self.net.train(mode)

    @torch.no_grad()
    def evaluate(self, loader: torch.utils.data.DataLoader, device: torch.device, precision: str
                 ) -> tuple[float, float]:
        """Mean cross-entropy and accuracy over ``loader`` in eval mode, each batch's forward guarded."""
        was_training = self.model.training
        self.train(False)
        try:
            return evaluate(lambda images: self(images, device, precision), loader, device, None)
        finally:
            self.train(was_training)


@dataclass
class _Schedule:
    """Micro-batches and optimizer steps of the run (``epochs`` is the cosine horizon)."""

    batches_per_epoch: int
    accum: int
    total_steps: int
    total_batches: int
    group_samples: list[int]  # samples in the optimizer step of micro-batch i (an epoch's last may be short)

    @classmethod
    def plan(cls, config: TrainConfig, n_train: int) -> _Schedule:
        bs, accum = config.batch_size, config.grad_accum_steps
        batches_per_epoch = math.ceil(n_train / bs)
        steps_per_epoch = math.ceil(batches_per_epoch / accum)
        batch_sizes = [min(bs, n_train - i * bs) for i in range(batches_per_epoch)]
        group_samples = [sum(batch_sizes[(i // accum) * accum : (i // accum + 1) * accum])
                         for i in range(batches_per_epoch)]
        return cls(batches_per_epoch=batches_per_epoch, accum=accum, total_steps=config.epochs * steps_per_epoch,
                   total_batches=config.epochs * batches_per_epoch, group_samples=group_samples)

    def ends_step(self, i: int) -> bool:
        """Micro-batch ``i`` completes an optimizer step."""
        return (i + 1) % self.accum == 0 or i + 1 == self.batches_per_epoch

    def log_due(self, i: int) -> bool:
        return (i + 1) % LOG_EVERY_BATCHES == 0 or i + 1 == self.batches_per_epoch


@dataclass
class _EpochSums:
    """Running loss, correct count and first non-finite batch of an epoch, kept on the device: reading them is
    a synchronisation, done only when reported."""

    loss_sum: torch.Tensor
    correct: torch.Tensor
    bad_batch: torch.Tensor
    seen: int = 0

    @classmethod
    def zeros(cls, device: torch.device) -> _EpochSums:
        return cls(loss_sum=torch.zeros((), device=device, dtype=torch.float64),
                   correct=torch.zeros((), device=device, dtype=torch.int64),
                   bad_batch=torch.full((), -1, device=device, dtype=torch.int64))

    def add(self, i: int, batch_loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        self.loss_sum += batch_loss.detach()
        self.correct += (logits.detach().argmax(dim=1) == labels).sum()
        self.bad_batch = torch.where((self.bad_batch < 0) & ~torch.isfinite(batch_loss.detach()), i + 1,
                                     self.bad_batch)
        self.seen += labels.numel()


@dataclass
class _Trainer:
    """The epoch loop over one model: micro-batches, optimizer steps, validation and checkpoints."""

    config: TrainConfig
    out_dir: Path
    device: torch.device
    precision: str
    loaders: Loaders
    m: _Model
    run: _RunState
    on_batch_end: Callable[[BatchEvent], bool | None] | None
    progress_bar: bool
    forward: _Forward = field(init=False)
    schedule: _Schedule = field(init=False)
    params: list[torch.nn.Parameter] = field(init=False)
    lr: float = field(init=False)
    curve: StepCurve = field(init=False)

    def __post_init__(self) -> None:
        self.forward = _Forward(self.m.model, self.config.compile)
        self.schedule = _Schedule.plan(self.config, self.loaders.n_train)
        self.curve = StepCurve.from_state(self.run.steps_state, self.schedule.batches_per_epoch)
        self.params = [p for g in self.m.optimizer.param_groups for p in g["params"]]
        self.lr = lr_at(self.run.step, self.config.lr, self.config.warmup_steps, self.schedule.total_steps)

    @property
    def ckpt_dir(self) -> Path:
        return self.out_dir / "checkpoints"

    def fit(self, stop_after_epoch: int | None) -> tuple[bool, int]:
        """Epochs ``start_epoch`` … ``epochs`` (or to ``stop_after_epoch``); returns (canceled, epochs completed)."""
        epochs_completed = self.run.start_epoch - 1
        for epoch in range(self.run.start_epoch, self.config.epochs + 1):
            t0 = time.perf_counter()
            sums = self.train_epoch(epoch)
            if sums is None:
                return True, epochs_completed
            self.end_epoch(epoch, sums, t0)
            epochs_completed = epoch
            if stop_after_epoch is not None and epoch >= stop_after_epoch:
                break
        return False, epochs_completed

    def train_epoch(self, epoch: int) -> _EpochSums | None:
        """One pass over the training batches; ``None`` when ``on_batch_end`` asked to stop (the partial epoch
        is dropped)."""
        self.loaders.train_sampler.set_epoch(epoch)
        self.forward.train(True)
        sums = _EpochSums.zeros(self.device)
        bar = self._open_bar(epoch)
        canceled = False
        read = [0.0, 0]  # the epoch's loss sum and samples at the curve's last point
        for i, (images, labels) in enumerate(bar if bar is not None else self.loaders.train):
            self.train_batch(i, images, labels, sums)
            self._record_step(epoch, i, sums, read)
            if bar is not None and self.schedule.log_due(i):
                _check_diverged(sums.bad_batch, epoch, self.run.step)
                bar.set_postfix(loss=f"{float(sums.loss_sum) / sums.seen:.4f}", lr=f"{self.lr:.2e}")
            if self.on_batch_end is not None and self.on_batch_end(self._event(epoch, i, sums)):
                canceled = True
                break
        if bar is not None:
            bar.close()
        return None if canceled else sums

    def _record_step(self, epoch: int, i: int, sums: _EpochSums, read: list) -> None:
        """A point of the step curve when one is due (the only per-step read of the device's loss sum, so a
        bounded number of synchronisations per run) or the epoch ends."""
        step = (epoch - 1) * self.schedule.batches_per_epoch + i + 1
        last = i + 1 == self.schedule.batches_per_epoch
        if not (last or self.curve.due(step)):
            return
        total = float(sums.loss_sum)
        self.curve.add(step, total - read[0], sums.seen - read[1], force=last)
        read[0], read[1] = total, sums.seen

    def _open_bar(self, epoch: int) -> Any:
        if not self.progress_bar:
            return None
        from tqdm import tqdm

        return tqdm(self.loaders.train, total=self.schedule.batches_per_epoch,
                    desc=f"epoch {epoch}/{self.config.epochs}", leave=False)

    def _event(self, epoch: int, i: int, sums: _EpochSums) -> BatchEvent:
        per_epoch = self.schedule.batches_per_epoch
        return BatchEvent(
            epoch=epoch, epochs=self.config.epochs, batch=i + 1, batches_per_epoch=per_epoch,
            done_batches=(epoch - 1) * per_epoch + i + 1, total_batches=self.schedule.total_batches,
            lr=self.lr, history=self.run.history, loss_sum=sums.loss_sum, seen=sums.seen, steps=self.curve,
        )

    def train_batch(self, i: int, images: torch.Tensor, labels: torch.Tensor, sums: _EpochSums) -> None:
        """Forward and backward of micro-batch ``i`` (its loss scaled by its step's sample count), the optimizer
        step when the micro-batch completes one, and the running sums."""
        images = _to_device(images, self.device)
        labels = labels.to(self.device, non_blocking=True)

        def forward_backward() -> tuple[torch.Tensor, torch.Tensor]:
            logits = self.forward._logits(images, self.device, self.precision)
            batch_loss = F.cross_entropy(
                logits.float(), labels, reduction="sum", label_smoothing=self.config.label_smoothing
            )
            self.m.scaler.scale(batch_loss / self.schedule.group_samples[i]).backward()
            return logits, batch_loss

        def clear_partial_gradients() -> None:
            # a compiled backward that failed may have accumulated some gradients: a step's first micro-batch
            # starts from none (exact); later ones cannot be told apart from the earlier micro-batches' sums
            if i % self.schedule.accum == 0:
                self.m.optimizer.zero_grad(set_to_none=True)

        logits, batch_loss = self.forward.guarded(forward_backward, self.device, clear_partial_gradients)
        if self.schedule.ends_step(i):
            self.optimizer_step()
        sums.add(i, batch_loss, logits, labels)

    def optimizer_step(self) -> None:
        """Scheduled learning rate, unscale, clip the global gradient norm, step, clear the gradients."""
        optimizer, scaler = self.m.optimizer, self.m.scaler
        self.lr = lr_at(self.run.step, self.config.lr, self.config.warmup_steps, self.schedule.total_steps)
        for group in optimizer.param_groups:
            group["lr"] = self.lr
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(self.params, self.config.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        self.run.step += 1

    def end_epoch(self, epoch: int, sums: _EpochSums, t0: float) -> None:
        """Divergence check, validation, the metrics row (history and ``metrics.csv``), then the checkpoints."""
        _check_diverged(sums.bad_batch, epoch, self.run.step)
        val_loss, val_acc = self.forward.evaluate(self.loaders.val, self.device, self.precision)
        row = {
            "epoch": epoch, "train_loss": float(sums.loss_sum) / sums.seen, "val_accuracy": val_acc,
            "epoch_time_s": time.perf_counter() - t0, "lr": self.lr, "train_accuracy": int(sums.correct) / sums.seen,
            "val_loss": val_loss,
        }
        self.run.history.append(row)
        _write_csv(self.out_dir / "metrics.csv", self.run.history)
        self.save_checkpoints(epoch, val_acc)

    def save_checkpoints(self, epoch: int, val_acc: float) -> None:
        """``best`` when validation accuracy improved, ``epoch_NNN`` with ``keep_checkpoints="all"``, ``last``."""
        m, run, ckpt_dir = self.m, self.run, self.ckpt_dir
        if run.best_acc is None or val_acc > run.best_acc:
            run.best_epoch, run.best_acc = epoch, val_acc
            tmp = ckpt_dir / "best.tmp"
            save_model_dir(tmp, m.model, m.config, {**m.meta, "epoch": epoch, "val_accuracy": val_acc})
            replace_dir(tmp, ckpt_dir / "best")
        if self.config.keep_checkpoints == "all":
            save_model_dir(ckpt_dir / f"epoch_{epoch:03d}", m.model, m.config, {**m.meta, "epoch": epoch})
        _save_last(ckpt_dir, m.model, m.config, m.meta, m.optimizer, m.scaler, self.device, epoch, run.step,
                   run.history, run.best_epoch, run.best_acc, self.config, self.curve.state())

    def test_accuracy(self) -> float:
        """Accuracy of the best checkpoint's weights on the test split (loaded into the eager model)."""
        self.m.model.load_state_dict(load_state_dict(self.ckpt_dir / "best"))
        _, test_acc = self.forward.evaluate(self.loaders.test, self.device, self.precision)
        return test_acc


def _train(
    config: TrainConfig,
    out_dir: Path,
    device: torch.device | str | None,
    data: ImageArrays | None,
    resume_from: Path | str | None,
    on_batch_end: Callable[[BatchEvent], bool | None] | None,
    stop_after_epoch: int | None,
    progress_bar: bool,
    run_id: str | None,
) -> TrainResult:
    ckpt_dir = out_dir / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device(device) if device is not None else default_device()
    precision = _prepare_process(config, device)
    data = data if data is not None else load_arrays(config.dataset, config.data_dir)
    loaders: Loaders = make_loaders(
        data, config.batch_size, config.val_fraction, config.seed, config.augment, config.max_train_samples,
        config.num_workers, pin_memory=device.type == "cuda",
    )
    m = _build_model(config, data, loaders, device, precision)
    m.meta["run_id"] = run_id
    m.meta["precision"] = precision
    run = (_resume(resume_from, config, ckpt_dir, m, device, precision, run_id) if resume_from is not None
           else _RunState())
    trainer = _Trainer(config, out_dir, device, precision, loaders, m, run, on_batch_end, progress_bar)
    canceled, epochs_completed = trainer.fit(stop_after_epoch)
    test_acc = trainer.test_accuracy() if not canceled and run.best_epoch is not None else None

    checkpoints = {p.name: str(p) for p in sorted(ckpt_dir.iterdir()) if p.is_dir()}
    return TrainResult(
        history=run.history, best_epoch=run.best_epoch, best_val_accuracy=run.best_acc, test_accuracy=test_acc,
        parameters=sum(p.numel() for p in m.model.parameters()), expected_parameters=m.config.expected_parameters(),
        epochs_completed=epochs_completed, canceled=canceled, out_dir=out_dir, checkpoints=checkpoints,
        device=str(device), precision=precision, optimizer=m.optimizer_name, model_config=m.config.to_dict(),
        n_train=loaders.n_train, n_val=loaders.n_val, n_test=loaders.n_test,
        warnings=run.warnings + trainer.forward.warnings, changed_on_resume=run.changed, steps=trainer.curve.rows(),
    )


def _check_diverged(bad_batch: torch.Tensor, epoch: int, step: int) -> None:
    """``TrainingDiverged`` when a micro-batch loss of this epoch was non-finite (one device sync)."""
    batch = int(bad_batch)
    if batch >= 0:
        raise TrainingDiverged(epoch, batch, step)


def _save_last(
    ckpt_dir: Path, model: torch.nn.Module, model_config: VisionBDHConfig, meta: dict[str, Any],
    optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, device: torch.device, epoch: int, step: int,
    history: list[dict[str, float]], best_epoch: int | None, best_acc: float | None, config: TrainConfig,
    steps: dict[str, Any] | None = None,
) -> None:
    tmp = ckpt_dir / "last.tmp"
    save_model_dir(tmp, model, model_config, {**meta, "epoch": epoch})
    state = {
        "epoch": epoch, "global_step": step, "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "history": history, "best_epoch": best_epoch, "best_val_accuracy": best_acc,
        "train_config": _plain(config.to_dict()), "precision": meta.get("precision"), "steps": _plain(steps),
    }
    torch.save(state, tmp / STATE_FILE)
    replace_dir(tmp, ckpt_dir / "last")


def _plain(value: Any) -> Any:
    """Only containers of str/int/float/bool/None, so ``torch.load(weights_only=True)`` reads it back."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value



def main(argv: list[str] | None = None) -> None:
    """``python -m models.vision.train --dataset digits --epochs 10 --out var/runs/digits`` (tqdm progress)."""
    import argparse
    import json

    p = argparse.ArgumentParser(description="Train Vision-BDH")
    p.add_argument("--dataset", default="digits", choices=["digits", "cifar10", "cifar100"])
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--grad-accum-steps", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-embd", type=int, default=192)
    p.add_argument("--n-head", type=int, default=6)
    p.add_argument("--mlp-multiplier", type=int, default=32)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--softmax-attention", action="store_true")
    p.add_argument("--cls-token", action="store_true")
    p.add_argument("--compile", default="off", choices=list(COMPILE_MODES))
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "fp16", "bf16"])
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--max-train-samples", type=int, default=None)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--resume-from", type=Path, default=None)
    a = p.parse_args(argv)
    model = VisionBDHConfig(n_layer=a.n_layer, n_embd=a.n_embd, n_head=a.n_head, mlp_multiplier=a.mlp_multiplier,
                            dropout=a.dropout, softmax_attention=a.softmax_attention, cls_token=a.cls_token)
    config = TrainConfig(
        dataset=a.dataset, data_dir=a.data_dir, epochs=a.epochs, batch_size=a.batch_size,
        grad_accum_steps=a.grad_accum_steps, lr=a.lr, weight_decay=a.weight_decay, warmup_steps=a.warmup_steps,
        model=model, compile=a.compile, precision=a.precision, deterministic=a.deterministic, seed=a.seed,
        val_fraction=a.val_fraction, max_train_samples=a.max_train_samples, num_workers=a.num_workers,
    )
    result = train(config, a.out, resume_from=a.resume_from, progress_bar=True)
    for row in result.history:
        print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in row.items()}))
    print(f"best epoch {result.best_epoch}: val {result.best_val_accuracy:.4f}, test {result.test_accuracy}")


if __name__ == "__main__":
    main()
