"""Training and evaluation of news recommenders on MIND-format impressions.

Loss: for each clicked candidate, ``npratio`` non-clicked candidates of the same impression, drawn without
replacement when the impression has at least ``npratio`` (as NRMS's reference sampler does), with replacement only
when it has fewer; softmax cross-entropy over the ``npratio + 1`` scores (the NRMS/NAML objective). Candidates
without a click label (a test split) are never trained on.

An empty history (MIND has such impressions: new users) has a well-defined user vector: zeros (the attention
pooling of no news gives every position weight 0, see :func:`models.news.modules.masked_softmax`). Such an
impression scores every candidate 0: it is scored (per-impression AUC 0.5, as for any constant scorer) and its
examples are trained on, where they add a constant ``log(npratio + 1)`` to the loss and no gradient.

Evaluation follows MIND's own ``evaluate.py``: per impression, AUC, MRR, nDCG@5 and nDCG@10 of the candidates'
scores against the clicks, averaged over the impressions that have both a click and a non-click (``auc``, ``mrr``,
``ndcg@5``, ``ndcg@10``: ``auc`` is MIND's AUC, the mean of the per-impression AUCs), plus the ROC AUC of all
candidates pooled across impressions (``pooled_auc``).

With a frozen BERT encoder the token states of every title are computed once (no_grad) and only the NRMS layers
above them are trained, which keeps training to seconds on a CPU.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score

from models.common import autocast, resolve_precision, seed_everything
from models.curves import StepCurve
from models.news.data import MAX_HISTORY, Impression, MindSplit
from models.news.modules import NRMS, NewsRecommender
from models.news.text import Encoded

Progress = Callable[[int, int, dict[str, float]], None]
EpochHook = Callable[[int, NewsRecommender, torch.optim.Optimizer, dict[str, Any]], None]


@dataclass
class TrainConfig:
    epochs: int = 3
    batch_size: int = 32
    lr: float = 1e-3
    negatives: int = 4  # npratio: non-clicked candidates per clicked one
    max_history: int = MAX_HISTORY
    seed: int = 0
    encode_batch: int = 128
    precision: str = "fp32"  # auto | fp32 | fp16 | bf16 (autocast; the loss and optimizer stay fp32)


def steps_per_epoch(split: MindSplit, batch_size: int, max_history: int = MAX_HISTORY) -> int:
    """Optimizer steps per epoch of :func:`train` on ``split`` (what its step curve is built with)."""
    n = sum(sum(1 for _, lab in imp.candidates if lab == 1) for imp in split.behaviors
            if any(lab == 0 for _, lab in imp.candidates))
    return max(1, (n + batch_size - 1) // batch_size)


class NewsTable:
    """Tokenised news of a split, indexed by position; ``encode(idx)`` gives news vectors with gradients."""

    def __init__(self, model: NewsRecommender, split: MindSplit, encode_batch: int = 128):
        self.model = model
        self.ids = list(split.news)
        self.index = {nid: i for i, nid in enumerate(self.ids)}
        items = [split.news[n] for n in self.ids]
        self.enc = model.tokenize([n.title for n in items], [n.body for n in items])
        self.states: torch.Tensor | None = None
        dev = model.device
        if isinstance(model, NRMS) and model.config.get("encoder") == "bert" and not model.config.get("fine_tune"):
            title = self.enc["title"]
            chunks = []
            with torch.no_grad():
                for s in range(0, len(items), encode_batch):
                    ids, mask = title.ids[s:s + encode_batch].to(dev), title.mask[s:s + encode_batch].to(dev)
                    chunks.append(model.token_encoder(model.token_encoder.embed(ids), mask))
            self.states = torch.cat(chunks)

    def encode(self, idx: torch.Tensor) -> torch.Tensor:
        dev = self.model.device
        if self.states is not None:
            mask = self.enc["title"].mask[idx.cpu()].to(dev)
            assert isinstance(self.model, NRMS)
            return self.model.head(self.states[idx.to(self.states.device)], mask)
        sub = {v: Encoded(e.ids[idx.cpu()], e.mask[idx.cpu()]) for v, e in self.enc.items()}
        return self.model.encode_news(sub)


def sample_negatives(rng: random.Random, neg: list[int], k: int) -> list[int]:
    """``k`` non-clicked candidates: without replacement when there are at least ``k``, else with replacement."""
    return rng.sample(neg, k) if len(neg) >= k else [rng.choice(neg) for _ in range(k)]


def _history(imp: Impression, table: NewsTable, max_history: int) -> list[int]:
    return [table.index[h] for h in imp.history[-max_history:]]


def _pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(1, max(len(r) for r in rows))
    idx = torch.zeros(len(rows), n, dtype=torch.long)
    mask = torch.zeros(len(rows), n)
    for i, r in enumerate(rows):
        idx[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return idx, mask


def _scores(model: NewsRecommender, table: NewsTable, hist: list[list[int]], cands: list[list[int]]) -> torch.Tensor:
    hidx, hmask = _pad(hist)
    cidx = torch.tensor(cands, dtype=torch.long)
    uniq, inv = torch.unique(torch.cat([hidx.flatten(), cidx.flatten()]), return_inverse=True)
    vecs = table.encode(uniq)
    h = vecs[inv[: hidx.numel()]].view(*hidx.shape, -1)
    c = vecs[inv[hidx.numel():]].view(*cidx.shape, -1)
    user = model.user_vector(h, hmask.to(h.device))
    return torch.einsum("bcd,bd->bc", c, user)


def training_examples(split: MindSplit, table: NewsTable, max_history: int) -> list[tuple[list[int], int, list[int]]]:
    """(history positions, clicked position, non-clicked positions) for every click with at least one non-click
    (an empty history included: its user vector is zeros)."""
    examples = []
    for imp in split.behaviors:
        pos = [table.index[n] for n, lab in imp.candidates if lab == 1]
        neg = [table.index[n] for n, lab in imp.candidates if lab == 0]
        if not neg:
            continue
        for p in pos:
            examples.append((_history(imp, table, max_history), p, neg))
    return examples


def train(
    model: NewsRecommender, train_split: MindSplit, valid_split: MindSplit | None, cfg: TrainConfig,
    progress: Progress | None = None, on_epoch: EpochHook | None = None, start_epoch: int = 0,
    optimizer_state: dict[str, Any] | None = None, curve: StepCurve | None = None,
) -> dict[str, Any]:
    """Train in place; returns per-epoch losses (and validation metrics when ``valid_split`` is given).

    ``on_epoch(epoch, model, optimizer, metrics)`` runs after every epoch (checkpoints, live metrics); training
    resumes after ``start_epoch`` epochs with ``optimizer_state`` (the model must hold that epoch's weights). The
    negatives of epoch ``e`` depend only on the seed and ``e``, so a resumed run draws what the full run drew.
    The running loss per step goes into ``curve`` (:class:`models.curves.StepCurve`, a new one when None; its
    steps per epoch must be this run's, :func:`steps_per_epoch`) and the result's ``steps``."""
    seed_everything(cfg.seed)
    precision = resolve_precision(cfg.precision, model.device, cuda_half="bf16", cpu_native_bf16=True)
    table = NewsTable(model, train_split, cfg.encode_batch)
    examples = training_examples(train_split, table, cfg.max_history)
    if not examples:
        raise ValueError("the training split has no impression with both a click and a non-click")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=cfg.lr)
    if optimizer_state is not None:
        opt.load_state_dict(optimizer_state)
    steps_per_epoch = (len(examples) + cfg.batch_size - 1) // cfg.batch_size
    curve = curve if curve is not None else StepCurve(steps_per_epoch)
    if curve.steps_per_epoch != steps_per_epoch:
        raise ValueError(f"the step curve has {curve.steps_per_epoch} steps per epoch, the run {steps_per_epoch}")
    total = cfg.epochs * steps_per_epoch
    history: list[dict[str, Any]] = []
    step = start_epoch * steps_per_epoch
    for epoch in range(start_epoch, cfg.epochs):
        rng = random.Random(f"{cfg.seed}-{epoch}")
        torch.manual_seed(cfg.seed * 1000 + epoch)  # dropout masks, also reproducible after a resume
        model.train()
        order = list(examples)
        rng.shuffle(order)
        losses = []
        for s in range(0, len(order), cfg.batch_size):
            batch = order[s:s + cfg.batch_size]
            cands = [[p, *sample_negatives(rng, neg, cfg.negatives)] for _, p, neg in batch]
            with autocast(model.device, precision):
                scores = _scores(model, table, [h for h, _, _ in batch], cands)
            loss = F.cross_entropy(scores.float(), torch.zeros(len(batch), dtype=torch.long, device=scores.device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            step += 1
            curve.add(step, losses[-1] * len(batch), len(batch), force=s + cfg.batch_size >= len(order))
            if progress is not None:
                progress(step, total, {"epoch": epoch + 1, "loss": float(np.mean(losses))})
        record: dict[str, Any] = {"epoch": epoch + 1, "loss": float(np.mean(losses))}
        if valid_split is not None:
            record["valid"] = evaluate(model, valid_split, cfg.max_history, cfg.encode_batch)
        history.append(record)
        if on_epoch is not None:
            on_epoch(epoch + 1, model, opt, record)
    model.eval()
    result: dict[str, Any] = {"epochs": history, "train_examples": len(examples), "precision": precision,
                              "steps": curve.rows()}
    if valid_split is not None and history:
        result["valid"] = history[-1]["valid"]
    return result


def impression_metrics(labels: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    """MIND's per-impression metrics: AUC, MRR, nDCG@5 and nDCG@10 (as in MIND's ``evaluate.py``)."""
    order = np.argsort(scores)[::-1]
    ranked = labels[order]
    mrr = float(np.sum(ranked / (np.arange(len(ranked)) + 1)) / np.sum(ranked))

    def dcg(y: np.ndarray, k: int) -> float:
        y = y[:k]
        return float(np.sum((2 ** y - 1) / np.log2(np.arange(len(y)) + 2)))

    ideal = np.sort(labels)[::-1]
    return {"auc": float(roc_auc_score(labels, scores)), "mrr": mrr,
            "ndcg@5": dcg(ranked, 5) / dcg(ideal, 5), "ndcg@10": dcg(ranked, 10) / dcg(ideal, 10)}


@torch.no_grad()
def evaluate(model: NewsRecommender, split: MindSplit, max_history: int = MAX_HISTORY, encode_batch: int = 128,
             fake_as: str | None = None) -> dict[str, Any]:
    """MIND's metrics averaged over impressions (``auc``, ``mrr``, ``ndcg@5``, ``ndcg@10``), the AUC of all
    candidates pooled (``pooled_auc``) and the mean score of fake vs real candidates (items without a label count in neither).

    ``fake_as`` = "negative" relabels fake candidates as non-clicks (to ask: does the model rank fakes low?)."""
    was_training = model.training
    model.eval()
    table = NewsTable(model, split, encode_batch)
    vecs = torch.cat([table.encode(torch.arange(s, min(s + encode_batch, len(table.ids))))
                      for s in range(0, len(table.ids), encode_batch)]).float()
    labels_all, scores_all, fake_scores, real_scores = [], [], [], []
    per_imp: dict[str, list[float]] = {"auc": [], "mrr": [], "ndcg@5": [], "ndcg@10": []}
    for imp in split.behaviors:
        cands = [(n, lab) for n, lab in imp.candidates if lab is not None]
        if not cands:
            continue
        hist = _history(imp, table, max_history)
        if hist:
            h = vecs[torch.tensor(hist)]
            user = model.user_vector(h[None], torch.ones(1, h.shape[0], device=h.device))[0].float()
        else:  # an empty history: the zero user vector (what user_vector gives a fully masked history)
            user = vecs.new_zeros(vecs.shape[1])
        idx = torch.tensor([table.index[n] for n, _ in cands])
        sc = (vecs[idx] @ user).cpu().numpy()
        labs = np.array([lab for _, lab in cands])
        fake = np.array([split.news[n].fake is True for n, _ in cands])
        real = np.array([split.news[n].fake is False for n, _ in cands])
        if fake_as == "negative":
            labs = np.where(fake, 0, labs)
        fake_scores.extend(sc[fake].tolist())
        real_scores.extend(sc[real].tolist())
        if 0 < labs.sum() < len(labs):
            m = impression_metrics(labs, sc)
            for k in ("auc", "mrr", "ndcg@5", "ndcg@10"):
                per_imp[k].append(m[k])
        labels_all.extend(labs.tolist())
        scores_all.extend(sc.tolist())
    model.train(was_training)
    if len(set(labels_all)) < 2:
        raise ValueError("the evaluation split has no labelled impression with both a click and a non-click")
    return {
        **{k: float(np.mean(v)) if v else float("nan") for k, v in per_imp.items()},
        "pooled_auc": float(roc_auc_score(labels_all, scores_all)),
        "impressions": len(per_imp["auc"]),
        "mean_score_fake": float(np.mean(fake_scores)) if fake_scores else float("nan"),
        "mean_score_real": float(np.mean(real_scores)) if real_scores else float("nan"),
    }
