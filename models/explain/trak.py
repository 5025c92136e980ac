r"""TRAK-style data attribution, model-agnostic: projected per-example gradients, a Gauss–Newton inverse in the
projected space, averaged over checkpoints (Park et al. 2023, "TRAK: Attributing Model Behavior at Scale"; the
Kronecker-structured projection is LoGra's, Choe et al. 2024, "What is Your Data Worth to GPT?").

What is computed, exactly. For checkpoint c (weights w_c, the model in eval mode), every example z has a feature

.. math::

    \phi_c(z) = P^\top \nabla_w \ell(w_c, z) \in \mathbb{R}^k

where ``ℓ`` is a model family's per-example loss or output function, the gradient is restricted to the parameters
the family names, and ``P`` is the seeded random projection below. With Φ_c the ``[n, k]`` features of the
training examples ``train`` and ``λ_c = damping · tr(Φ_cᵀΦ_c) / k`` (damping relative to the mean eigenvalue of
the Gauss–Newton matrix, so it does not depend on the loss scale),

.. math::

    \mathrm{score}(z_{test}, z_j) = \frac{1}{C} \sum_c \phi_c(z_{test})^\top (\Phi_c^\top \Phi_c + \lambda_c I)^{-1}
                                     \phi_c(z_j)

(:func:`projected_trak_scores`). :func:`projected_self_scores` is the same with z_test = z_j (each training
example's leverage, the TRAK form of self-influence for mislabel detection). Higher means the training example
helps: a step along ``(ΦᵀΦ + λI)⁻¹ ∇ℓ(z_j)`` lowers ℓ(z_test) to first order. :func:`projected_tracin_scores` is
TracIn with projected gradients, Σ_c η_c φ_c(z_test)ᵀ φ_c(z_j): each gradient dot product replaced by an unbiased
estimate, whose relative error depends on the projection (below: √(2/k) for the dense one, about √(2/k₁ + 2/k₂)
for the Kronecker one on a rank-one gradient block).

The model enters through a :class:`Projector` (load a checkpoint, ``features(examples) -> [n, k]``): the role of
TRAK's ``AbstractModelOutput`` with its projector. :class:`FuncProjector` is the generic one: it materialises
per-example gradients of any ``nn.Module`` with ``torch.func`` (:mod:`models.explain.gradients`) and multiplies
them block by block with the factors below, so a new model family gets TRAK by stating its loss. A family with
factored gradients projects them without building them (ConvE: :mod:`models.kg.trak`), with the same factors, so
the two projectors give the same features (tested).

The projection. Every parameter is viewed as a matrix ``[m, n]`` (:func:`matrix_view`: a vector is ``[m, 1]``, a
tensor ``[d₀, d₁·d₂·…]``, a convolution's weight ``[F, c·k_h·k_w]``), and its block of ``P`` is the Kronecker
product ``A ⊗ B / √k`` with ``A ∈ R^{m×k₁}``, ``B ∈ R^{n×k₂}``, ``k₁·k₂ = k`` (``k₁`` the largest divisor of ``k``
not above √k, :func:`split_dim`), entries i.i.d. N(0, 1). The blocks of different parameters are independent and
their projections add up, so ``P`` is one ``[P_total, k]`` matrix with E[P Pᵀ] = I: inner products of projected
gradients are unbiased estimates of the exact ones. For a materialised gradient block ``G`` (``[m, n]``) the
block's projection is ``vec(Aᵀ G B)``; for an outer product, ``(A ⊗ B)ᵀ vec(α βᵀ) = (Aᵀα) ⊗ (Bᵀβ)``. The factors
themselves are generated in chunks of ``PROJ_CHUNK`` rows, each from its own generator seeded by (seed, parameter
name, side, chunk), always in the same chunks (:func:`projection_factor`), so the projection depends on the seed
and the parameter names only (not on the device, the batch or the projector), and no matrix larger than the
parameter's own row count times k₁ (or k₂) exists. :func:`projection_matrix` builds the explicit ``P`` for a tiny
model from the parameters' shapes (dense references).

Its variance. Both projections are unbiased (E[P Pᵀ] = I), but not equally noisy. For a dense Gaussian ``P``
(entries N(0, 1/k)) and a gradient g, ‖Pᵀg‖²/‖g‖² is χ²_k/k: relative standard deviation √(2/k); a dot product of
two gradients at cosine c has relative variance (1 + 1/c²)/k. For the Kronecker block and a rank-one gradient
block ``G = α βᵀ`` (ConvE's ``fc.weight`` gradient, one example), ``φ = (Aᵀα) ⊗ (Bᵀβ) / √k`` and
‖φ‖²/‖G‖² = (χ²_{k₁}/k₁)(χ²_{k₂}/k₂), a product of two independent factors: relative variance
(1 + 2/k₁)(1 + 2/k₂) − 1 = 2/k₁ + 2/k₂ + 4/k, so a relative standard deviation of about √(2/k₁ + 2/k₂), not
√(2/k) (at k = 4096, k₁ = k₂ = 64: 0.25 against a dense projection's 0.022). For a dot product of two rank-one
blocks with cosines c_α (left) and c_β (right) each factor has relative variance (1 + 1/c²)/k₁ (or /k₂) and the
product (1 + v₁)(1 + v₂) − 1. Both formulas are measured by Monte Carlo over projection seeds in the tests.

``projection="dense"`` (:class:`FuncProjector` and :func:`projection_matrix`) uses a dense Gaussian block per
parameter instead (:func:`dense_block`, ``[m·n, k]`` drawn in the same seeded chunks), for models whose
``P_total × k`` is at most ``MAX_DENSE_PROJ_NUMBERS`` (:func:`check_projection`); ``projector.projection`` says
which one made a projector's features.

Inverse: ``ΦᵀΦ`` is accumulated in float64 (:func:`gram_of`) and ``ΦᵀΦ + λI`` (``k × k``) factorised by Cholesky
per checkpoint (:func:`damped_cholesky`), then solved against the test features (float64; the product with the
training features in the projector's ``dtype``; :func:`trak_query`).
"""

from __future__ import annotations

import copy
import hashlib
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from models.explain.gradients import LossFn, module_device, per_example_gradients, resolve_parameters
from models.explain.tracin import CheckpointLike

PROJ_CHUNK = 4096      # rows of a projection factor generated from one seeded generator
PROJECTIONS = ("kronecker", "dense")
MAX_DENSE_PROJ_NUMBERS = 1 << 26  # P_total x k of a dense projection (256 MiB in float32), built once per projector
MAX_PROJ_DIM = 8192    # the k × k Gauss–Newton matrix is inverted per checkpoint
DEFAULT_DAMPING = 0.01


def split_dim(k: int) -> tuple[int, int]:
    """``(k₁, k₂)`` with ``k₁ · k₂ = k`` and k₁ the largest divisor of ``k`` that is at most √k."""
    if k < 1:
        raise ValueError("proj_dim must be >= 1")
    k1 = max(d for d in range(1, math.isqrt(k) + 1) if k % d == 0)
    return k1, k // k1


def _seed_of(seed: int, name: str, side: str, chunk: int) -> int:
    digest = hashlib.sha256(f"{int(seed)}|{name}|{side}|{chunk}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def checkpoint_seed(seed: int, checkpoint: int, model: int = 0) -> int:
    """The projection seed of checkpoint number ``checkpoint`` (its position in its model's checkpoints) of model
    number ``model`` (0: the model queried; 1, 2, ...: an ensemble's further members), derived from a request's
    ``seed``: the first 63 bits of SHA-256 of ``"trak|<seed>|model <model>|checkpoint <checkpoint>"``. TRAK draws an
    independent projection per checkpoint (Park et al. 2023, Algorithm 1), so the sketch errors of the checkpoints
    average out instead of adding up."""
    digest = hashlib.sha256(f"trak|{int(seed)}|model {int(model)}|checkpoint {int(checkpoint)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def projection_factor(seed: int, name: str, side: str, rows: int, cols: int,
                      dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """The ``[rows, cols]`` N(0, 1) factor ``side`` ("L" or "R") of parameter ``name``'s projection block, built
    chunk by chunk (``PROJ_CHUNK`` rows per seeded generator; drawn in float64 on the CPU, then cast)."""
    parts = []
    for c, r0 in enumerate(range(0, rows, PROJ_CHUNK)):
        gen = torch.Generator().manual_seed(_seed_of(seed, name, side, c))
        parts.append(torch.randn(min(PROJ_CHUNK, rows - r0), cols, generator=gen, dtype=torch.float64))
    return torch.cat(parts).to(device=device, dtype=dtype)


def dense_block(seed: int, name: str, rows: int, k: int, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu") -> torch.Tensor:
    """The ``[rows, k]`` N(0, 1) block of parameter ``name`` (``rows`` = its size) in a dense projection, built
    chunk by chunk as :func:`projection_factor` (side "D")."""
    return projection_factor(seed, name, "D", rows, k, dtype, device)


def check_projection(projection: str, total: int, proj_dim: int) -> None:
    """``ValueError`` naming ``projection`` for an unknown one, or a dense one of more than
    ``MAX_DENSE_PROJ_NUMBERS`` numbers (``total`` projected parameters times ``proj_dim``)."""
    if projection not in PROJECTIONS:
        raise ValueError(f"projection must be one of {PROJECTIONS}, got {projection!r}")
    if projection == "dense" and int(total) * int(proj_dim) > MAX_DENSE_PROJ_NUMBERS:
        raise ValueError(f"projection 'dense' needs {int(total)} x {int(proj_dim)} numbers, more than "
                         f"{MAX_DENSE_PROJ_NUMBERS}; use projection 'kronecker' or fewer parameters or a smaller "
                         "proj_dim")


def matrix_view(shape: Sequence[int]) -> tuple[int, int]:
    """The matrix view ``[m, n]`` of a parameter of shape ``shape``: ``[m, 1]`` for a vector, ``[1, 1]`` for a
    scalar, ``[d₀, d₁·d₂·…]`` otherwise (row-major, as a flattened gradient lays it out)."""
    shape = tuple(int(s) for s in shape)
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], 1
    return shape[0], math.prod(shape[1:])


def projection_matrix(shapes: Mapping[str, Sequence[int]], proj_dim: int, seed: int,
                      dtype: torch.dtype = torch.float64, projection: str = "kronecker") -> torch.Tensor:
    """The explicit ``[P_total, k]`` projection of the parameters ``shapes`` (name -> shape, or its matrix view;
    rows in the mapping's order, each parameter flattened row-major, as per-example gradients are laid out), the
    Kronecker one or the dense one (``projection``). For tiny models: the dense references."""
    check_projection(projection, sum(math.prod(matrix_view(s)) for s in shapes.values()), proj_dim)
    k1, k2 = split_dim(proj_dim)
    blocks = []
    for name, shape in shapes.items():
        m, n = matrix_view(shape)
        if projection == "dense":
            blocks.append(dense_block(seed, name, m * n, proj_dim, dtype))
            continue
        a = projection_factor(seed, name, "L", m, k1, dtype)
        b = projection_factor(seed, name, "R", n, k2, dtype)
        blocks.append(torch.kron(a, b))
    return torch.cat(blocks) / math.sqrt(proj_dim)


def check_proj_dim(proj_dim: int) -> None:
    if not 1 <= int(proj_dim) <= MAX_PROJ_DIM:
        raise ValueError(f"proj_dim must be between 1 and {MAX_PROJ_DIM}, got {proj_dim}")


def check_damping(damping: float) -> None:
    if not (math.isfinite(damping) and damping > 0):
        raise ValueError(f"damping must be a finite number > 0, got {damping}")


# ------------------------------------------------------------------------------------------ the interface
class Projector(ABC):
    """Projected per-example gradients ``φ(z) = Pᵀ∇ℓ(z)`` of one model at the weights last :meth:`load`-ed: a model
    family's side of TRAK and projected TracIn (the role of TRAK's ``AbstractModelOutput`` with its projector).

    ``names``: the parameters differentiated, in order (the projection's blocks, keyed by these names);
    ``proj_dim``: k; ``device`` and ``dtype``: where and in what :meth:`features` returns; ``projection``: which
    random projection ("kronecker" or "dense").
    """

    names: tuple[str, ...]
    proj_dim: int
    projection: str = "kronecker"
    device: torch.device
    dtype: torch.dtype

    @abstractmethod
    def load(self, ckpt: CheckpointLike) -> None:
        """Make checkpoint ``ckpt``'s weights current."""

    @abstractmethod
    def features(self, examples: torch.Tensor) -> torch.Tensor:
        """``[n, k]`` projected gradients of ``examples`` (one example per row), in ``dtype``, on ``device``."""


class KroneckerProjector(Projector):
    """A :class:`Projector` with this module's seeded Kronecker blocks: a frozen working copy of the model whose
    weights :meth:`load` replaces, and each parameter's factors (:func:`projection_factor`, ``[m, k₁]`` and
    ``[n, k₂]`` for its matrix view ``[m, n]``) built on first use. A subclass sets ``proj_dim``, ``seed``,
    ``device`` and ``dtype``, calls :meth:`prepare`, and projects its gradients with :meth:`factor`."""

    seed: int

    def prepare(self, model: nn.Module, shapes: dict[str, tuple[int, int]]) -> None:
        """The working copy of ``model`` (in ``dtype``, on ``device``, no gradients kept) and the matrix views
        ``shapes`` of the projected parameters."""
        self.k1, self.k2 = split_dim(int(self.proj_dim))
        self._work = copy.deepcopy(model).to(device=self.device, dtype=self.dtype).eval()
        for p in self._work.parameters():
            p.requires_grad_(False)
        self._shapes = dict(shapes)
        self._factors: dict[tuple[str, str], torch.Tensor] = {}

    def load(self, ckpt: CheckpointLike) -> None:
        """Make checkpoint ``ckpt``'s weights current."""
        self._work.load_state_dict(ckpt.state_dict("cpu"))
        self._work.to(device=self.device, dtype=self.dtype).eval()

    def reseed(self, seed: int) -> None:
        """Project with the factors of ``seed`` from now on (those of the former seed are dropped)."""
        if int(seed) != int(self.seed):
            self.seed = int(seed)
            self._factors = {}

    def factor(self, name: str, side: str) -> torch.Tensor:
        """The ``"L"`` (``[m, k₁]``) or ``"R"`` (``[n, k₂]``) factor of parameter ``name``'s block."""
        key = (name, side)
        if key not in self._factors:
            m, n = self._shapes[name]
            self._factors[key] = projection_factor(self.seed, name, side, m if side == "L" else n,
                                                   self.k1 if side == "L" else self.k2, self.dtype, self.device)
        return self._factors[key]


class FuncProjector(KroneckerProjector):
    """The generic :class:`Projector` of any ``nn.Module``: per-example gradients of ``loss`` (a
    :data:`models.explain.gradients.LossFn`) materialised by ``torch.func``, each parameter's block ``G`` projected
    as ``vec(Aᵀ G B)`` with the seeded factors of :func:`projection_factor`, summed and divided by √k: exactly
    ``∇ℓ @ projection_matrix(...)`` without building ``P``. Each batch holds ``[batch, P]`` gradient numbers.

    ``layers``: ``"all"``, parameter names or module names (:func:`models.explain.gradients.resolve_parameters`).
    The model's copy computes in ``dtype``, and floating-point examples are cast to it. ``projection="dense"``:
    each block is a dense Gaussian ``[m·n, k]`` (:func:`dense_block`) instead, ``∇ℓ @ projection_matrix(...,
    projection="dense")`` (within :func:`check_projection`'s bound).
    """

    def __init__(self, model: nn.Module, loss: LossFn, layers: str | Sequence[str] = "all", proj_dim: int = 256,
                 seed: int = 0, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
                 batch_size: int = 256, projection: str = "kronecker") -> None:
        check_proj_dim(proj_dim)
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.loss, self.proj_dim, self.seed, self.dtype, self.batch_size = loss, int(proj_dim), seed, dtype, batch_size
        self.device = torch.device(device) if device is not None else module_device(model)
        self.names = resolve_parameters(model, layers)
        shapes = {n: matrix_view(model.get_parameter(n).shape) for n in self.names}
        check_projection(projection, sum(m * n for m, n in shapes.values()), self.proj_dim)
        self.projection = projection
        self.prepare(model, shapes)

    def dense(self, name: str) -> torch.Tensor:
        """Parameter ``name``'s ``[m·n, k]`` dense block (``projection="dense"``), built on first use."""
        key = (name, "D")
        if key not in self._factors:
            m, n = self._shapes[name]
            self._factors[key] = dense_block(self.seed, name, m * n, self.proj_dim, self.dtype, self.device)
        return self._factors[key]

    @torch.no_grad()
    def features(self, examples: torch.Tensor) -> torch.Tensor:
        out = torch.empty(len(examples), self.proj_dim, dtype=self.dtype, device=self.device)
        for i in range(0, len(examples), self.batch_size):
            b = examples[i:i + self.batch_size].to(self.device)
            if b.is_floating_point():
                b = b.to(self.dtype)
            with torch.enable_grad():
                g = per_example_gradients(self._work, self.names, self.loss, b)
            phi = torch.zeros(len(b), self.proj_dim, dtype=self.dtype, device=self.device)
            col = 0
            for name in self.names:
                m, n = self._shapes[name]
                block = g[:, col:col + m * n].reshape(len(b), m, n)
                col += m * n
                if self.projection == "dense":
                    phi += block.reshape(len(b), m * n) @ self.dense(name)
                    continue
                phi += torch.einsum("bmn,mi,nj->bij", block, self.factor(name, "L"),
                                    self.factor(name, "R")).reshape(len(b), -1)
            out[i:i + len(b)] = phi / math.sqrt(self.proj_dim)
        return out


# ------------------------------------------------------------------------------------------ the inverse
def damping_of(gram: torch.Tensor, damping: float) -> float:
    """λ = ``damping`` · tr(ΦᵀΦ)/k (``damping`` itself when the trace is 0)."""
    lam = float(damping) * float(torch.diagonal(gram).sum()) / gram.shape[0]
    return lam if lam > 0 else float(damping)


def damped_cholesky(gram: torch.Tensor, damping: float) -> torch.Tensor:
    """The Cholesky factor of ``gram + λI``."""
    lam = damping_of(gram, damping)
    return torch.linalg.cholesky(gram + lam * torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device))


def damped_inverse_apply(gram: torch.Tensor, damping: float, rhs: torch.Tensor,
                         chol: torch.Tensor | None = None) -> torch.Tensor:
    """``(gram + λI)⁻¹ rhs`` by a Cholesky factorisation (``rhs`` ``[k, m]``; ``chol``: the factor, if known)."""
    return torch.cholesky_solve(rhs, damped_cholesky(gram, damping) if chol is None else chol)


def gram_of(phi: torch.Tensor) -> torch.Tensor:
    """ΦᵀΦ accumulated in float64 (``[k, k]``)."""
    p = phi.double()
    return p.t() @ p


def trak_query(gram: torch.Tensor, damping: float, phi_test: torch.Tensor,
               chol: torch.Tensor | None = None) -> torch.Tensor:
    """``φ_test (gram + λI)⁻¹`` ``[m, k]``, solved in float64 and returned in ``phi_test``'s dtype: the test side of
    a TRAK score, to be multiplied with the training features (``chol``: ``damped_cholesky(gram, damping)``)."""
    solved = damped_inverse_apply(gram.double(), damping, phi_test.double().t().to(gram.device), chol)
    return solved.t().to(dtype=phi_test.dtype, device=phi_test.device)


# ------------------------------------------------------------------------------------------ scores
def resolve_checkpoints(bundle: Any, checkpoints: Any) -> list[CheckpointLike]:
    """``"all"`` (or None): the bundle's checkpoints (``bundle.checkpoints``); else a list of names (looked up with
    ``bundle.checkpoint(name)``) or checkpoint objects."""
    if checkpoints is None or checkpoints == "all":
        out = list(bundle.checkpoints)
    else:
        out = [bundle.checkpoint(str(c)) if isinstance(c, str | int) else c for c in checkpoints]
    if not out:
        raise ValueError("no checkpoints")
    return out


def checkpoint_etas(checkpoints: Sequence[CheckpointLike], weights: Sequence[float] | None) -> list[float]:
    """Projected TracIn's η per checkpoint: ``weights``, or each checkpoint's learning rate."""
    etas = [float(c.lr) for c in checkpoints] if weights is None else [float(w) for w in weights]
    if len(etas) != len(checkpoints):
        raise ValueError(f"{len(etas)} weights for {len(checkpoints)} checkpoints")
    return etas


@torch.no_grad()
def projected_trak_scores(projector: Projector, checkpoints: Sequence[CheckpointLike], test: torch.Tensor,
                          train: torch.Tensor, damping: float = DEFAULT_DAMPING) -> torch.Tensor:
    """TRAK scores ``[m, n]`` of the training examples ``train`` on the test examples ``test`` (module docstring),
    averaged over ``checkpoints``; higher = the training example helps. CPU tensor in the projector's dtype."""
    check_damping(damping)
    out = torch.zeros(len(test), len(train), dtype=projector.dtype, device=projector.device)
    for ck in checkpoints:
        projector.load(ck)
        phi = projector.features(train)
        query = trak_query(gram_of(phi), damping, projector.features(test))           # [m, k]
        out += query @ phi.t()
    return (out / len(checkpoints)).cpu()


@torch.no_grad()
def projected_tracin_scores(projector: Projector, checkpoints: Sequence[CheckpointLike], test: torch.Tensor,
                            train: torch.Tensor, weights: Sequence[float] | None = None) -> torch.Tensor:
    """Projected TracIn ``[m, n]``: Σ_c η_c φ_c(z_test)ᵀ φ_c(z_j), η_c the checkpoints' learning rates (or
    ``weights``). CPU tensor in the projector's dtype."""
    etas = checkpoint_etas(checkpoints, weights)
    out = torch.zeros(len(test), len(train), dtype=projector.dtype, device=projector.device)
    for ck, eta in zip(checkpoints, etas, strict=True):
        projector.load(ck)
        out += eta * projector.features(test) @ projector.features(train).t()
    return out.cpu()


@torch.no_grad()
def projected_self_scores(projector: Projector, checkpoints: Sequence[CheckpointLike], train: torch.Tensor,
                          damping: float = DEFAULT_DAMPING) -> torch.Tensor:
    """``[n]``: each training example's TRAK score on itself, φ(z)ᵀ(ΦᵀΦ + λI)⁻¹φ(z) averaged over checkpoints
    (high: the model leans on this example alone; mislabelled examples rank high)."""
    check_damping(damping)
    out = torch.zeros(len(train), dtype=projector.dtype, device=projector.device)
    for ck in checkpoints:
        projector.load(ck)
        phi = projector.features(train)
        out += (trak_query(gram_of(phi), damping, phi) * phi).sum(1)
    return (out / len(checkpoints)).cpu()
