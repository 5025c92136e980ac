r"""TracIn-CP for ConvE triples: ConvE's :class:`models.explain.tracin.GradientModel` and the engine bound to it.

The engine, its streaming pass and the checkpoint weights are model-agnostic (:mod:`models.explain.tracin`); this
module supplies ConvE's per-triple gradients. ``ℓ`` is the per-triple training loss (``models.kg.conve.triple_loss``:
1-N BCE with label smoothing, summed over both query directions when the model is reciprocal) or, with
``loss="score_bce"``, BCE of the single score σ(s_t) against 1, or ``loss="margin"``, the negated multi-class margin
(``models.kg.conve.query_loss``), with the model in eval mode. The gradient is
restricted to the parameters named by ``layers`` (:func:`resolve_layers`).

Two exact ways to compute the dot products (:class:`ConvEGradients`):

``method="vmap"`` (the oracle). Per-example gradients from ``torch.func`` (``functional_call`` + ``vmap(grad)``),
flattened and multiplied. Simple and exact, but it materialises ``[batch, P]`` gradients (P ≈ 2.1M for ConvE-200).
It equals the generic :class:`models.explain.tracin.FuncGradients` on the same model, and so does the ghost method
(``tests/test_explain_generic.py``).

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
brought every layer group within fp16's rounding of fp32 on CPU autocast (≤ 1.1e-3 relative); ``bf16`` is kept as
an explicit opt-in. Test-side factors are computed once per checkpoint and reused for every training batch (the
engine's doing).

:class:`ConvETracIn` is the engine with :class:`ConvEGradients`, constructed from the model and the ConvE settings
(``models.kg.influence`` and ``models.kg.evaluation`` use it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from models.common import autocast, resolve_precision
from models.explain.tracin import CheckpointLike, ModuleGradients, TracIn
from models.kg.conve import ConvE, query_loss, triple_queries
from models.kg.shapes import OUTPUT_TABLE

LAST_LAYERS = ("fc.weight", "fc.bias", OUTPUT_TABLE)
# Parameters whose gradient needs the backward pass through the convolution block.
DEEP = ("ent.weight", "rel.weight", "bn0.weight", "bn0.bias", "conv.weight", "conv.bias", "bn1.weight", "bn1.bias")
# Parameters whose per-query gradients are materialised (``QueryFactors.small``), not factored.
SMALL = ("bn0.weight", "bn0.bias", "conv.weight", "conv.bias", "bn1.weight", "bn1.bias", "bn2.weight", "bn2.bias")
# Parameters whose gradient needs the backward pass through BN2 only.
MID = ("fc.weight", "fc.bias", "bn2.weight", "bn2.bias")
LOSSES = ("train", "score_bce", "margin")
METHODS = ("ghost", "vmap")
# The layer groups a listed score is broken down by (``ConvETracIn.breakdown``): each parameter in one group, so the
# groups' kernels add up to the whole kernel (every term of ``ghost_kernel`` belongs to one parameter).
LAYER_GROUPS = (
    ("entity table", ("ent.weight", OUTPUT_TABLE)),
    ("relation table", ("rel.weight",)),
    ("convolution and batch norm", SMALL),
    ("fully connected", ("fc.weight", "fc.bias")),
    ("entity bias", ("ent_bias",)),
)


def layer_groups(names: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    """``LAYER_GROUPS`` restricted to ``names`` (empty groups left out), in that order; a name of no group is a
    group of its own."""
    out = [(label, tuple(n for n in members if n in names)) for label, members in LAYER_GROUPS]
    known = {n for _, members in LAYER_GROUPS for n in members}
    out += [(n, (n,)) for n in names if n not in known]
    return [(label, members) for label, members in out if members]



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


def tracin_precision(precision: str, device: torch.device | str) -> str:
    """The concrete precision TracIn runs in: ``auto`` is fp32 everywhere (see the module docstring), and ``fp16``
    on a CPU is fp32 (CPU fp16 autocast is slow; bf16, what ``resolve_precision`` would pick, moves single
    layers' influence by percents, so it is never substituted). ``TracIn.warnings`` records the change."""
    if precision == "fp16" and torch.device(device).type == "cpu":
        return "fp32"
    return resolve_precision("fp32" if precision == "auto" else precision, device)




class ConvEGradients(ModuleGradients):
    """ConvE's :class:`models.explain.tracin.GradientModel`: per-triple gradient features of one ConvE at the
    weights last loaded, as ghost factors of the stacked queries (``method="ghost"``) or materialised per-triple
    gradients (``"vmap"``), and the triple-level dot products of either (see the module docstring).

    ``precision`` is resolved by :func:`tracin_precision` (``requested_precision`` keeps what was asked, and
    ``warnings`` says when they differ); ``projection_dim`` (ghost only) projects fc's input features with a
    Gaussian matrix seeded by ``seed``; ``batch_size`` queries per ghost pass.
    """

    def __init__(self, model: ConvE, layers: str | Sequence[str] = "all", loss: str = "train",
                 method: str = "ghost", precision: str = "auto", projection_dim: int | None = None,
                 batch_size: int = 256, seed: int = 0, device: torch.device | str | None = None) -> None:
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if projection_dim is not None and projection_dim < 1:
            raise ValueError("projection_dim must be >= 1")
        if projection_dim is not None and method != "ghost":
            raise ValueError("projection_dim needs method='ghost'")
        device = torch.device(device) if device is not None else model.ent.weight.device
        self.model, self.layers, self.loss, self.method = model, layers, loss, method
        self.projection_dim, self.batch_size, self.seed = projection_dim, batch_size, seed
        self.requested_precision = precision
        self.precision = tracin_precision(precision, device)
        warnings = []
        if self.requested_precision == "fp16" and self.precision != "fp16":
            warnings.append(f"precision 'fp16' was requested but the device is {device.type}: ran "
                            f"{self.precision} instead (fp16 runs on CUDA only; bf16 is available on request)")
        if self.method == "vmap" and self.precision != "fp32":
            raise ValueError("method='vmap' is the fp32 reference; use method='ghost' for half precision")
        self.names = resolve_layers(model, layers)
        super().__init__(model, device)
        self.warnings = warnings
        self._projection: torch.Tensor | None = None
        flat = model.config.flat_dim
        if self.projection_dim is not None and self.projection_dim < flat and "fc.weight" in self.names:
            gen = torch.Generator().manual_seed(self.seed)
            self._projection = (torch.randn(flat, self.projection_dim, generator=gen)
                                / self.projection_dim ** 0.5).to(self.device)

    def fingerprint(self) -> str:
        return repr((self.names, self.loss, self.method, self.precision, self.projection_dim,
                     self.seed if self._projection is not None else None, str(self.device), self.model.config))

    def bytes_per_example(self) -> int:
        """fp32 bytes of one triple's features for one checkpoint."""
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

    def features(self, triples: torch.Tensor, weights: ConvE | None = None) -> Any:
        """Ghost factors of the stacked queries, or materialised per-triple gradients (``weights``: a snapshot,
        default the working copy ``load`` filled)."""
        model = self._work if weights is None else weights
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

    def dots(self, fa: Any, fb: Any, n: int, m: int) -> torch.Tensor:
        """Triple-level dot products ``[n, m]``."""
        if self.method == "vmap":
            return fa @ fb.t()
        nq = fa.h.shape[0] // n
        k = ghost_kernel(fa, fb, self.names)
        return k.reshape(nq, n, nq, m).sum((0, 2))

    def margin_features(self, triples: torch.Tensor) -> QueryFactors:
        """Ghost factors of each triple's negated margin on its tail query (h, r, ?) alone, at the current weights:
        the test side of TracIn on the output an LDS evaluation measures (``ghost`` only)."""
        if self.method != "ghost":
            raise ValueError("the margin output needs method='ghost'")
        parts = [ghost_factors(self._work, triples[i:i + self.batch_size].to(self.device), self.names, "margin",
                               self.precision, self._projection) for i in range(0, len(triples), self.batch_size)]
        return QueryFactors.cat(parts)

    def output_dots(self, ft: QueryFactors, fb: QueryFactors, n: int, m: int) -> torch.Tensor:
        """``[n, m]``: dot products of ``n`` one-query test factors (:meth:`margin_features`) with ``m`` training
        triples' factors (:meth:`features`, every query of each)."""
        nq = fb.h.shape[0] // m
        return ghost_kernel(ft, fb, self.names).reshape(n, nq, m).sum(1)

    def group_dots(self, test: torch.Tensor, train: torch.Tensor, groups: Sequence[Sequence[str]],
                   weights: ConvE | None = None) -> torch.Tensor:
        """``[n, G]``: ⟨∇ℓ(test_i), ∇ℓ(train_i)⟩ restricted to each group of parameters (disjoint subsets of the
        layers), row by row, at ``weights`` (a snapshot; default the working copy ``load`` filled), by this
        model's method, precision and projection (what its scores are made of). One gradient pass per side: the
        groups share the factors (ghost) or split the materialised gradients' columns (vmap)."""
        model = self._work if weights is None else weights
        test, train = test.to(self.device), train.to(self.device)
        names = [n for group in groups for n in group]
        if self.method == "vmap":
            prod = (per_example_grads(model, test, names, self.loss, self.precision)
                    * per_example_grads(model, train, names, self.loss, self.precision))
            sizes = [sum(self._work.get_parameter(n.split(":")[0]).numel() for n in group) for group in groups]
            return torch.stack([part.sum(1) for part in prod.split(sizes, dim=1)], 1)
        n = len(test)
        qa, nq = self._queries(test)
        qb, _ = self._queries(train)
        fa = ghost_factors(model, qa, names, self.loss, self.precision, self._projection)
        fb = ghost_factors(model, qb, names, self.loss, self.precision, self._projection)
        small = set(SMALL) & set(names)
        out = torch.zeros(n, len(groups), device=fa.g.device)
        for i in range(nq):
            la = fa.take(slice(i * n, (i + 1) * n))
            for j in range(nq):
                rb = fb.take(slice(j * n, (j + 1) * n))
                for g, group in enumerate(groups):
                    members = set(group)
                    if members & small:
                        if members != small:  # the materialised block holds every small parameter named
                            raise ValueError(f"group {sorted(members)} must hold all of {sorted(small)} (the "
                                             "materialised parameters are one block)")
                        out[:, g] += (la.small * rb.small).sum(-1)
                    else:
                        big_a = dataclasses.replace(la, small=None)
                        big_b = dataclasses.replace(rb, small=None)
                        out[:, g] += ghost_kernel(big_a, big_b, group, rowwise=True)
        return out

    def self_dots(self, fa: Any, n: int) -> torch.Tensor:
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


class ConvETracIn(TracIn):
    """TracIn-CP over ConvE checkpoints: :class:`models.explain.tracin.TracIn` with :class:`ConvEGradients`
    (see the module docstring for the maths and the two exact methods). ``weights``: η per checkpoint (default
    each checkpoint's learning rate)."""

    def __init__(self, model: ConvE, checkpoints: Sequence[CheckpointLike], layers: str | Sequence[str] = "all",
                 loss: str = "train", method: str = "ghost", precision: str = "auto",
                 projection_dim: int | None = None, batch_size: int = 256, seed: int = 0,
                 device: torch.device | str | None = None, weights: Sequence[float] | None = None) -> None:
        if not checkpoints:
            raise ValueError("no checkpoints")
        gradients = ConvEGradients(model, layers, loss, method, precision, projection_dim, batch_size, seed, device)
        super().__init__(gradients, checkpoints, batch_size, weights)
        self.model = model

    @torch.no_grad()
    def output_influence(self, test: torch.Tensor, train: torch.Tensor,
                         checkpoints: Sequence[int] | None = None) -> torch.Tensor:
        """``[n_test, n_train]``: Σ_c η_c ⟨∇(−f)(z_test), ∇ℓ(z_train)⟩ with f the test triple's margin on its tail
        query (:meth:`ConvEGradients.margin_features`) and ℓ the training loss of the training triple (positive:
        a step on the training triple raises the margin). ``checkpoints``: the positions of the checkpoints used
        (default all)."""
        n, m = len(test), len(train)
        out = torch.zeros(n, m, device=self.device, dtype=self.dtype)
        which = range(len(self.checkpoints)) if checkpoints is None else checkpoints
        for c in which:
            self._load(self.checkpoints[c])
            ft = self.gradients.margin_features(test)
            for i in range(0, m, self.batch_size):
                b = train[i:i + self.batch_size]
                out[:, i:i + len(b)] += self.weights[c] * self.gradients.output_dots(
                    ft, self.gradients.features(b), n, len(b))
        return out.cpu()

    @torch.no_grad()
    def breakdown(self, test: torch.Tensor, train: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        """Where the scores of the pairs (``test[i]``, ``train[i]``) come from: ``(per_checkpoint [n, C],
        per_group [n, G], group labels)`` with per_checkpoint[i, c] = η_c ⟨∇ℓ_c(test_i), ∇ℓ_c(train_i)⟩ and
        per_group[i, g] = Σ_c η_c ⟨∇ℓ_c, ∇ℓ_c'⟩ over the parameters of layer group g (``layer_groups``); each
        sums, over its columns, to the pair's score. Computed in blocks of ``batch_size`` pairs."""
        groups = layer_groups(self.names)
        n = len(test)
        per_ck = torch.zeros(n, len(self.checkpoints), dtype=torch.float64)
        per_group = torch.zeros(n, len(groups), dtype=torch.float64)
        members = [m for _, m in groups]
        for c, eta in enumerate(self.weights):
            self._use(c)
            for i in range(0, n, self.batch_size):
                ta, tb = test[i:i + self.batch_size], train[i:i + self.batch_size]
                k = eta * self.gradients.group_dots(ta, tb, members, self._current).double().cpu()
                per_ck[i:i + len(ta), c] += k.sum(1)
                per_group[i:i + len(ta)] += k
        return per_ck, per_group, [label for label, _ in groups]

    @property
    def precision(self) -> str:
        """The precision the gradients run in."""
        return self.gradients.precision

    @property
    def requested_precision(self) -> str:
        return self.gradients.requested_precision

    @property
    def method(self) -> str:
        return self.gradients.method

    @property
    def loss(self) -> str:
        return self.gradients.loss
