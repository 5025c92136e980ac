r"""TracIn with Adam's update direction (``tracin_adam``): the training side is the step Adam would take on one
training triple's gradient, not the gradient itself.

ConvE trains with Adam, whose step is not the gradient step TracIn-CP's derivation assumes. For an Adam-trained
model LESS (Xia et al. 2024, "LESS: Selecting Influential Data for Targeted Instruction Tuning", §2.2) replaces the
training-side gradient by Adam's update computed from the optimizer state at the checkpoint. At a checkpoint with
first and second moments ``m``, ``v`` after ``t − 1`` steps (``step`` = t − 1 in ``torch.optim.Adam``'s state) and
hyper-parameters β1, β2, ε, the update of a single training triple's gradient ``g`` is, elementwise,

    Γ(g) = m̂ / (√v̂ + ε),   m̂ = (β1 m + (1 − β1) g) / (1 − β1^t),   v̂ = (β2 v + (1 − β2) g²) / (1 − β2^t)

(the moments and bias correction of the next step, t = step + 1, had that step been taken on ``g`` alone), and

    tracin_adam(z, z') = Σ_c η_c ⟨∇f(z), Γ_c(∇ℓ(z'))⟩

with η_c the learning rate in force at checkpoint c (as ``tracin``), ``f`` the test side (the negated margin of the
tail query, ``output="margin"``, or the training loss, ``output="loss"``) and ℓ the per-triple training loss.
Adam's step is −η Γ, so a positive score says a step on z' raises the test triple's margin, as for ``tracin``.
The L2 term of Adam's ``weight_decay`` (the same for every example) is left out of ``g``.

Γ is not linear in ``g``, so the ghost factorisation of :mod:`models.kg.tracin` does not apply: the per-triple
gradients are materialised (``torch.func`` ``vmap(grad)``, fp32), every parameter, in blocks of at most
``2**26`` numbers, and the test side is held as ``[n_test, P]`` for each checkpoint (P: the parameter count), in
groups of at most ``2**28`` numbers (each group recomputes the training side).
The state comes from the checkpoints' Adam files (``models.kg.checkpoint.load_adam_state``), which the evaluations'
full-data models keep; a checkpoint without one is a ValueError naming the estimator.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch.func import functional_call, grad, vmap

from models.kg.checkpoint import AdamState, CheckpointInfo, KGBundle, load_adam_state
from models.kg.conve import ConvE, query_loss
from models.kg.tracin import per_example_grads

NAME = "tracin_adam"
BLOCK_NUMBERS = 2 ** 26  # at most this many training-side gradient entries materialised at once (256 MB in fp32)
# at most this many test-side gradient entries held at once (1 GiB in fp32); more test triples than fit are taken
# in groups, each group's pass recomputing the training side
TEST_NUMBERS = 2 ** 28


def adam_update(g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int, beta1: float, beta2: float,
                eps: float) -> torch.Tensor:
    """Γ(g) of the module docstring for gradients ``g [..., P]`` at Adam state ``m``, ``v`` ``[P]`` after ``step``
    steps (the bias correction of step ``step + 1``)."""
    t = step + 1
    m_hat = (beta1 * m + (1 - beta1) * g) / (1 - beta1 ** t)
    v_hat = (beta2 * v + (1 - beta2) * g * g) / (1 - beta2 ** t)
    return m_hat / (v_hat.sqrt() + eps)


def flat_state(state: AdamState, model: ConvE, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two moments flattened in ``model.named_parameters()`` order (the columns of the gradients)."""
    names = [n for n, _ in model.named_parameters()]
    missing = [n for n in names if n not in state.exp_avg or n not in state.exp_avg_sq]
    if missing:
        raise ValueError(f"estimator {NAME!r}: the checkpoint's Adam state has no moments for {missing}")
    m = torch.cat([state.exp_avg[n].reshape(-1) for n in names]).to(device, torch.float32)
    v = torch.cat([state.exp_avg_sq[n].reshape(-1) for n in names]).to(device, torch.float32)
    return m, v


def margin_grads(model: ConvE, triples: torch.Tensor) -> torch.Tensor:
    """``[B, P]`` fp32: per-triple gradients of the negated margin of the tail query (h, r, ?) alone (eval mode),
    every parameter in ``model.named_parameters()`` order."""
    params = {n: p.detach() for n, p in model.named_parameters()}
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    c = model.config

    def f(p: dict[str, torch.Tensor], trip: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, {**p, **buffers}, (trip[None, 0], trip[None, 1]))
        return query_loss(logits, trip[None, 2], c.label_smoothing, "margin").sum()

    g = vmap(grad(f), in_dims=(None, 0))(params, triples.to(model.ent.weight.device))
    return torch.cat([g[n].reshape(len(triples), -1).float() for n in params], 1)


def _grads(model: ConvE, triples: torch.Tensor, output: str) -> torch.Tensor:
    """Per-triple gradients ``[B, P]`` of ``output`` ("margin" or "loss": the training loss), in blocks."""
    names = [n for n, _ in model.named_parameters()]
    n_params = sum(p.numel() for p in model.parameters())
    step = max(1, BLOCK_NUMBERS // max(n_params, 1))
    parts = []
    for i in range(0, len(triples), step):
        b = triples[i:i + step]
        parts.append(margin_grads(model, b) if output == "margin" else per_example_grads(model, b, names, "train"))
    return torch.cat(parts) if parts else torch.zeros(0, n_params)


class _Checkpoints:
    """The model at each checkpoint with its Adam state (one working copy of the model, reloaded)."""

    def __init__(self, bundle: KGBundle, checkpoints: Sequence[CheckpointInfo]) -> None:
        if not checkpoints:
            raise ValueError("no checkpoints")
        self.device = bundle.model.ent.weight.device
        self.work = copy.deepcopy(bundle.model).eval()
        self.checkpoints = list(checkpoints)
        # the state is read first, so a model without it fails before any gradient is computed
        self.states = [load_adam_state(c, NAME) for c in self.checkpoints]
        self.weights = [float(c.lr) for c in self.checkpoints]  # η: the learning rate at each, as tracin's "last"

    def at(self, i: int) -> tuple[ConvE, torch.Tensor, torch.Tensor, AdamState]:
        self.work.load_state_dict(self.checkpoints[i].state_dict(self.device))
        self.work.eval()
        m, v = flat_state(self.states[i], self.work, self.device)
        return self.work, m, v, self.states[i]


@torch.no_grad()
def scores(bundle: KGBundle, checkpoints: Sequence[CheckpointInfo], test: torch.Tensor, train: torch.Tensor,
           output: str = "margin") -> torch.Tensor:
    """``[n_test, n_train]`` float64: Σ_c η_c ⟨∇f(test_i), Γ_c(∇ℓ(train_j))⟩ (the module docstring)."""
    if output not in ("margin", "loss"):
        raise ValueError(f"output must be 'margin' or 'loss', got {output!r}")
    ck = _Checkpoints(bundle, checkpoints)
    out = torch.zeros(len(test), len(train), dtype=torch.float64)
    n_params = sum(p.numel() for p in bundle.model.parameters())
    block = max(1, BLOCK_NUMBERS // max(n_params, 1))
    test_block = max(1, TEST_NUMBERS // max(n_params, 1))  # test triples whose gradients are held at once
    for c in range(len(ck.checkpoints)):
        model, m, v, st = ck.at(c)
        for j in range(0, len(test), test_block):
            tb = test[j:j + test_block]
            with torch.enable_grad():
                gt = _grads(model, tb, output)
            for i in range(0, len(train), block):
                b = train[i:i + block]
                with torch.enable_grad():
                    gb = _grads(model, b, "loss")
                u = adam_update(gb, m, v, st.step, st.beta1, st.beta2, st.eps)
                out[j:j + len(tb), i:i + len(b)] += ck.weights[c] * (gt @ u.t()).double().cpu()
    return out


@torch.no_grad()
def self_scores(bundle: KGBundle, checkpoints: Sequence[CheckpointInfo], train: torch.Tensor) -> torch.Tensor:
    """``[n_train]`` float64: Σ_c η_c ⟨∇ℓ(z), Γ_c(∇ℓ(z))⟩, each training triple's influence on its own loss."""
    ck = _Checkpoints(bundle, checkpoints)
    out = torch.zeros(len(train), dtype=torch.float64)
    n_params = sum(p.numel() for p in bundle.model.parameters())
    block = max(1, BLOCK_NUMBERS // max(n_params, 1))
    for c in range(len(ck.checkpoints)):
        model, m, v, st = ck.at(c)
        for i in range(0, len(train), block):
            b = train[i:i + block]
            with torch.enable_grad():
                gb = _grads(model, b, "loss")
            u = adam_update(gb, m, v, st.step, st.beta1, st.beta2, st.eps)
            out[i:i + len(b)] += ck.weights[c] * (gb * u).sum(1).double().cpu()
    return out
