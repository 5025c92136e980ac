"""ConvE training with checkpoints, and filtered link-prediction metrics.

Each training example is one triple; its loss is ``models.kg.conve.triple_loss`` (1-N BCE with label smoothing,
both directions when reciprocal), and a batch minimises the mean. TracIn uses exactly this per-triple loss, so
its gradients are the ones training followed. Adam with a constant learning rate (optionally multiplied by
``lr_decay`` after each epoch); every checkpoint stores the learning rate in force during the epoch that produced it.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from models.common import default_device, seed_everything
from models.curves import StepCurve
from models.kg.checkpoint import (
    CheckpointInfo,
    checkpoint_entry,
    save_adam_state,
    save_checkpoint,
    write_model_dir,
)
from models.kg.conve import ConvE, ConvEConfig, default_height, triple_loss, triple_queries
from models.kg.triples import TriplesDataset


@dataclass
class TrainConfig:
    epochs: int = 20
    batch_size: int = 128
    lr: float = 0.003
    lr_decay: float = 1.0
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    embedding_dim: int = 200
    embedding_height: int | None = None
    num_filters: int = 32
    input_dropout: float = 0.2
    feature_dropout: float = 0.2
    hidden_dropout: float = 0.3
    reciprocal: bool = True
    checkpoint_every: int = 5
    eval_batch_size: int = 256
    seed: int = 0


# progress(done_batches, total_batches, message, metrics or None) -> None; called after every batch (metrics, the
# epoch's history row, at the end of each epoch); it may raise to cancel.
ProgressFn = Callable[[int, int, str, dict | None], None]


class FilterIndex:
    """Known answers per query (h, r): the filter of filtered ranking metrics."""

    def __init__(self, known: torch.Tensor, num_relations: int, reciprocal: bool) -> None:
        self.answers: dict[tuple[int, int], list[int]] = defaultdict(list)
        for q in triple_queries(known, num_relations, reciprocal):
            for h, r, t in q.tolist():
                self.answers[(h, r)].append(t)

    def mask(self, queries: torch.Tensor, num_entities: int) -> torch.Tensor:
        """Boolean ``[B, N]``: True at every known answer of each query."""
        rows, cols = [], []
        for i, (h, r) in enumerate(queries[:, :2].tolist()):
            a = self.answers.get((h, r), [])
            rows.extend([i] * len(a))
            cols.extend(a)
        m = torch.zeros(len(queries), num_entities, dtype=torch.bool)
        if rows:
            m[torch.tensor(rows), torch.tensor(cols)] = True
        return m


@torch.no_grad()
def filtered_ranks(model: ConvE, triples: torch.Tensor, filt: FilterIndex, batch_size: int = 256) -> torch.Tensor:
    """Filtered rank of the true answer of every query (tail queries, plus head queries when reciprocal).

    rank = 1 + #{e ∉ known answers : s_e > s_t} + ½ #{e ∉ known, e ≠ t : s_e = s_t} (ties count half, so a
    constant scorer gets the mean rank, not rank 1).
    """
    model.eval()
    c = model.config
    device = next(model.parameters()).device
    ranks = []
    for q in triple_queries(triples, c.num_relations, c.reciprocal):
        for i in range(0, len(q), batch_size):
            b = q[i:i + batch_size]
            s = model(b[:, 0].to(device), b[:, 1].to(device)).float().cpu()
            ranks.append(ranks_from_scores(s, b[:, 2], filt.mask(b, c.num_entities)))
    return torch.cat(ranks) if ranks else torch.empty(0)


def ranks_from_scores(scores: torch.Tensor, target: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """Filtered ranks ``[B]`` of ``target`` in ``scores [B, N]``; ``known [B, N]`` marks the answers to filter
    (the target itself may be marked; it is never counted against itself)."""
    st = scores.gather(1, target[:, None])
    other = known.clone()
    other[torch.arange(len(target)), target] = True
    higher = ((scores > st) & ~other).sum(1)
    ties = ((scores == st) & ~other).sum(1)
    return 1.0 + higher.float() + 0.5 * ties.float()


def rank_metrics(ranks: torch.Tensor) -> dict[str, float]:
    if len(ranks) == 0:
        return {}
    return {
        "mrr": float((1.0 / ranks).mean()),
        "mr": float(ranks.mean()),
        "hits@1": float((ranks <= 1).float().mean()),
        "hits@3": float((ranks <= 3).float().mean()),
        "hits@10": float((ranks <= 10).float().mean()),
        "n_queries": len(ranks),
    }


def evaluate(model: ConvE, dataset: TriplesDataset, splits: tuple[str, ...] = ("valid", "test"),
             batch_size: int = 256) -> dict[str, dict[str, float]]:
    filt = FilterIndex(dataset.all_known(), model.config.num_relations, model.config.reciprocal)
    return {s: rank_metrics(filtered_ranks(model, dataset.splits[s], filt, batch_size))
            for s in splits if s in dataset.splits and len(dataset.splits[s])}


def build_model(dataset: TriplesDataset, cfg: TrainConfig) -> ConvE:
    height = cfg.embedding_height or default_height(cfg.embedding_dim)
    return ConvE(ConvEConfig(
        num_entities=len(dataset.entities), num_relations=len(dataset.relations),
        embedding_dim=cfg.embedding_dim, embedding_height=height, num_filters=cfg.num_filters,
        input_dropout=cfg.input_dropout, feature_dropout=cfg.feature_dropout, hidden_dropout=cfg.hidden_dropout,
        label_smoothing=cfg.label_smoothing, reciprocal=cfg.reciprocal))


def train_conve(dataset: TriplesDataset, cfg: TrainConfig, out_dir: Path, device: torch.device | str | None = None,
                progress: ProgressFn | None = None, show_progress: bool = False,
                curve: StepCurve | None = None, optimizer_state: bool = False) -> dict:
    """Train ConvE, save checkpoints every ``checkpoint_every`` epochs (and the last), write the model directory.

    The running loss per step goes into ``curve`` (a new :class:`models.curves.StepCurve` when None; a caller
    that passes one reads it live from ``progress``). ``optimizer_state``: also save Adam's state with every
    checkpoint (``models.kg.checkpoint.save_adam_state``: twice the parameters more per checkpoint; the
    ``tracin_adam`` estimator needs it). Returns ``{"metrics", "checkpoints", "history", "steps",
    "parameters", "seconds"}``.
    """
    if cfg.epochs < 1 or cfg.batch_size < 1 or cfg.checkpoint_every < 1:
        raise ValueError("epochs, batch_size and checkpoint_every must be >= 1")
    device = torch.device(device) if device is not None else default_device()
    seed_everything(cfg.seed)
    model = build_model(dataset, cfg).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    train = dataset.train
    gen = torch.Generator().manual_seed(cfg.seed)
    n_batches = math.ceil(len(train) / cfg.batch_size)
    curve = curve if curve is not None else StepCurve(n_batches)
    if curve.steps_per_epoch != n_batches:
        raise ValueError(f"the step curve has {curve.steps_per_epoch} steps per epoch, the run {n_batches}")
    checkpoints: list[CheckpointInfo] = []
    history: list[dict] = []
    t0 = time.perf_counter()
    bar = tqdm(total=cfg.epochs * n_batches, desc="train conve", unit="batch", disable=not show_progress)
    for epoch in range(1, cfg.epochs + 1):
        model.train()
        lr = opt.param_groups[0]["lr"]
        perm = torch.randperm(len(train), generator=gen)
        total, count = 0.0, 0
        for i in range(n_batches):
            batch = train[perm[i * cfg.batch_size:(i + 1) * cfg.batch_size]].to(device)
            if len(batch) < 2:  # BatchNorm needs two examples in training mode
                continue
            loss = triple_loss(model, batch).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            batch_sum = loss.item() * len(batch)
            total += batch_sum
            count += len(batch)
            curve.add((epoch - 1) * n_batches + i + 1, batch_sum, len(batch), force=i + 1 == n_batches)
            bar.update(1)
            if progress is not None and i + 1 < n_batches:
                progress((epoch - 1) * n_batches + i + 1, cfg.epochs * n_batches, f"epoch {epoch}/{cfg.epochs}",
                         None)
        epoch_loss = total / max(count, 1)
        row = {"epoch": epoch, "loss": epoch_loss, "lr": lr}
        if epoch % cfg.checkpoint_every == 0 or epoch == cfg.epochs:
            model.eval()
            ck = save_checkpoint(model, out_dir / "checkpoints" / f"epoch_{epoch:04d}.safetensors", epoch, lr)
            if optimizer_state:
                ck.optimizer = save_adam_state(opt, model, ck.path)
            checkpoints.append(ck)
            if "valid" in dataset.splits and len(dataset.valid):
                row["valid"] = evaluate(model, dataset, ("valid",), cfg.eval_batch_size)["valid"]
        history.append(row)
        bar.set_postfix(loss=f"{epoch_loss:.4f}")
        if progress is not None:
            metrics = dict(row)  # the epoch's history row (its validation metrics nested under "valid")
            progress(epoch * n_batches, cfg.epochs * n_batches, f"epoch {epoch}/{cfg.epochs} loss {epoch_loss:.4f}",
                     metrics)
        for g in opt.param_groups:
            g["lr"] = g["lr"] * cfg.lr_decay
    bar.close()
    model.eval()
    metrics = evaluate(model, dataset, ("valid", "test"), cfg.eval_batch_size)
    seconds = time.perf_counter() - t0
    training = {**asdict(cfg), "seconds": seconds, "device": str(device)}
    write_model_dir(out_dir, model, dataset, checkpoints, training, {**metrics, "history": history})
    return {"metrics": metrics, "history": history, "steps": curve.rows(), "parameters": sum(p.numel() for p in model.parameters()),
            "checkpoints": [checkpoint_entry(c, out_dir) for c in checkpoints],
            "seconds": seconds}
