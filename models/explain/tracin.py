r"""TracIn-CP for ConvE triples (Pruthi et al. 2020, "Estimating Training Data Influence by Tracing Gradient Descent").

.. math::

    \mathrm{TracIn}(z, z') = \sum_{i \in \text{checkpoints}} \eta_i \,
        \langle \nabla_w \ell(w_i, z), \nabla_w \ell(w_i, z') \rangle

with the model in eval mode, ``ℓ`` the per-triple training loss (``models.kg.conve.triple_loss``: 1-N BCE with
label smoothing, summed over both query directions when the model is reciprocal) or, with ``loss="score_bce"``,
BCE of the single score σ(s_t) against 1, and ``η_i`` the learning rate stored with checkpoint ``i``.
The gradient is restricted to the parameters named by ``layers``.

Two exact ways to compute the dot products:

``method="vmap"`` (the oracle). Per-example gradients from ``torch.func`` (``functional_call`` + ``vmap(grad)``),
flattened and multiplied. Simple and exact, but it materialises ``[batch, P]`` gradients (P ≈ 2.1M for ConvE-200).

``method="ghost"`` (default). ConvE's large parameters enter through products whose per-example gradients are
outer products, so their dot products factorise and nothing big is materialised. For one query
(h, r) → t with intermediate ``a`` (flattened conv features), ``f = W_fc a + b_fc``, ``x`` (query vector) and
scores ``s = x Eᵀ + b``, write δ_f = ∂ℓ/∂f, g = ∂ℓ/∂s, u = ∂ℓ/∂e_h and v = ∂ℓ/∂e_r. Then

- ``fc.weight``: ∇ = δ_f ⊗ a, so ⟨∇, ∇'⟩ = (δ_f·δ_f')(a·a');   ``fc.bias``: δ_f·δ_f'
- ``ent.weight``: ∇ = g ⊗ x + 1_h ⊗ u (output use + input row), so
  ⟨∇, ∇'⟩ = (g·g')(x·x') + g_{h'} (x·u') + g'_h (u·x') + [h = h'] (u·u')     (the cross terms matter)
- ``rel.weight``: ∇ = 1_r ⊗ v, so [r = r'] (v·v');   ``ent_bias``: g·g'
- conv and BatchNorm parameters (a few hundred numbers) are materialised per example from δ at their outputs:
  conv: Σ_positions δ_c ⊗ patch (``unfold``), BN (eval, affine): γ: Σ δ ⊙ x̂, β: Σ δ.

All δ come from ONE batched backward pass w.r.t. intermediate activations: in eval mode the examples of a batch do
not interact, so the gradient of Σ_b ℓ_b w.r.t. example b's activations is exactly example b's gradient.
A triple with two queries (reciprocal) has ∇ = ∇_fwd + ∇_inv, and its dot products are the sum of the 2×2 query
dot products. ``layers="last"`` keeps ``fc.weight``, ``fc.bias`` and the entity table in its output role only
(``ent.weight:output``, the g ⊗ x term); it needs only a forward pass and the backward through BN2.

``projection_dim=k`` replaces a·a' (the 10,368-wide conv features of ConvE-200) by (Pa)·(Pa') with a seeded
Gaussian P ∈ R^{D×k}, entries N(0, 1/k) (Johnson-Lindenstrauss): unbiased, with relative error of order
√(2/k) on each a·a'. It shrinks the train-side factors for large training sets; the benchmark reports the error
against k. Every other term stays exact.

Precision: the forward pass may run under autocast (``precision``: auto, fp32, fp16, bf16), but losses, factors and
every dot product are accumulated in fp32. ``auto`` is fp32 on every device: ConvE's per-triple loss gradients
are of order 1/N² for N entities, and unscaled fp16 flushes them to zero (``rel.weight`` influence off by 4% at
N = 4,000, worse with more entities); bf16 keeps the range but its 8-bit mantissa moved single layers' influence
by up to 4% (``tests/test_tracin.py``). ``fp16`` is therefore run on a scaled loss (``fp16_loss_scale``), which
brought every layer group within fp16's rounding of fp32 on CPU autocast (≤ 1.1e-3 relative); ``bf16`` is kept as an explicit opt-in.
Test-side factors are computed once per checkpoint and reused for every training batch.

Checkpoint weights η_i: by default the learning rate stored with the checkpoint (the rate of the last epoch of
its interval). ``weights`` replaces them, e.g. with ``interval_weights`` (see there).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from models.common import autocast, resolve_precision
from models.kg.conve import ConvE, query_loss, triple_queries
from models.kg.shapes import OUTPUT_TABLE

LAST_LAYERS = ("fc.weight", "fc.bias", OUTPUT_TABLE)
# Parameters whose gradient needs the backward pass through the convolution block.
DEEP = ("ent.weight", "rel.weight", "bn0.weight", "bn0.bias", "conv.weight", "conv.bias", "bn1.weight", "bn1.bias")
# Parameters whose gradient needs the backward pass through BN2 only.
MID = ("fc.weight", "fc.bias", "bn2.weight", "bn2.bias")
LOSSES = ("train", "score_bce")
METHODS = ("ghost", "vmap")


class CheckpointLike(Protocol):
    lr: float

    @property
    def name(self) -> str: ...

    def state_dict(self, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]: ...


@dataclass
class MemoryCheckpoint:
    """A checkpoint held in memory (tests, benchmarks)."""

    state: dict[str, torch.Tensor]
    lr: float
    label: str = "memory"

    @property
    def name(self) -> str:
        return self.label

    def state_dict(self, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        return {k: v.to(device) for k, v in self.state.items()}


def resolve_layers(model: ConvE, layers: str | Sequence[str]) -> tuple[str, ...]:
    """``all`` | ``last`` | parameter names (module names such as ``fc`` expand to their parameters).

    ``ent.weight:output`` names the entity table in its output role only.
    """
    names = [n for n, _ in model.named_parameters()]
    if isinstance(layers, str):
        if layers == "all":
            return tuple(names)
        if layers == "last":
            return LAST_LAYERS
        layers = [layers]
    out: list[str] = []
    for item in layers:
        if item == OUTPUT_TABLE or item in names:
            expanded = [item]
        else:
            expanded = [n for n in names if n.startswith(item + ".")]
            if not expanded:
                raise ValueError(f"unknown layer {item!r}; parameters are {names + [OUTPUT_TABLE]}")
        out.extend(e for e in expanded if e not in out)
    if not out:
        raise ValueError("layers is empty")
    if OUTPUT_TABLE in out and "ent.weight" in out:
        raise ValueError("'ent.weight' already contains its output role 'ent.weight:output'")
    return tuple(out)


class _DetachedBN:
    """View of a BatchNorm module with detached affine parameters (running statistics are buffers already)."""

    def __init__(self, bn: torch.nn.modules.batchnorm._BatchNorm) -> None:
        self.running_mean = bn.running_mean
        self.running_var = bn.running_var
        self.weight = bn.weight.detach()
        self.bias = bn.bias.detach()
        self.eps = bn.eps


def _bn_eval(x: torch.Tensor, bn: _DetachedBN) -> torch.Tensor:
    """Eval-mode BatchNorm with the affine parameters held fixed (fused kernel, cheap backward)."""
    return F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)


def _bn_xhat(x: torch.Tensor, bn: _DetachedBN) -> torch.Tensor:
    """x̂ = (x − μ)/√(σ² + ε), the per-example gradient of γ being Σ δ ⊙ x̂ (computed only when γ is wanted)."""
    shape = (1, -1) + (1,) * (x.dim() - 2)
    with torch.no_grad():
        return (x.detach().float() - bn.running_mean.view(shape)) * torch.rsqrt(bn.running_var.view(shape) + bn.eps)


@dataclass
class QueryFactors:
    """Per-query factors whose products give exact gradient dot products (fp32)."""

    h: torch.Tensor
    r: torch.Tensor
    g: torch.Tensor | None = None          # ∂ℓ/∂s            [B, N]
    x: torch.Tensor | None = None          # query vector      [B, d]
    u: torch.Tensor | None = None          # ∂ℓ/∂e_h           [B, d]
    v: torch.Tensor | None = None          # ∂ℓ/∂e_r           [B, d]
    df: torch.Tensor | None = None         # ∂ℓ/∂f (fc output) [B, d]
    a: torch.Tensor | None = None          # fc input          [B, D] (or projected [B, k])
    small: torch.Tensor | None = None      # materialised small-parameter gradients [B, S]

    def finite(self) -> bool:
        """True when every factor is finite (False after an fp16 overflow)."""
        return all(bool(torch.isfinite(v).all()) for k, v in self.__dict__.items()
                   if v is not None and v.is_floating_point())

    def take(self, idx: slice | torch.Tensor) -> QueryFactors:
        return QueryFactors(**{k: (None if val is None else val[idx]) for k, val in self.__dict__.items()})

    @staticmethod
    def cat(parts: Sequence[QueryFactors]) -> QueryFactors:
        keys = parts[0].__dict__.keys()
        return QueryFactors(**{k: (None if getattr(parts[0], k) is None else torch.cat([getattr(p, k) for p in parts]))
                               for k in keys})


def fp16_loss_scale(num_entities: int) -> float:
    """First loss scale of the fp16 path: 2^8 · N rounded to a power of two (exact to apply and to undo).

    The 1-N loss averages over the N entities, so ∂ℓ/∂s_j = (σ(s_j) − y_j)/N, and for a trained model whose
    scores sit near the smoothed label 1/N the differences are of order 1/N². In fp16 (smallest subnormal
    6e-8) they flush to zero from N ≈ 4,000 on; scaled by ~256·N they are of order 256/N and keep their digits,
    while the largest entry (about 1/N before scaling) becomes ~256, far from fp16's 65,504.
    """
    return float(2 ** (8 + max(0, round(math.log2(max(num_entities, 1))))))


def ghost_factors(model: ConvE, queries: torch.Tensor, names: Sequence[str], loss: str = "train",
                  precision: str = "fp32", projection: torch.Tensor | None = None) -> QueryFactors:
    """Factors of per-query gradients for ``queries`` ``[B, 3]`` (h, r, t) with one batched backward pass.

    Under fp16 autocast the backward pass runs on a scaled loss (``fp16_loss_scale``; divided by 16 and tried
    again while any gradient overflows), and the factors are unscaled in fp32. bf16 has fp32's exponent range
    and needs no scaling.
    """
    scale = fp16_loss_scale(model.config.num_entities) if precision == "fp16" else 1.0
    for _ in range(8):
        out = _ghost_factors(model, queries, names, loss, precision, projection, scale)
        if scale == 1.0 or out.finite():
            return out
        scale /= 16.0
    return out


def _ghost_factors(model: ConvE, queries: torch.Tensor, names: Sequence[str], loss: str, precision: str,
                   projection: torch.Tensor | None, scale: float) -> QueryFactors:
    c = model.config
    device = model.ent.weight.device
    h, r, t = (queries[:, i].to(device) for i in range(3))
    want = set(names)
    deep = bool(want & set(DEEP))
    mid = deep or bool(want & set(MID))
    E = model.ent.weight.detach()
    with torch.enable_grad(), autocast(device, precision):
        e = E[h]
        rr = model.rel.weight.detach()[r]
        if deep:
            e.requires_grad_(True)
            rr.requires_grad_(True)
        x0 = model.stack(e, rr)
        bn0, bn1, bn2 = _DetachedBN(model.bn0), _DetachedBN(model.bn1), _DetachedBN(model.bn2)
        z0 = _bn_eval(x0, bn0)
        cv = F.conv2d(z0, model.conv.weight.detach(), model.conv.bias.detach())
        z1 = _bn_eval(cv, bn1)
        a = F.relu(z1).flatten(1)
        if not deep:
            a = a.detach()
        f = F.linear(a, model.fc.weight.detach(), model.fc.bias.detach())
        if mid and not deep:
            f = f.detach().requires_grad_(True)
        z2 = _bn_eval(f, bn2)
        xq = F.relu(z2)
        if not mid:
            xq = xq.detach()
        s = xq @ E.t() + model.ent_bias.detach()
        if not mid:
            s = s.detach().requires_grad_(True)
        lvec = query_loss(s, t, c.label_smoothing, loss)
        inputs: list[torch.Tensor] = [s]
        if mid:
            inputs += [f, z2]
        if deep:
            inputs += [e, rr, z0, cv, z1]
        grads = torch.autograd.grad(lvec.sum() * scale if scale != 1.0 else lvec.sum(), inputs)
    if scale != 1.0:
        grads = tuple(gr.float() / scale for gr in grads)
    out = QueryFactors(h=h, r=r, g=grads[0].float(), x=xq.detach().float())
    smalls: list[torch.Tensor] = []
    if mid:
        df, dz2 = grads[1].float(), grads[2].float()
        out.df = df
        if "fc.weight" in want:
            av = a.detach().float()
            out.a = av @ projection if projection is not None else av
        if "bn2.weight" in want:
            smalls.append(dz2 * _bn_xhat(f, bn2))
        if "bn2.bias" in want:
            smalls.append(dz2)
    if deep:
        u, v, dz0, dcv, dz1 = (gr.float() for gr in grads[3:8])
        out.u, out.v = u, v
        b = len(queries)
        if "bn0.weight" in want:
            smalls.append((dz0 * _bn_xhat(x0, bn0)).reshape(b, -1).sum(1, keepdim=True))
        if "bn0.bias" in want:
            smalls.append(dz0.reshape(b, -1).sum(1, keepdim=True))
        if "conv.weight" in want:
            patches = F.unfold(z0.detach().float(), c.kernel_size)          # [B, k*k, L]
            smalls.append(torch.einsum("bfl,bkl->bfk", dcv.flatten(2), patches).reshape(b, -1))
        if "conv.bias" in want:
            smalls.append(dcv.sum((2, 3)))
        if "bn1.weight" in want:
            smalls.append((dz1 * _bn_xhat(cv, bn1)).sum((2, 3)))
        if "bn1.bias" in want:
            smalls.append(dz1.sum((2, 3)))
    if smalls:
        out.small = torch.cat(smalls, 1)
    return out


def ghost_kernel(L: QueryFactors, R: QueryFactors, names: Sequence[str], rowwise: bool = False) -> torch.Tensor:
    """⟨∇ℓ(L_i), ∇ℓ(R_j)⟩ restricted to ``names``: ``[n, m]``, or ``[n]`` (i = j) when ``rowwise``."""
    want = set(names)

    def dot(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return (p * q).sum(-1) if rowwise else p @ q.t()

    def same(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return (p == q) if rowwise else (p[:, None] == q[None, :])

    def at(gm: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """g_L[i, idx_j] ([n, m]) or g_L[i, idx_i] (rowwise)."""
        return gm.gather(1, idx[:, None]).squeeze(1) if rowwise else gm[:, idx]

    assert L.g is not None and R.g is not None and L.x is not None and R.x is not None
    k = torch.zeros(L.h.shape[0] if rowwise else (L.h.shape[0], R.h.shape[0]), device=L.g.device)
    gg = dot(L.g, R.g) if want & {"ent.weight", OUTPUT_TABLE, "ent_bias"} else None
    if "fc.weight" in want or "fc.bias" in want:
        dd = dot(L.df, R.df)
        if "fc.weight" in want:
            k = k + dd * dot(L.a, R.a)
        if "fc.bias" in want:
            k = k + dd
    if "ent.weight" in want or OUTPUT_TABLE in want:
        k = k + gg * dot(L.x, R.x)
    if "ent.weight" in want:
        # cross terms (output use of one, input row of the other) and the input-row term
        k = k + at(L.g, R.h) * dot(L.x, R.u)
        k = k + (at(R.g, L.h) if rowwise else at(R.g, L.h).t()) * dot(L.u, R.x)
        k = k + same(L.h, R.h) * dot(L.u, R.u)
    if "rel.weight" in want:
        k = k + same(L.r, R.r) * dot(L.v, R.v)
    if "ent_bias" in want:
        k = k + gg
    if L.small is not None:
        k = k + dot(L.small, R.small)
    return k


def per_example_grads(model: ConvE, triples: torch.Tensor, names: Sequence[str], loss: str = "train",
                      precision: str = "fp32") -> torch.Tensor:
    """Materialised per-triple gradients ``[B, P]`` (fp32) with ``functional_call`` + ``vmap(grad)``.

    Column order: ``names`` in order, each parameter flattened (``ent.weight:output`` = the entity table's output
    role, with the input lookup held fixed).
    """
    c = model.config
    device = model.ent.weight.device
    params = {n: p.detach() for n, p in model.named_parameters()}
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    sel = {n: params[n] for n in names if n != OUTPUT_TABLE}
    const = {n: p for n, p in params.items() if n not in sel}
    use_out = OUTPUT_TABLE in names
    out_w = params["ent.weight"]

    def loss_fn(sel_p: dict[str, torch.Tensor], ow: torch.Tensor, trip: torch.Tensor) -> torch.Tensor:
        full = {**const, **sel_p, **buffers}
        total = torch.zeros((), device=trip.device)
        with autocast(device, precision):
            for q in triple_queries(trip[None], c.num_relations, c.reciprocal):
                logits = functional_call(model, full, (q[:, 0], q[:, 1]),
                                         {"out_weight": ow if use_out else None})
                total = total + query_loss(logits, q[:, 2], c.label_smoothing, loss).sum()
        return total

    g = vmap(grad(loss_fn, argnums=(0, 1)), in_dims=(None, None, 0))(sel, out_w, triples.to(device))
    cols = []
    for n in names:
        gn = g[1] if n == OUTPUT_TABLE else g[0][n]
        cols.append(gn.reshape(len(triples), -1).float())
    return torch.cat(cols, 1)


ProgressFn = Callable[[int, int], None]
LR_WEIGHTS = ("last", "interval")


def tracin_precision(precision: str, device: torch.device | str) -> str:
    """The concrete precision TracIn runs in: ``auto`` is fp32 everywhere (see the module docstring), and ``fp16``
    on a CPU is fp32 (CPU fp16 autocast is slow; bf16, what ``resolve_precision`` would pick, moves single
    layers' influence by percents, so it is never substituted). ``TracIn.warnings`` records the change."""
    if precision == "fp16" and torch.device(device).type == "cpu":
        return "fp32"
    return resolve_precision("fp32" if precision == "auto" else precision, device)


def interval_weights(epochs: Sequence[int], lr: float, lr_decay: float = 1.0) -> list[float]:
    """η_i = Σ of the learning rates of the epochs in checkpoint i's interval (previous checkpoint, epoch_i].

    TracIn's derivation replaces each SGD step z was part of by the checkpoint closest to it, so checkpoint i
    stands for every visit of z since the previous one: once per epoch, each at that epoch's rate
    lr · lr_decay^(e−1). (With a batch-mean loss every visit also carries 1/batch_size; that factor is common to
    all checkpoints and left out, as in the "last" weighting.) ``epochs`` are the checkpoints' epochs in order.
    """
    out, prev = [], 0
    for e in epochs:
        if e <= prev:
            raise ValueError(f"checkpoint epochs must increase, got {list(epochs)}")
        out.append(float(sum(lr * lr_decay ** (k - 1) for k in range(prev + 1, e + 1))))
        prev = e
    return out


class NonFiniteScores(ValueError):
    """A NaN or infinite influence: ``rows`` (test triples) and ``cols`` (training triples) where it appeared."""

    def __init__(self, rows: list[int], cols: list[int]) -> None:
        super().__init__(f"non-finite influence for test rows {rows[:10]} and training columns {cols[:10]}")
        self.rows, self.cols = rows, cols


TEST_FACTOR_BUDGET = 768 * 2**20  # bytes of cached test-side factors (all checkpoints) per block of test triples


class CandidatePairs:
    """Which columns (training triples) are candidates for which rows (test triples).

    Stored as ``(row, col)`` pairs sorted by column, so the mask of a block of columns is one contiguous slice:
    memory is the number of pairs, never rows × columns unless every pair is a candidate (then pass no
    ``CandidatePairs`` at all).
    """

    def __init__(self, rows: torch.Tensor, cols: torch.Tensor, n_rows: int, n_cols: int) -> None:
        order = torch.argsort(cols, stable=True)
        self.rows, self.cols = rows[order].long(), cols[order].long()
        self.n_rows, self.n_cols = n_rows, n_cols

    @classmethod
    def from_columns(cls, per_row: Sequence[torch.Tensor], n_cols: int) -> CandidatePairs:
        """``per_row[i]``: the candidate columns of row ``i``."""
        rows = torch.cat([torch.full((len(c),), i, dtype=torch.long) for i, c in enumerate(per_row)]) \
            if per_row else torch.empty(0, dtype=torch.long)
        cols = torch.cat([c.long() for c in per_row]) if per_row else torch.empty(0, dtype=torch.long)
        return cls(rows, cols, len(per_row), n_cols)

    def columns(self, start: int, end: int) -> CandidatePairs:
        """The pairs of columns ``[start, end)``, renumbered from 0."""
        lo, hi = (int(torch.searchsorted(self.cols, v)) for v in (start, end))
        return CandidatePairs(self.rows[lo:hi], self.cols[lo:hi] - start, self.n_rows, end - start)

    def mask(self, start: int, end: int, row0: int = 0, row1: int | None = None) -> torch.Tensor:
        """Boolean ``[row1 - row0, end - start]``: True where the column is a candidate of the row."""
        row1 = self.n_rows if row1 is None else row1
        lo, hi = (int(torch.searchsorted(self.cols, v)) for v in (start, end))
        r, c = self.rows[lo:hi], self.cols[lo:hi] - start
        keep = (r >= row0) & (r < row1)
        out = torch.zeros(row1 - row0, end - start, dtype=torch.bool)
        out[r[keep] - row0, c[keep]] = True
        return out


@dataclass
class TopInfluence:
    """Per test triple: the ``k`` strongest proponents and opponents among its candidates, with counts.

    ``*_idx`` are column positions in the training triples scored (-1 in unused slots), ``*_val`` the influence,
    ``*_self`` the training triple's self-influence. Ties are broken by column order (the lower column first),
    exactly as a stable sort of the full score row would.
    """

    test_self: torch.Tensor                 # [n]
    n_candidates: torch.Tensor              # [n] long
    n_positive: torch.Tensor                # [n] long
    n_negative: torch.Tensor                # [n] long
    pro_idx: torch.Tensor                   # [n, k] long
    pro_val: torch.Tensor                   # [n, k]
    pro_self: torch.Tensor                  # [n, k]
    opp_idx: torch.Tensor
    opp_val: torch.Tensor
    opp_self: torch.Tensor

    def listed(self, i: int, positive: bool) -> list[tuple[int, float, float]]:
        """``(column, influence, train self-influence)`` of row ``i``'s proponents (or opponents), strongest first."""
        idx, val, slf = (self.pro_idx, self.pro_val, self.pro_self) if positive else \
            (self.opp_idx, self.opp_val, self.opp_self)
        return [(int(j), float(v), float(s)) for j, v, s in zip(idx[i].tolist(), val[i].tolist(),
                                                               slf[i].tolist(), strict=True) if j >= 0]


def _merge_top(vals: torch.Tensor, idx: torch.Tensor, slf: torch.Tensor, new_vals: torch.Tensor,
               new_idx: torch.Tensor, new_self: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """Keep the ``k`` largest of the running ``vals`` and ``new_vals`` (-inf: empty) per row; the running entries
    come first and hold lower columns, so a stable sort keeps column order among ties."""
    v = torch.cat([vals, new_vals], 1)
    order = torch.sort(v, dim=1, descending=True, stable=True).indices[:, :k]
    return (v.gather(1, order), torch.cat([idx, new_idx], 1).gather(1, order),
            torch.cat([slf, new_self], 1).gather(1, order))


@dataclass
class TracIn:
    """TracIn-CP over ConvE checkpoints. See the module docstring for the maths and the two exact methods."""

    model: ConvE
    checkpoints: Sequence[CheckpointLike]
    layers: str | Sequence[str] = "all"
    loss: str = "train"
    method: str = "ghost"
    precision: str = "auto"
    projection_dim: int | None = None
    batch_size: int = 256
    seed: int = 0
    device: torch.device | str | None = None
    weights: Sequence[float] | None = None
    names: tuple[str, ...] = field(init=False)
    requested_precision: str = field(init=False)
    warnings: list[str] = field(init=False)
    _work: ConvE = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if not self.checkpoints:
            raise ValueError("no checkpoints")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if self.projection_dim is not None and self.projection_dim < 1:
            raise ValueError("projection_dim must be >= 1")
        if self.projection_dim is not None and self.method != "ghost":
            raise ValueError("projection_dim needs method='ghost'")
        self.device = torch.device(self.device) if self.device is not None else self.model.ent.weight.device
        if self.weights is None:
            self.weights = [float(c.lr) for c in self.checkpoints]
        if len(self.weights) != len(self.checkpoints):
            raise ValueError(f"{len(self.weights)} weights for {len(self.checkpoints)} checkpoints")
        self.requested_precision = self.precision
        self.precision = tracin_precision(self.precision, self.device)
        self.warnings = []
        if self.requested_precision == "fp16" and self.precision != "fp16":
            self.warnings.append(f"precision 'fp16' was requested but the device is {self.device.type}: ran "
                                 f"{self.precision} instead (fp16 runs on CUDA only; bf16 is available on request)")
        self._factor_key: str | None = None
        if self.method == "vmap" and self.precision != "fp32":
            raise ValueError("method='vmap' is the fp32 reference; use method='ghost' for half precision")
        self.names = resolve_layers(self.model, self.layers)
        self._models: dict[int, ConvE] = {}  # checkpoint index -> its weights (``_use``)
        self._work = copy.deepcopy(self.model).to(self.device).eval()
        for p in self._work.parameters():
            p.requires_grad_(False)
        self._projection: torch.Tensor | None = None
        flat = self.model.config.flat_dim
        if self.projection_dim is not None and self.projection_dim < flat and "fc.weight" in self.names:
            gen = torch.Generator().manual_seed(self.seed)
            self._projection = (torch.randn(flat, self.projection_dim, generator=gen)
                                / self.projection_dim ** 0.5).to(self.device)

    # -- per checkpoint ------------------------------------------------------------------------------------------
    def _load(self, ckpt: CheckpointLike) -> None:
        self._work.load_state_dict(ckpt.state_dict(self.device))
        self._work.eval()

    def _use(self, index: int) -> None:
        """Make checkpoint ``index``'s weights current; each is read once and kept (a copy of the model per
        checkpoint: the streaming pass visits every checkpoint for every training chunk)."""
        model = self._models.get(index)
        if model is None:
            model = copy.deepcopy(self._work)
            model.load_state_dict(self.checkpoints[index].state_dict(self.device))
            model.eval()
            self._models[index] = model
        self._current = model

    def factor_key(self) -> str:
        """A digest of everything that changes the test-side factors: the weights of every checkpoint (and so
        the model version), their order and TracIn weights, the layers, loss, method, precision, projection (its
        size and seed) and device. ``top_influence`` serves a ``test_cache`` entry only under the same key."""
        if self._factor_key is None:
            import hashlib

            h = hashlib.sha256(repr((self.names, self.loss, self.method, self.precision, self.projection_dim,
                                     self.seed if self._projection is not None else None, str(self.device),
                                     [float(w) for w in self.weights], self.model.config)).encode())
            for c in range(len(self.checkpoints)):
                self._use(c)
                for name, t in sorted(self._current.state_dict().items()):
                    t = t.detach().cpu().contiguous()
                    h.update(f"{c}\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
                    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
            self._factor_key = h.hexdigest()
        return self._factor_key

    def _test_bytes_per_triple(self) -> int:
        """fp32 bytes of one test triple's factors for one checkpoint (what a test block keeps per checkpoint)."""
        c = self.model.config
        nq = 2 if c.reciprocal else 1
        if self.method == "vmap":
            per = sum(self._work.get_parameter(n.split(":")[0]).numel() for n in self.names)
            return 4 * per
        a = self._projection.shape[1] if self._projection is not None else c.flat_dim
        return 4 * nq * (c.num_entities + 4 * c.embedding_dim + a + 512)

    def _queries(self, triples: torch.Tensor) -> tuple[torch.Tensor, int]:
        c = self.model.config
        qs = triple_queries(triples, c.num_relations, c.reciprocal)
        return torch.cat(qs), len(qs)

    def _features(self, triples: torch.Tensor, model: ConvE | None = None) -> Any:
        """Ghost factors of the stacked queries, or materialised per-triple gradients (``model``: default the
        working copy loaded by ``_load``)."""
        model = self._work if model is None else model
        if self.method == "vmap":
            # [B, P] fp32 gradients: keep each vmap batch under ~256 MB
            n_params = sum(self._work.get_parameter(n.split(":")[0]).numel() for n in self.names)
            step = max(1, min(self.batch_size, 2**26 // max(n_params, 1)))
            return torch.cat([per_example_grads(model, triples[i:i + step], self.names, self.loss,
                                                self.precision) for i in range(0, len(triples), step)])
        q, _ = self._queries(triples)
        parts = [ghost_factors(model, q[i:i + self.batch_size], self.names, self.loss, self.precision,
                               self._projection) for i in range(0, len(q), self.batch_size)]
        return QueryFactors.cat(parts)

    def _pair(self, fa: Any, fb: Any, n: int, m: int) -> torch.Tensor:
        """Triple-level dot products ``[n, m]``."""
        if self.method == "vmap":
            return fa @ fb.t()
        nq = fa.h.shape[0] // n
        k = ghost_kernel(fa, fb, self.names)
        return k.reshape(nq, n, nq, m).sum((0, 2))

    def _self(self, fa: Any, n: int) -> torch.Tensor:
        """Triple-level self dot products ``[n]``."""
        if self.method == "vmap":
            return (fa * fa).sum(1)
        nq = fa.h.shape[0] // n
        out = torch.zeros(n, device=fa.g.device)
        for i in range(nq):
            for j in range(nq):
                out = out + ghost_kernel(fa.take(slice(i * n, (i + 1) * n)), fa.take(slice(j * n, (j + 1) * n)),
                                         self.names, rowwise=True)
        return out

    # -- public ----------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def influence(self, test: torch.Tensor, train: torch.Tensor, progress: ProgressFn | None = None,
                  train_self: bool = False) -> tuple[torch.Tensor, ...]:
        """``(scores [n_test, n_train], test_self [n_test])``, plus ``train_self [n_train]`` when asked; fp32, CPU.

        Test factors are computed once per checkpoint and reused for every training batch; the training triples'
        self-influence reuses the factors of the same pass.
        """
        n, m = len(test), len(train)
        scores = torch.zeros(n, m, device=self.device)
        test_self = torch.zeros(n, device=self.device)
        tr_self = torch.zeros(m, device=self.device)
        step = self.batch_size
        chunks = list(range(0, m, step))
        total = len(self.checkpoints) * len(chunks)
        done = 0
        for ckpt, eta in zip(self.checkpoints, self.weights, strict=True):
            self._load(ckpt)
            ft = self._features(test)
            test_self += eta * self._self(ft, n)
            for i in chunks:
                b = train[i:i + step]
                fb = self._features(b)
                scores[:, i:i + len(b)] += eta * self._pair(ft, fb, n, len(b))
                if train_self:
                    tr_self[i:i + len(b)] += eta * self._self(fb, len(b))
                done += 1
                if progress is not None:
                    progress(done, total)
        out = (scores.cpu(), test_self.cpu())
        return (*out, tr_self.cpu()) if train_self else out

    @torch.no_grad()
    def top_influence(self, test: torch.Tensor, train: torch.Tensor, k: int,
                      candidates: CandidatePairs | None = None, progress: ProgressFn | None = None,
                      test_block: int | None = None, dense: Any = None,
                      test_cache: dict | None = None) -> TopInfluence:
        """Streaming TracIn: the top-``k`` proponents and opponents of each test triple among ``train``.

        Memory does not grow with ``len(test) × len(train)``: training triples are visited in chunks of
        ``batch_size``, and for each chunk the checkpoints' contributions are summed (each checkpoint's test-side
        factors are computed once per block of test triples and kept) before a running top-k per test triple is
        updated. Test triples are taken in blocks of ``test_block`` (default: as many as fit
        ``TEST_FACTOR_BUDGET``). ``candidates`` restricts each test triple to its own columns (all when None).
        ``dense``: an optional ``[n_test, n_train]`` array (a ``numpy`` memmap, say) that receives every score.
        ``test_cache``: a dict the caller keeps between calls of this engine's settings and checkpoints over
        different ``train`` ranges with the same ``test`` (the shards of one job in one worker): when the test
        triples fit one block (``TEST_FACTOR_BUDGET``), their factors and self-influence are kept in it and reused
        instead of recomputed. The call holds that block anyway, so the peak memory does not grow; between calls
        the dict holds it until the caller drops it.
        """
        n, m = len(test), len(train)
        n_ck = len(self.checkpoints)
        if test_block is None:
            test_block = max(1, TEST_FACTOR_BUDGET // max(1, n_ck * self._test_bytes_per_triple()))
        test_block = max(1, min(n, test_block)) if n else 1
        step = self.batch_size
        chunks = list(range(0, m, step))
        blocks = list(range(0, n, test_block))
        total = max(1, len(blocks) * len(chunks) * n_ck)
        done = 0
        k = max(0, int(k))
        neg = float("-inf")
        out = {name: [] for name in ("test_self", "n_candidates", "n_positive", "n_negative", "pro_idx", "pro_val",
                                     "pro_self", "opp_idx", "opp_val", "opp_self")}
        for r0 in blocks:
            tb = test[r0:r0 + test_block]
            nb = len(tb)
            cacheable = test_cache is not None and len(blocks) == 1
            key = self.factor_key() if cacheable else None
            hit = test_cache.get("block") if cacheable else None
            if hit is not None and hit[3] == key and torch.equal(hit[0], tb.cpu()):
                factors, t_self = hit[1], hit[2]
            else:
                factors, t_self = [], torch.zeros(nb, device=self.device)
                for c, eta in enumerate(self.weights):
                    self._use(c)
                    factors.append(self._features(tb, self._current))
                    t_self += eta * self._self(factors[-1], nb)
                if cacheable:
                    test_cache["block"] = (tb.cpu().clone(), factors, t_self, key)
            n_cand = torch.zeros(nb, dtype=torch.long)
            n_pos = torch.zeros(nb, dtype=torch.long)
            n_neg = torch.zeros(nb, dtype=torch.long)
            top = {side: (torch.full((nb, k), neg), torch.full((nb, k), -1, dtype=torch.long),
                          torch.zeros(nb, k)) for side in ("pro", "opp")}
            for i in chunks:
                b = train[i:i + step]
                nb_train = len(b)
                scores = torch.zeros(nb, nb_train, device=self.device)
                tr_self = torch.zeros(nb_train, device=self.device)
                for c, eta in enumerate(self.weights):
                    self._use(c)
                    fb = self._features(b, self._current)
                    scores += eta * self._pair(factors[c], fb, nb, nb_train)
                    tr_self += eta * self._self(fb, nb_train)
                    done += 1
                    if progress is not None:
                        progress(done, total)
                del fb
                scores, tr_self = scores.cpu(), tr_self.cpu()
                bad = ~torch.isfinite(scores)
                if bool(bad.any()) or not bool(torch.isfinite(tr_self).all()):
                    rows = torch.nonzero(bad.any(1)).flatten() + r0
                    cols = torch.nonzero(bad.any(0) | ~torch.isfinite(tr_self)).flatten() + i
                    raise NonFiniteScores(rows.tolist(), cols.tolist())
                mask = None if candidates is None else candidates.mask(i, i + nb_train, r0, r0 + nb)
                if dense is not None:  # every score; NaN where a column is not the row's candidate
                    block = scores if mask is None else scores.masked_fill(~mask, float("nan"))
                    dense[r0:r0 + nb, i:i + nb_train] = block.numpy()
                pos, negm = scores > 0, scores < 0
                if mask is not None:
                    pos, negm = pos & mask, negm & mask
                    n_cand += mask.sum(1)
                else:
                    n_cand += nb_train
                n_pos += pos.sum(1)
                n_neg += negm.sum(1)
                if k:
                    cols = torch.arange(i, i + nb_train).expand(nb, nb_train)
                    selfs = tr_self.expand(nb, nb_train)
                    for side, sel, val in (("pro", pos, scores), ("opp", negm, -scores)):
                        top[side] = _merge_top(*top[side], val.masked_fill(~sel, neg), cols, selfs, k)
            if not bool(torch.isfinite(t_self).all()):
                raise NonFiniteScores((torch.nonzero(~torch.isfinite(t_self)).flatten() + r0).tolist(), [])
            out["test_self"].append(t_self.cpu())
            out["n_candidates"].append(n_cand)
            out["n_positive"].append(n_pos)
            out["n_negative"].append(n_neg)
            for side in ("pro", "opp"):
                v, ix, sf = top[side]
                empty = torch.isinf(v)
                ix = ix.masked_fill(empty, -1)
                out[f"{side}_idx"].append(ix)
                out[f"{side}_val"].append((v if side == "pro" else -v).masked_fill(empty, 0.0))
                out[f"{side}_self"].append(sf.masked_fill(empty, 0.0))
            del factors
        if not blocks:
            return TopInfluence(torch.zeros(0), *(torch.zeros(0, dtype=torch.long),) * 3,
                                *(torch.zeros(0, k, dtype=torch.long), torch.zeros(0, k), torch.zeros(0, k)) * 2)
        return TopInfluence(**{name: torch.cat(parts) for name, parts in out.items()})

    @torch.no_grad()
    def self_influence(self, triples: torch.Tensor, progress: ProgressFn | None = None) -> torch.Tensor:
        """TracIn(z, z) for every triple ``[n]``."""
        out = torch.zeros(len(triples), device=self.device)
        step = self.batch_size
        chunks = list(range(0, len(triples), step))
        done = 0
        for ckpt, eta in zip(self.checkpoints, self.weights, strict=True):
            self._load(ckpt)
            for i in chunks:
                b = triples[i:i + step]
                out[i:i + len(b)] += eta * self._self(self._features(b), len(b))
                done += 1
                if progress is not None:
                    progress(done, len(self.checkpoints) * len(chunks))
        return out.cpu()
