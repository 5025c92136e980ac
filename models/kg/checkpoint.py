"""ConvE model directories: safetensors checkpoints with their epoch and learning rate, and the loader.

Layout of a model directory::

    config.json                 model config, training settings, the checkpoint list [{file, epoch, lr}]
    model.safetensors           final weights (state dict, BN running statistics included)
    checkpoints/epoch_0005.safetensors   one per saved epoch; metadata {"epoch", "lr"}
    checkpoints/epoch_0005.adam.safetensors   (optional) the Adam state at that checkpoint: per parameter
                                ``<name>.exp_avg`` and ``<name>.exp_avg_sq``; metadata {"step", "beta1", "beta2",
                                "eps", "weight_decay"}. Written when training is asked for it (the evaluations'
                                full-data models, which ``tracin_adam`` runs on); it holds twice the parameters, so
                                a checkpoint with it takes three times the space of one without.
    data/                       the triples (names, fixed id dictionaries, labels), so the model is self-contained
    metrics.json                filtered MRR / Hits@k on valid and test
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, safe_open, save_file

from models.kg.conve import ConvE, ConvEConfig
from models.kg.triples import TriplesDataset, load_triples_dir, write_dataset_dir

FORMAT = "explainq-conve-v1"


@dataclass
class CheckpointInfo:
    """One saved checkpoint: TracIn weights its gradient dot products by ``lr``; ``optimizer``: the file of the Adam
    state at the checkpoint (None when training did not keep it)."""

    path: Path
    epoch: int
    lr: float
    optimizer: Path | None = None

    @property
    def name(self) -> str:
        return self.path.stem

    def state_dict(self, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        return load_file(str(self.path), device=str(device))


def save_checkpoint(model: ConvE, path: Path, epoch: int, lr: float) -> CheckpointInfo:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata={"epoch": str(epoch), "lr": repr(float(lr)), "format": FORMAT})
    return CheckpointInfo(path, epoch, float(lr))


@dataclass
class AdamState:
    """Adam's state at a checkpoint: the moment estimates per parameter name, the number of steps taken and the
    hyper-parameters (``torch.optim.Adam``'s)."""

    exp_avg: dict[str, torch.Tensor]
    exp_avg_sq: dict[str, torch.Tensor]
    step: int
    beta1: float
    beta2: float
    eps: float
    weight_decay: float


def optimizer_path(path: Path) -> Path:
    """Where the Adam state of the checkpoint at ``path`` is written: ``epoch_0005.adam.safetensors``."""
    return path.with_name(path.stem + ".adam.safetensors")


def save_adam_state(opt: torch.optim.Optimizer, model: torch.nn.Module, path: Path) -> Path:
    """Write ``opt``'s state (a ``torch.optim.Adam`` over ``model``'s parameters, one group) beside the
    checkpoint at ``path``; returns the file."""
    if type(opt) is not torch.optim.Adam or len(opt.param_groups) != 1:
        raise ValueError("only a torch.optim.Adam with one parameter group has its state saved")
    group = opt.param_groups[0]
    if group.get("amsgrad") or group.get("maximize"):
        raise ValueError("Adam with amsgrad or maximize has no saved state here")
    tensors: dict[str, torch.Tensor] = {}
    steps = set()
    for name, p in model.named_parameters():
        st = opt.state.get(p)
        if not st:
            raise ValueError(f"Adam has no state for parameter {name!r} (no step taken yet)")
        tensors[f"{name}.exp_avg"] = st["exp_avg"].detach().contiguous().cpu()
        tensors[f"{name}.exp_avg_sq"] = st["exp_avg_sq"].detach().contiguous().cpu()
        steps.add(int(st["step"]))
    if len(steps) != 1:
        raise ValueError(f"the parameters took different numbers of Adam steps: {sorted(steps)}")
    out = optimizer_path(path)
    beta1, beta2 = group["betas"]
    save_file(tensors, str(out), metadata={"format": FORMAT + "-adam", "step": str(steps.pop()),
                                           "beta1": repr(float(beta1)), "beta2": repr(float(beta2)),
                                           "eps": repr(float(group["eps"])),
                                           "weight_decay": repr(float(group["weight_decay"]))})
    return out


def load_adam_state(ckpt: CheckpointInfo, estimator: str, device: torch.device | str = "cpu") -> AdamState:
    """The Adam state saved with ``ckpt``; a ValueError naming ``estimator`` (the estimator that needs it) when
    the checkpoint has none (trained before the state was kept, or without asking for it)."""
    if ckpt.optimizer is None or not ckpt.optimizer.is_file():
        raise ValueError(f"estimator {estimator!r} needs the Adam state (exp_avg, exp_avg_sq, step) saved with each "
                         f"checkpoint, and checkpoint {ckpt.name!r} has none: train the model again with the "
                         "optimizer state kept (an evaluation's full-data model keeps it)")
    with safe_open(str(ckpt.optimizer), framework="pt", device=str(device)) as fh:
        meta = fh.metadata() or {}
        avg, sq = {}, {}
        for key in fh.keys():
            name, _, kind = key.rpartition(".")
            (avg if kind == "exp_avg" else sq)[name] = fh.get_tensor(key)
    return AdamState(avg, sq, int(meta["step"]), float(meta["beta1"]), float(meta["beta2"]), float(meta["eps"]),
                     float(meta.get("weight_decay", 0.0)))


def read_checkpoint_info(path: Path) -> CheckpointInfo:
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
    if "epoch" not in meta or "lr" not in meta:
        raise ValueError(f"{path} has no epoch/lr metadata")
    return CheckpointInfo(path, int(meta["epoch"]), float(meta["lr"]))


@dataclass
class KGBundle:
    """What the worker's model cache holds for a ConvE model."""

    model: ConvE
    dataset: TriplesDataset
    checkpoints: list[CheckpointInfo]
    path: Path
    training: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def checkpoint(self, name: str) -> CheckpointInfo:
        for c in self.checkpoints:
            if name in (c.name, c.path.name, str(c.epoch)):
                return c
        raise KeyError(f"unknown checkpoint {name!r}")


def checkpoint_entry(c: CheckpointInfo, root: Path) -> dict:
    """A checkpoint's entry in config.json (its files relative to the model directory ``root``)."""
    out: dict = {"file": str(c.path.relative_to(root)), "epoch": c.epoch, "lr": c.lr}
    if c.optimizer is not None:
        out["optimizer"] = str(c.optimizer.relative_to(root))
    return out


def write_model_dir(path: Path, model: ConvE, dataset: TriplesDataset, checkpoints: list[CheckpointInfo],
                    training: dict, metrics: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": FORMAT})
    write_dataset_dir(dataset, path / "data")
    cfg = {
        "format": FORMAT,
        "model": model.config.to_dict(),
        "dataset": dataset.name,
        "training": training,
        "checkpoints": [checkpoint_entry(c, path) for c in checkpoints],
    }
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    (path / "metrics.json").write_text(json.dumps(metrics, indent=2))


def load(path: Path | str, device: torch.device | str = "cpu") -> KGBundle:
    """Registry loader (``models.kg.checkpoint:load``): the final model in eval mode, data and checkpoints."""
    path = Path(path)
    cfg = json.loads((path / "config.json").read_text())
    if cfg.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} model directory")
    model = ConvE(ConvEConfig(**cfg["model"]))
    model.load_state_dict(load_file(str(path / "model.safetensors"), device="cpu"))
    model.to(device).eval()
    dataset = load_triples_dir(path / "data", cfg.get("dataset"))
    checkpoints = [CheckpointInfo(path / c["file"], int(c["epoch"]), float(c["lr"]),
                                  path / c["optimizer"] if c.get("optimizer") else None) for c in cfg["checkpoints"]]
    metrics = json.loads((path / "metrics.json").read_text()) if (path / "metrics.json").is_file() else {}
    return KGBundle(model, dataset, checkpoints, path, cfg.get("training", {}), metrics)
