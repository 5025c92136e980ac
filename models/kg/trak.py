r"""TRAK-style data attribution for ConvE triples: ConvE's :class:`models.explain.trak.Projector`, the scores of a
bundle, and the dense float64 reference.

The estimator (features, damped Gauss–Newton inverse, checkpoint average, the seeded Kronecker projection) is
model-agnostic and documented in :mod:`models.explain.trak`; here ``ℓ`` is the per-triple loss TracIn uses
(``loss="train"``: 1-N BCE with label smoothing, summed over both query directions of a reciprocal model;
``"score_bce"``: BCE of σ(s_t) against 1; ``"margin"``: TRAK's output function, the negated multi-class margin
−(s_t − log Σ_{e≠t} exp s_e) of the tail query (h, r, ?) alone, the quantity an LDS evaluation measures), and the
gradient is restricted to ``layers`` (names as in :func:`models.kg.tracin.resolve_layers`).

:func:`trak_scores` averages TRAK over a bundle's checkpoints and :func:`self_scores` gives each training triple's
score on itself (mislabel detection). With ``loss="margin"`` this is the paper's estimator (its features are
gradients of the margin on both sides) except for two choices: TRAK's diagonal re-weighting ``Q = diag(1 − p)`` is
not applied (on Nations it changed the LDS by under 0.01), and the ensemble is over the checkpoints of one training
run (as in TRAK's checkpoint ensembles), each given the same weight. With ``loss="train"`` (the default, as TracIn)
the features are gradients of the training loss instead; the evaluation's ``trak`` estimator
(``models.kg.evaluation.trak_scores``) uses the margin. :func:`tracin_projected_scores` is TracIn with projected
gradients.

ConvE's projector (:class:`GradientProjector`). Every parameter is viewed as a matrix (:func:`matrix_shape`;
``ent.weight:output`` is the entity table, ``conv.weight`` ``[F, k_h·k_w]``). ConvE's large gradients are sums of
outer products (``fc.weight``: δ_f ⊗ a; the entity table: g ⊗ x + 1_h ⊗ u), and
``(A ⊗ B)ᵀ vec(α βᵀ) = (Aᵀα) ⊗ (Bᵀβ)``, so a feature costs O(m·k₁ + n·k₂ + k) per outer product and neither the
per-example gradient (2.1M numbers for ConvE-200) nor ``P`` (2.1M × k) is ever built; the small parameters' gradients
(convolution, BatchNorm) are materialised and projected as ``vec(Aᵀ G B)``. The factors are the generic ones
(:func:`models.explain.trak.projection_factor`), so the features equal the generic
:class:`models.explain.trak.FuncProjector`'s on the same model and seed (``tests/test_explain_generic.py``). The loss
gradient ∂ℓ/∂s is taken in closed form, ``(σ(s) − y)/N`` for the 1-N loss and ``σ(s_t) − 1`` at the one score
``score_bce`` touches (so that loss never multiplies by the whole entity table); the rest of the backward pass is
autograd's.

Reference: :func:`reference_trak_scores` multiplies full per-example gradients from ``torch.func``
(:func:`dense_gradients`) with the explicit projection matrix (:func:`models.explain.trak.projection_matrix`) and
inverts the Gauss–Newton matrix explicitly, in float64.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from models.explain.gradients import LossFn
from models.explain.trak import (
    DEFAULT_DAMPING,
    MAX_PROJ_DIM,
    KroneckerProjector,
    check_damping,
    checkpoint_etas,
    matrix_view,
    projected_self_scores,
    projected_tracin_scores,
    projected_trak_scores,
    projection_matrix,
    resolve_checkpoints,
)
from models.kg.conve import ConvE, ConvEConfig, triple_queries
from models.kg.shapes import OUTPUT_TABLE
from models.kg.tracin import DEEP, resolve_layers

LOSSES = ("train", "score_bce", "margin")


def matrix_shape(model: ConvE, name: str) -> tuple[int, int]:
    """The matrix view ``[m, n]`` of parameter ``name`` (``ent.weight:output`` is the entity table)."""
    return matrix_view(model.get_parameter("ent.weight" if name == OUTPUT_TABLE else name).shape)


def parameter_shapes(model: ConvE, names: Sequence[str]) -> dict[str, tuple[int, int]]:
    """``{name: matrix view}`` of the parameters ``names``, in order: what
    :func:`models.explain.trak.projection_matrix` takes (rows as :func:`dense_gradients` lays gradients out)."""
    return {name: matrix_shape(model, name) for name in names}


def _loss(logits: torch.Tensor, t: torch.Tensor, label_smoothing: float, kind: str) -> torch.Tensor:
    """``models.kg.conve.query_loss`` in the logits' own dtype (float64 for the reference comparisons)."""
    if kind == "train":
        n = logits.shape[-1]
        onehot = (torch.arange(n, device=logits.device) == t.unsqueeze(-1)).to(logits.dtype)
        y = (1.0 - label_smoothing) * onehot + 1.0 / n
        return F.binary_cross_entropy_with_logits(logits, y, reduction="none").mean(-1)
    if kind == "score_bce":
        s = logits.gather(-1, t.unsqueeze(-1)).squeeze(-1)
        return F.binary_cross_entropy_with_logits(s, torch.ones_like(s), reduction="none")
    if kind == "margin":  # −(s_t − logsumexp_{e≠t} s_e), TRAK's output function (negated: lower is better)
        s = logits.gather(-1, t.unsqueeze(-1)).squeeze(-1)
        others = logits.scatter(-1, t.unsqueeze(-1), float("-inf"))
        return torch.logsumexp(others, -1) - s
    raise ValueError(f"loss must be one of {LOSSES}, got {kind!r}")


def _bn(x: torch.Tensor, bn: torch.nn.Module) -> torch.Tensor:
    return F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight.detach(), bn.bias.detach(), False, 0.0,
                        bn.eps)


def _xhat(x: torch.Tensor, bn: torch.nn.Module) -> torch.Tensor:
    shape = (1, -1) + (1,) * (x.dim() - 2)
    return (x.detach() - bn.running_mean.view(shape)) * torch.rsqrt(bn.running_var.view(shape) + bn.eps)



@dataclass
class GradientProjector(KroneckerProjector):
    """ConvE's :class:`models.explain.trak.Projector`: projected per-triple gradients ``φ(z) = Pᵀ∇ℓ(z)`` of one
    ConvE at the weights last ``load``-ed, from the factored gradients (module docstring)."""

    model: ConvE
    layers: str | Sequence[str] = "all"
    loss: str = "train"
    proj_dim: int = 256
    seed: int = 0
    device: torch.device | str | None = None
    dtype: torch.dtype = torch.float32
    batch_size: int = 256
    names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        if not 1 <= int(self.proj_dim) <= MAX_PROJ_DIM:
            raise ValueError(f"proj_dim must be between 1 and {MAX_PROJ_DIM}, got {self.proj_dim}")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.device = torch.device(self.device) if self.device is not None else self.model.ent.weight.device
        self.names = resolve_layers(self.model, self.layers)
        self.prepare(self.model, parameter_shapes(self.model, self.names))

    @torch.no_grad()
    def features(self, triples: torch.Tensor) -> torch.Tensor:
        """``[n, k]`` projected gradients of ``triples`` ``[n, 3]`` (in ``dtype``, on ``device``)."""
        out = torch.empty(len(triples), int(self.proj_dim), dtype=self.dtype, device=self.device)
        for i in range(0, len(triples), self.batch_size):
            b = triples[i:i + self.batch_size].to(self.device)
            out[i:i + len(b)] = self._batch(b)
        return out

    def _batch(self, triples: torch.Tensor) -> torch.Tensor:
        c = self.model.config
        phi = torch.zeros(len(triples), int(self.proj_dim), dtype=self.dtype, device=self.device)
        queries = triple_queries(triples, c.num_relations, c.reciprocal)
        if self.loss == "margin":  # the margin is of the tail query (h, r, ?) alone
            queries = queries[:1]
        for q in queries:
            phi += self._query_features(q)
        return phi / math.sqrt(int(self.proj_dim))

    def _query_features(self, q: torch.Tensor) -> torch.Tensor:
        """Σ over the selected parameters of ``(A ⊗ B)ᵀ vec(∇_param ℓ)`` for queries ``q`` ``[B, 3]``."""
        m, c = self._work, self.model.config
        want = set(self.names)
        h, r, t = q[:, 0], q[:, 1], q[:, 2]
        E = m.ent.weight
        deep = bool(want & set(DEEP))   # gradients below fc's input need the backward pass through the conv block
        with torch.enable_grad():
            e = E[h].clone().requires_grad_(deep)
            rr = m.rel.weight[r].clone().requires_grad_(deep)
            x0 = m.stack(e, rr)
            z0 = _bn(x0, m.bn0)
            cv = F.conv2d(z0, m.conv.weight, m.conv.bias)
            z1 = _bn(cv, m.bn1)
            a = F.relu(z1).flatten(1)
            f = F.linear(a, m.fc.weight, m.fc.bias)
            if not deep:
                f = f.detach().requires_grad_(True)
            z2 = _bn(f, m.bn2)
            xq = F.relu(z2)
            # ∂ℓ/∂s in closed form (no autograd through the N-wide loss): the 1-N loss averages BCE over the N
            # entities, so g = (σ(s) − y)/N; score_bce touches s_t only, g_t = σ(s_t) − 1 (and s_t alone is
            # computed: no product with the whole entity table)
            xd = xq.detach()
            if self.loss == "train":
                g = torch.sigmoid(xd @ E.t() + m.ent_bias)
                n = g.shape[1]
                g.sub_(1.0 / n)
                g[torch.arange(len(t), device=g.device), t] -= 1.0 - c.label_smoothing
                g.div_(n)
                gt = None
                dxq = g @ E
            elif self.loss == "margin":
                # the negative multi-class margin −(s_t − logsumexp_{e≠t} s_e): ∂/∂s_e = softmax_{e≠t}(s)_e for
                # e ≠ t and −1 at t
                s_all = xd @ E.t() + m.ent_bias
                rows_ = torch.arange(len(t), device=s_all.device)
                s_all[rows_, t] = float("-inf")
                g = torch.softmax(s_all, dim=1)
                g[rows_, t] = -1.0
                gt = None
                dxq = g @ E
            else:
                et = E[t]
                gt = torch.sigmoid((xd * et).sum(1) + m.ent_bias[t]) - 1.0
                g = None
                dxq = gt[:, None] * et
            grads = torch.autograd.grad(xq, [f, z2] + ([e, rr, z0, cv, z1] if deep else []), grad_outputs=dxq)
        df, dz2 = grads[:2]
        u, v, dz0, dcv, dz1 = grads[2:] if deep else (None,) * 5
        bsz = len(q)
        lefts: list[torch.Tensor] = []    # the rank-one terms (Aᵀα) ⊗ (Bᵀβ), summed by one batched product
        rights: list[torch.Tensor] = []
        mats: list[torch.Tensor] = []

        def outer(name: str, left: torch.Tensor, right: torch.Tensor) -> None:
            lefts.append(left @ self.factor(name, "L"))
            rights.append(right @ self.factor(name, "R"))

        def rows(name: str, idx: torch.Tensor, right: torch.Tensor) -> None:
            lefts.append(self.factor(name, "L")[idx])
            rights.append(right @ self.factor(name, "R"))

        def vector(name: str, vec: torch.Tensor) -> None:  # a [B, m] gradient of an [m] (or [m, 1]) parameter
            lefts.append(vec @ self.factor(name, "L"))
            rights.append(self.factor(name, "R").expand(bsz, -1))

        def matrix(name: str, mat: torch.Tensor) -> None:  # materialised [B, m, n] gradients (small parameters)
            mats.append(torch.einsum("bmn,mi,nj->bij", mat, self.factor(name, "L"),
                                     self.factor(name, "R")).reshape(bsz, -1))

        def output_role(name: str, right: torch.Tensor) -> None:  # ∇ = g ⊗ right over the entity rows
            if g is not None:
                outer(name, g, right)
            else:  # g = g_t 1_t
                lefts.append(self.factor(name, "L")[t] * gt[:, None])
                rights.append(right @ self.factor(name, "R"))

        ones = torch.ones(bsz, 1, dtype=self.dtype, device=self.device)
        for name in self.names:
            if name == OUTPUT_TABLE:
                output_role(name, xd)
            elif name == "ent.weight":
                output_role(name, xd)
                rows(name, h, u)
            elif name == "rel.weight":
                rows(name, r, v)
            elif name == "ent_bias":
                output_role(name, ones)
            elif name == "fc.weight":
                outer(name, df, a.detach())
            elif name == "fc.bias":
                vector(name, df)
            elif name == "bn2.weight":
                vector(name, dz2 * _xhat(f, m.bn2))
            elif name == "bn2.bias":
                vector(name, dz2)
            elif name == "bn0.weight":
                vector(name, (dz0 * _xhat(x0, m.bn0)).reshape(bsz, -1).sum(1, keepdim=True))
            elif name == "bn0.bias":
                vector(name, dz0.reshape(bsz, -1).sum(1, keepdim=True))
            elif name == "conv.weight":
                k = c.kernel_size                                                    # patches [B, L, k*k]
                patches = z0.detach()[:, 0].unfold(1, k, 1).unfold(2, k, 1).reshape(bsz, -1, k * k)
                matrix(name, torch.bmm(dcv.flatten(2), patches))
            elif name == "conv.bias":
                vector(name, dcv.sum((2, 3)))
            elif name == "bn1.weight":
                vector(name, (dz1 * _xhat(cv, m.bn1)).sum((2, 3)))
            elif name == "bn1.bias":
                vector(name, dz1.sum((2, 3)))
            else:  # resolve_layers only returns ConvE's parameters
                raise ValueError(f"unknown layer {name!r}")
        phi = torch.zeros(bsz, int(self.proj_dim), dtype=self.dtype, device=self.device)
        if lefts:  # Σ_j (L_j ⊗ R_j) = vec(Σ_j L_jᵀ R_j) per example
            phi += torch.bmm(torch.stack(lefts, 2), torch.stack(rights, 1)).reshape(bsz, -1)
        for mat in mats:
            phi += mat
        return phi



def _check_dims(name: str, triples: torch.Tensor) -> None:
    if triples.dim() != 2 or triples.shape[1] != 3:
        raise ValueError(f"{name} must be a LongTensor [n, 3], got shape {tuple(triples.shape)}")


@torch.no_grad()
def trak_scores(bundle: Any, checkpoints: Any, test: torch.Tensor, train: torch.Tensor, *,
                layers: str | Sequence[str] = "all", proj_dim: int = 256, damping: float = DEFAULT_DAMPING,
                seed: int = 0, device: torch.device | str | None = None, loss: str = "train",
                dtype: torch.dtype = torch.float32, batch_size: int = 256) -> torch.Tensor:
    """TRAK scores ``[m, n]`` of training triples ``train`` on test triples ``test``
    (:func:`models.explain.trak.projected_trak_scores` with :class:`GradientProjector`); higher = the training
    triple helps the test triple's prediction. CPU tensor in ``dtype``."""
    _check_dims("test", test)
    _check_dims("train", train)
    check_damping(damping)
    ckpts = resolve_checkpoints(bundle, checkpoints)
    proj = GradientProjector(bundle.model, layers, loss, proj_dim, seed, device, dtype, batch_size)
    return projected_trak_scores(proj, ckpts, test, train, damping)


@torch.no_grad()
def tracin_projected_scores(bundle: Any, checkpoints: Any, test: torch.Tensor, train: torch.Tensor, *,
                            weights: Sequence[float] | None = None, layers: str | Sequence[str] = "all",
                            proj_dim: int = 256, seed: int = 0, device: torch.device | str | None = None,
                            loss: str = "train", dtype: torch.dtype = torch.float32,
                            batch_size: int = 256) -> torch.Tensor:
    """Projected TracIn ``[m, n]``: Σ_c η_c φ_c(z_test)ᵀ φ_c(z_j), η_c the checkpoints' learning rates (or
    ``weights``). An approximation of exact TracIn (:class:`models.kg.tracin.ConvETracIn`): each gradient dot
    product is replaced by the dot product of the projected gradients, unbiased, with a relative error of about
    √(2/k₁ + 2/k₂) on a rank-one block for the Kronecker projection's factors k₁·k₂ = k
    (:mod:`models.explain.trak`, "Its variance")."""
    _check_dims("test", test)
    _check_dims("train", train)
    ckpts = resolve_checkpoints(bundle, checkpoints)
    etas = checkpoint_etas(ckpts, weights)
    proj = GradientProjector(bundle.model, layers, loss, proj_dim, seed, device, dtype, batch_size)
    return projected_tracin_scores(proj, ckpts, test, train, etas)


@torch.no_grad()
def self_scores(bundle: Any, checkpoints: Any, train: torch.Tensor, *, layers: str | Sequence[str] = "all",
                proj_dim: int = 256, damping: float = DEFAULT_DAMPING, seed: int = 0,
                device: torch.device | str | None = None, loss: str = "train", dtype: torch.dtype = torch.float32,
                batch_size: int = 256) -> torch.Tensor:
    """``[n]``: each training triple's TRAK score on itself, φ(z)ᵀ(ΦᵀΦ + λI)⁻¹φ(z) averaged over checkpoints
    (high: the model leans on this triple alone; mislabelled triples rank high)."""
    _check_dims("train", train)
    check_damping(damping)
    ckpts = resolve_checkpoints(bundle, checkpoints)
    proj = GradientProjector(bundle.model, layers, loss, proj_dim, seed, device, dtype, batch_size)
    return projected_self_scores(proj, ckpts, train, damping)


# ------------------------------------------------------------------------------------------- dense reference
def dense_gradients(model: ConvE, triples: torch.Tensor, names: Sequence[str], loss: str = "train") -> torch.Tensor:
    """Full per-triple gradients ``[n, P]`` in the model's dtype with ``torch.func`` (``functional_call`` +
    ``vmap(grad)``), columns in ``names`` order, each parameter flattened (the slow reference)."""
    c = model.config
    params = {n: p.detach() for n, p in model.named_parameters()}
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    sel = {n: params[n] for n in names if n != OUTPUT_TABLE}
    const = {n: p for n, p in params.items() if n not in sel}
    use_out = OUTPUT_TABLE in names

    def loss_fn(sel_p: dict[str, torch.Tensor], ow: torch.Tensor, trip: torch.Tensor) -> torch.Tensor:
        full = {**const, **sel_p, **buffers}
        total = torch.zeros((), dtype=ow.dtype)
        queries = triple_queries(trip[None], c.num_relations, c.reciprocal)
        for q in queries[:1] if loss == "margin" else queries:  # the margin is of the tail query alone
            logits = functional_call(model, full, (q[:, 0], q[:, 1]), {"out_weight": ow if use_out else None})
            total = total + _loss(logits, q[:, 2], c.label_smoothing, loss).sum()
        return total

    g = vmap(grad(loss_fn, argnums=(0, 1)), in_dims=(None, None, 0))(sel, params["ent.weight"], triples)
    return torch.cat([(g[1] if n == OUTPUT_TABLE else g[0][n]).reshape(len(triples), -1) for n in names], 1)


@torch.no_grad()
def reference_trak_scores(bundle: Any, checkpoints: Any, test: torch.Tensor, train: torch.Tensor, *,
                          layers: str | Sequence[str] = "all", proj_dim: int = 16,
                          damping: float = DEFAULT_DAMPING, seed: int = 0, loss: str = "train",
                          self_only: bool = False) -> torch.Tensor:
    """The dense float64 reference of :func:`trak_scores` (or of :func:`self_scores` with ``self_only``) for a
    tiny ConvE: full per-example gradients, the explicit projection matrix and the explicit inverse."""
    ckpts = resolve_checkpoints(bundle, checkpoints)
    model = copy.deepcopy(bundle.model).to(device="cpu", dtype=torch.float64).eval()
    names = resolve_layers(model, layers)
    P = projection_matrix(parameter_shapes(model, names), proj_dim, seed, torch.float64)
    total = None
    for ck in ckpts:
        model.load_state_dict(ck.state_dict("cpu"))
        model.to(torch.float64).eval()
        phi = dense_gradients(model, train, names, loss) @ P
        gram = phi.t() @ phi
        lam = damping * float(torch.trace(gram)) / proj_dim
        inv = torch.linalg.inv(gram + (lam if lam > 0 else damping) * torch.eye(proj_dim, dtype=torch.float64))
        if self_only:
            part = torch.einsum("ik,kl,il->i", phi, inv, phi)
        else:
            part = (dense_gradients(model, test, names, loss) @ P) @ inv @ phi.t()
        total = part if total is None else total + part
    return total / len(ckpts)


def triple_loss_fn(config: ConvEConfig, loss: str = "train") -> LossFn:
    """ConvE's per-triple loss as a :data:`models.explain.gradients.LossFn` for the generic gradient models
    (:class:`models.explain.tracin.FuncGradients`, :class:`models.explain.trak.FuncProjector`): ``example`` is one
    triple ``[3]``, the loss summed over its queries (the tail query alone for ``margin``), in the model's dtype."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")

    def fn(forward: Any, trip: torch.Tensor) -> torch.Tensor:
        total = None
        queries = triple_queries(trip[None], config.num_relations, config.reciprocal)
        for q in queries[:1] if loss == "margin" else queries:
            part = _loss(forward(q[:, 0], q[:, 1]), q[:, 2], config.label_smoothing, loss).sum()
            total = part if total is None else total + part
        return total

    return fn
