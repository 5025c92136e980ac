"""Captum ``TracInCP`` set up on a ConvE bundle: the independent oracle for the tests and the benchmark.

Captum needs a module whose input is the examples and a per-example loss over its output, so ConvE is viewed as
triples -> logits of each query direction ``[B, Q, N]``, and the loss sums the per-query loss over directions.
Captum is a development dependency; it is imported only when this is called.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from models.kg.checkpoint import KGBundle
from models.kg.conve import query_loss, triple_queries


class TripleModel(nn.Module):
    """ConvE as a function of whole triples: ``[B, 3] -> [B, Q, N]`` logits, one slice per query direction."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, triples: torch.Tensor) -> torch.Tensor:
        c = self.model.config
        qs = triple_queries(triples, c.num_relations, c.reciprocal)
        return torch.stack([self.model(q[:, 0], q[:, 1]) for q in qs], 1)


class TripleLoss(nn.Module):
    """Per-example loss for Captum: the sum over query directions of ``query_loss`` (``train`` or ``score_bce``)."""

    reduction = "none"

    def __init__(self, model: nn.Module, kind: str = "train") -> None:
        super().__init__()
        self.cfg = model.config
        self.kind = kind

    def forward(self, out: torch.Tensor, triples: torch.Tensor) -> torch.Tensor:
        qs = triple_queries(triples, self.cfg.num_relations, self.cfg.reciprocal)
        return sum(query_loss(out[:, i], q[:, 2], self.cfg.label_smoothing, self.kind) for i, q in enumerate(qs))


def captum_tracincp(bundle: KGBundle, train: torch.Tensor, layers: list[str] | None = None, loss: str = "train",
                    batch_size: int = 16) -> Any:
    """A ``captum.influence.TracInCP`` over ``train`` with the bundle's checkpoints and learning rates.

    ``layers`` are Captum layer names on the wrapper (``model.fc``...); None means every parameter.
    """
    from captum.influence import TracInCP
    from safetensors.torch import load_file
    from torch.utils.data import DataLoader, TensorDataset

    wrapper = TripleModel(copy.deepcopy(bundle.model)).eval()
    lrs = {str(c.path): c.lr for c in bundle.checkpoints}

    def load_checkpoint(model: nn.Module, path: str) -> float:
        model.model.load_state_dict(load_file(path))
        model.eval()
        return lrs[path]

    loader = DataLoader(TensorDataset(train, train), batch_size=batch_size, shuffle=False)
    return TracInCP(wrapper, loader, [str(c.path) for c in bundle.checkpoints],
                    checkpoints_load_func=load_checkpoint, layers=layers, loss_fn=TripleLoss(wrapper.model, loss),
                    batch_size=batch_size, sample_wise_grads_per_batch=False)
