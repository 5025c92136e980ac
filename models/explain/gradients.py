r"""Per-example gradients of any ``nn.Module``, by ``torch.func``: the generic ground of TracIn and TRAK.

A model family that has no faster way states its per-example loss as a :data:`LossFn`,
``loss(forward, example) -> scalar``: ``example`` is ONE row of the examples tensor (no batch dimension) and
``forward(*args, **kwargs)`` runs the module with the weights being differentiated (as Captum's ``forward_func``
or TRAK's ``AbstractModelOutput.get_output`` with ``functional_call``). Then

.. math::

    G = \big[\operatorname{vec} \nabla_{w_p} \ell(w, z_b)\big]_{b,\,p \in \text{names}} \in \mathbb{R}^{B \times P}

is ``vmap(grad(loss))`` over the examples, with the parameters not in ``names`` and the buffers held fixed, each
parameter flattened row-major, in ``names`` order. Exact, and simple; it materialises ``[B, P]`` numbers, which is
what the families' factored fast paths (ConvE's "ghost" factors, :mod:`models.kg.tracin`) avoid.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

LossFn = Callable[[Callable[..., Any], torch.Tensor], torch.Tensor]
"""``loss(forward, example) -> scalar tensor``: one example's loss (see the module docstring)."""


def resolve_parameters(model: nn.Module, layers: str | Sequence[str]) -> tuple[str, ...]:
    """``"all"`` (every parameter, in ``named_parameters()`` order), or parameter names; a module name (``fc``)
    expands to its parameters. Unknown names raise ``ValueError``."""
    names = [n for n, _ in model.named_parameters()]
    if isinstance(layers, str):
        if layers == "all":
            return tuple(names)
        layers = [layers]
    out: list[str] = []
    for item in layers:
        expanded = [item] if item in names else [n for n in names if n.startswith(item + ".")]
        if not expanded:
            raise ValueError(f"unknown layer {item!r}; parameters are {names}")
        out.extend(e for e in expanded if e not in out)
    if not out:
        raise ValueError("layers is empty")
    return tuple(out)


def per_example_gradients(model: nn.Module, names: Sequence[str], loss: LossFn,
                          examples: torch.Tensor) -> torch.Tensor:
    """``[B, P]`` per-example gradients of ``loss`` w.r.t. the parameters ``names`` of ``model`` (module docstring),
    in the parameters' dtype, on their device."""
    params = {n: p.detach() for n, p in model.named_parameters()}
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    sel = {n: params[n] for n in names}
    const = {n: p for n, p in params.items() if n not in sel}

    def one(sel_p: dict[str, torch.Tensor], example: torch.Tensor) -> torch.Tensor:
        full = {**const, **sel_p, **buffers}

        def forward(*args: Any, **kwargs: Any) -> Any:
            return functional_call(model, full, args, kwargs)

        return loss(forward, example)

    g = vmap(grad(one), in_dims=(None, 0))(sel, examples)
    return torch.cat([g[n].reshape(len(examples), -1) for n in names], 1)


def parameter_count(model: nn.Module, names: Sequence[str]) -> int:
    """How many numbers the parameters ``names`` hold (the width ``P`` of :func:`per_example_gradients`)."""
    return sum(model.get_parameter(n).numel() for n in names)


def module_device(model: nn.Module) -> torch.device:
    """The device of a module's first parameter (or buffer); the CPU for a module holding neither."""
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")


def classification_margin(logits: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """TRAK's output for classification, summed over the rows: the correct class's logit minus the log-sum-exp of
    the others', log(p / (1 - p)) of the correct class (Park et al. 2023, "TRAK", section 3)."""
    own = torch.arange(logits.shape[-1], device=logits.device) == label[..., None]  # vmap-safe (no one_hot checks)
    others = logits.masked_fill(own, float("-inf"))
    return (logits.gather(-1, label[..., None])[..., 0] - torch.logsumexp(others, -1)).sum()
