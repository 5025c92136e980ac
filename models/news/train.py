"""Training and evaluation of news recommenders on MIND-format impressions.

Loss: for each clicked candidate, K negatives from the same impression; softmax cross-entropy over the K+1 scores
(the NRMS/NAML objective). Evaluation: per-impression AUC averaged over impressions (MIND's metric) and the global
ROC AUC over all candidates.

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

from models.common import seed_everything
from models.news.data import Impression, MindSplit
from models.news.modules import NRMS, NewsRecommender
from models.news.text import Encoded

Progress = Callable[[int, int, dict[str, float]], None]


@dataclass
class TrainConfig:
    epochs: int = 3
    batch_size: int = 32
    lr: float = 1e-3
    negatives: int = 4
    max_history: int = 50
    seed: int = 0
    encode_batch: int = 128


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


def train(
    model: NewsRecommender, train_split: MindSplit, valid_split: MindSplit | None, cfg: TrainConfig,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Train in place; returns per-epoch losses and the validation metrics."""
    seed_everything(cfg.seed)
    rng = random.Random(cfg.seed)
    table = NewsTable(model, train_split, cfg.encode_batch)
    examples = []
    for imp in train_split.behaviors:
        if not imp.history:
            continue
        pos = [table.index[n] for n, lab in imp.candidates if lab == 1]
        neg = [table.index[n] for n, lab in imp.candidates if lab == 0]
        if not neg:
            continue
        for p in pos:
            examples.append((_history(imp, table, cfg.max_history), p, neg))
    if not examples:
        raise ValueError("the training split has no impression with both a click and a non-click")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=cfg.lr)
    steps_per_epoch = (len(examples) + cfg.batch_size - 1) // cfg.batch_size
    total = cfg.epochs * steps_per_epoch
    history: list[dict[str, float]] = []
    step = 0
    for epoch in range(cfg.epochs):
        model.train()
        rng.shuffle(examples)
        losses = []
        for s in range(0, len(examples), cfg.batch_size):
            batch = examples[s:s + cfg.batch_size]
            cands = [[p, *(rng.choice(neg) for _ in range(cfg.negatives))] for _, p, neg in batch]
            scores = _scores(model, table, [h for h, _, _ in batch], cands)
            loss = F.cross_entropy(scores, torch.zeros(len(batch), dtype=torch.long, device=scores.device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            step += 1
            if progress is not None:
                progress(step, total, {"epoch": epoch + 1, "loss": float(np.mean(losses))})
        history.append({"epoch": epoch + 1, "loss": float(np.mean(losses))})
    model.eval()
    result: dict[str, Any] = {"epochs": history, "train_examples": len(examples)}
    if valid_split is not None:
        result["valid"] = evaluate(model, valid_split, cfg.max_history, cfg.encode_batch)
    return result


@torch.no_grad()
def evaluate(model: NewsRecommender, split: MindSplit, max_history: int = 50, encode_batch: int = 128,
             fake_as: str | None = None) -> dict[str, float]:
    """Mean per-impression AUC (``imp_auc``), global AUC (``auc``) and the mean score of fake vs real candidates.

    ``fake_as`` = "negative" relabels fake candidates as non-clicks (to ask: does the model rank fakes low?)."""
    was_training = model.training
    model.eval()
    table = NewsTable(model, split, encode_batch)
    vecs = torch.cat([table.encode(torch.arange(s, min(s + encode_batch, len(table.ids))))
                      for s in range(0, len(table.ids), encode_batch)])
    labels_all, scores_all, imp_aucs, fake_scores, real_scores = [], [], [], [], []
    for imp in split.behaviors:
        if not imp.history:
            continue
        h = vecs[torch.tensor(_history(imp, table, max_history))]
        user = model.user_vector(h[None], torch.ones(1, h.shape[0], device=h.device))[0]
        idx = torch.tensor([table.index[n] for n, _ in imp.candidates])
        sc = (vecs[idx] @ user).cpu().numpy()
        labs = np.array([lab for _, lab in imp.candidates])
        fake = np.array([split.news[n].fake for n, _ in imp.candidates])
        if fake_as == "negative":
            labs = np.where(fake, 0, labs)
        fake_scores.extend(sc[fake].tolist())
        real_scores.extend(sc[~fake].tolist())
        if 0 < labs.sum() < len(labs):
            imp_aucs.append(roc_auc_score(labs, sc))
        labels_all.extend(labs.tolist())
        scores_all.extend(sc.tolist())
    model.train(was_training)
    return {
        "auc": float(roc_auc_score(labels_all, scores_all)),
        "imp_auc": float(np.mean(imp_aucs)) if imp_aucs else float("nan"),
        "impressions": len(imp_aucs),
        "mean_score_fake": float(np.mean(fake_scores)) if fake_scores else float("nan"),
        "mean_score_real": float(np.mean(real_scores)) if real_scores else float("nan"),
    }
