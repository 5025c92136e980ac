"""A classifier as every data-attribution estimator takes it, whatever its format (an exported program, a Hugging
Face model): :class:`Classifier`.

Examples are rows of one tensor (``[N, ...]``: an exported program's flattened input and the class; a text's
token ids, attention mask and class), so that the estimators batch, chunk, digest and store them without knowing
what they hold. A format says how to read a row (``inputs``, ``labels``), gives its per-example losses (the
training cross-entropy and TRAK's classification margin, :data:`models.explain.gradients.LossFn`), its checkpoints
in training order (the last is the trained model), and how to see the module as real ``nn.Linear``/``nn.Conv2d``
layers for Kronfluence (``layered``) or why it cannot (``kfac_problem``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from models.explain.gradients import LossFn
from models.explain.tracin import CheckpointLike

OUTPUTS = ("margin", "loss")  # the test side of an estimator: TRAK's margin (negated for TracIn), or the loss


@dataclass
class Classifier:
    """One classifier of any format, for the estimators (module docstring).

    ``module(*inputs(rows))`` gives logits ``[B, classes]``; ``labels(rows)`` the class of each row (long);
    ``loss`` and ``margin`` are one row's cross-entropy and classification margin; ``checkpoints`` the weights
    in training order (states of ``module``); ``layered(module)`` a module of the same computation whose layers
    are real ``nn.Linear``/``nn.Conv2d`` holding ``module``'s current weights, taking the same inputs (the module
    itself when it already is one); ``token_mask(rows)`` the ``[B, L]`` attention mask of text rows (None for
    other inputs); ``kfac_problem``: why EK-FAC cannot run (None when it can); ``config``: a JSON-able statement of
    the architecture and row layout (a digest of an exported program's graph, a Hugging Face config), part of
    every stored feature's key.
    """

    module: nn.Module
    checkpoints: Sequence[CheckpointLike]
    loss: LossFn
    margin: LossFn
    inputs: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
    labels: Callable[[torch.Tensor], torch.Tensor]
    layered: Callable[[nn.Module], nn.Module] | None = None
    token_mask: Callable[[torch.Tensor], torch.Tensor] | None = None
    kfac_problem: str | None = None
    name: str = "classifier"
    config: dict[str, Any] = field(default_factory=dict)  # the architecture besides the weights (feature keys)

    def at(self, ckpt: CheckpointLike, device: torch.device | str | None = None) -> nn.Module:
        """A frozen eval-mode copy of the module at ``ckpt``'s weights (on ``device``: default the module's)."""
        work = copy.deepcopy(self.module)
        if device is not None:
            work = work.to(device)
        target = next(iter(work.parameters())).device
        work.load_state_dict(ckpt.state_dict(target))
        for p in work.parameters():
            p.requires_grad_(False)
        return work.eval()

    @torch.no_grad()
    def logits(self, module: nn.Module, rows: torch.Tensor, batch: int = 256) -> torch.Tensor:
        """``module``'s logits of ``rows`` ``[N, classes]`` (float32, CPU), in batches."""
        device = next(iter(module.parameters())).device
        parts = [module(*self.inputs(rows[i:i + batch].to(device))).float().cpu()
                 for i in range(0, len(rows), batch)]
        return torch.cat(parts) if parts else torch.zeros(0, 0)

    def output(self, name: str) -> LossFn:
        """The per-row function an estimator's test side differentiates: ``loss`` (the cross-entropy) or
        ``margin`` (the NEGATED classification margin, so that for both a positive score says the training
        example lowered it, i.e. helped the test prediction)."""
        if name == "loss":
            return self.loss
        if name == "margin":
            margin = self.margin

            def negated(forward: Callable[..., Any], example: torch.Tensor) -> torch.Tensor:
                return -margin(forward, example)

            return negated
        raise ValueError(f"output must be one of {OUTPUTS}, got {name!r}")


    def batch_output(self, name: str) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
        """:meth:`output` for a batch of rows at once: ``(module, rows [B, ...]) -> [B]`` (one forward pass)."""
        check_output(name)

        def values(module: nn.Module, rows: torch.Tensor) -> torch.Tensor:
            logits = module(*self.inputs(rows)).float()
            labels = self.labels(rows).to(logits.device)
            if name == "loss":
                return nn.functional.cross_entropy(logits, labels, reduction="none")
            own = torch.arange(logits.shape[-1], device=logits.device) == labels[:, None]
            return -(logits.gather(1, labels[:, None])[:, 0] - logits.masked_fill(own, float("-inf")).logsumexp(-1))

        return values


def check_output(output: str) -> None:
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")


def last(checkpoints: Sequence[CheckpointLike]) -> CheckpointLike:
    if not checkpoints:
        raise ValueError("no checkpoints")
    return checkpoints[-1]
