r"""Batched Integrated Gradients (Sundararajan et al. 2017) with exact quadrature weights.

For a scalar function :math:`F` of an input :math:`x \in \mathbb{R}^{L \times D}` and a baseline :math:`x'`,

.. math::

    \mathrm{IG}_i(x) = (x_i - x'_i) \int_0^1 \frac{\partial F(x' + \alpha (x - x'))}{\partial x_i}\, d\alpha
    \approx (x_i - x'_i) \sum_{k=1}^{n} w_k\, \frac{\partial F(x' + \alpha_k (x - x'))}{\partial x_i}

and completeness :math:`\sum_i \mathrm{IG}_i = F(x) - F(x')` holds for the exact integral. The quadrature rules
(:func:`quadrature`) all have weights that sum to exactly 1, so a constant gradient is integrated exactly:

- ``gausslegendre``: Gauss-Legendre nodes and weights mapped from [-1, 1] to [0, 1] (exact for polynomials of
  degree 2n - 1; converges spectrally on smooth models);
- ``riemann_right`` / ``riemann_left`` / ``riemann_middle``: :math:`\alpha_k = k/n,\ (k-1)/n,\ (k-1/2)/n`,
  :math:`w_k = 1/n`;
- ``riemann_trapezoid``: :math:`\alpha_k = k/(n-1),\ k = 0..n-1`, weights :math:`1/(n-1)` with half weight at both
  ends (sum 1; Captum's version sums to (n-1)/n, a bias of 1/n that this module does not copy).
- ``clenshaw_curtis``: :math:`\alpha_k = (1 - \cos(k\pi/(n-1)))/2,\ k = 0..n-1` with the Clenshaw-Curtis weights
  (all positive, exact for polynomials of degree n - 1; about as accurate as Gauss-Legendre per node on smooth
  models, and nested: its n nodes are every other one of its 2n - 1).

Adaptive steps (:func:`integrated_gradients_adaptive`): with a completeness tolerance, each sample is integrated
at 16 steps first and refined (doubled; tripled for the midpoint rule) only while its own relative delta exceeds
the tolerance, so converged samples stop costing. Clenshaw-Curtis (16, 31, 61, ... nodes) and the Riemann rules
are nested under refinement (right/left and trapezoid under doubling, midpoint under tripling): their earlier
nodes are reused and only the new nodes are evaluated, so reaching n steps costs n evaluations. Gauss-Legendre
nodes are not nested; its levels are recomputed (16 + 32 + ... + n).

The optimized path evaluates every (sample, alpha) pair of a chunk in one batched forward, takes gradients only with
respect to the interpolated inputs (``torch.autograd.grad``; parameters should be frozen), and accumulates the
weighted gradients in fp32 whatever the forward precision. The reference path (:func:`integrated_gradients_reference`)
is the plain loop: one sample, one step, one ``backward``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from models.common import autocast
from models.explain.rules import MAX_STEPS, METHODS, NEEDS_TWO

ForwardFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``forward(x, rows)``: ``x`` is ``(M, L, D)`` interpolated inputs, ``rows`` ``(M,)`` the index of the sample
each row belongs to (so the function can pick that sample's context); returns the ``(M,)`` scores."""


@functools.lru_cache(maxsize=64)
def _gauss_legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights on [-1, 1]. scipy's ``roots_legendre`` is O(n^2) (numpy's ``leggauss`` solves a dense
    eigenproblem, about a minute at n = 4096)."""
    from scipy.special import roots_legendre

    nodes, weights = roots_legendre(n)
    nodes.setflags(write=False)
    weights.setflags(write=False)
    return nodes, weights


@functools.lru_cache(maxsize=64)
def _clenshaw_curtis(n_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Clenshaw-Curtis nodes cos(k pi / N), k = 0..N (N = n_points - 1), ascending, and weights on [-1, 1]
    (the explicit cosine-sum formula, e.g. Trefethen, *Spectral Methods in MATLAB*, ``clencurt``; O(n^2),
    under a second at 4096 points)."""
    n = n_points - 1
    theta = np.pi * np.arange(n + 1) / n
    weights = np.ones(n + 1)
    if n >= 2:
        j = np.arange(1, n // 2 + 1)
        b = np.where(2 * j == n, 1.0, 2.0) / (4.0 * j * j - 1.0)
        weights = weights - (b[None, :] * np.cos(2.0 * np.outer(theta, j))).sum(1)
    c = np.full(n + 1, 2.0)
    c[0] = c[-1] = 1.0
    weights = c * weights / n
    nodes = -np.cos(theta)  # ascending from -1 to 1; the weights are symmetric
    nodes[0], nodes[-1] = -1.0, 1.0
    if n % 2 == 0:
        nodes[n // 2] = 0.0
    nodes.setflags(write=False)
    weights.setflags(write=False)
    return nodes, weights


def quadrature(method: str, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``alphas`` in [0, 1] and weights (float64) of the rule; the weights sum to 1."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if not 1 <= n_steps <= MAX_STEPS:
        raise ValueError(f"n_steps must be in [1, {MAX_STEPS}], got {n_steps}")
    if method in NEEDS_TWO and n_steps < 2:
        raise ValueError(f"{method} needs n_steps >= 2")
    n = n_steps
    if method == "gausslegendre":
        nodes, weights = _gauss_legendre(n)
        return (nodes + 1.0) / 2.0, weights / 2.0
    if method == "clenshaw_curtis":
        nodes, weights = _clenshaw_curtis(n)
        return (nodes + 1.0) / 2.0, weights / 2.0
    if method == "riemann_right":
        return np.arange(1, n + 1) / n, np.full(n, 1.0 / n)
    if method == "riemann_left":
        return np.arange(0, n) / n, np.full(n, 1.0 / n)
    if method == "riemann_middle":
        return (np.arange(n) + 0.5) / n, np.full(n, 1.0 / n)
    w = np.full(n, 1.0 / (n - 1))
    w[0] = w[-1] = 0.5 / (n - 1)
    return np.arange(n) / (n - 1), w


@dataclass
class IGResult:
    """Attributions ``(N, L, D)`` (fp32) and the completeness terms per sample (fp64 on CPU)."""

    attributions: torch.Tensor
    scores: torch.Tensor
    baseline_scores: torch.Tensor
    n_steps: int
    method: str

    @property
    def attribution_sums(self) -> torch.Tensor:
        return self.attributions.double().flatten(1).sum(1).cpu()

    @property
    def deltas(self) -> torch.Tensor:
        """Σ attributions − (F(x) − F(x'))."""
        return self.attribution_sums - (self.scores - self.baseline_scores)

    @property
    def relative_deltas(self) -> torch.Tensor:
        """|delta| / |F(x) − F(x')| (the denominator floored at 1e-12; 0 for an inert sample)."""
        return relative_delta(self.attribution_sums, self.scores, self.baseline_scores, inert(self.attributions))


COMPLETENESS_FLOOR = 1e-12


def relative_delta(sums: Any, scores: Any, baseline_scores: Any, inert: Any = None) -> torch.Tensor:
    """The relative completeness error |Σ attributions − (F(x) − F(x'))| / |F(x) − F(x')|, element-wise, in fp64,
    the denominator floored at :data:`COMPLETENESS_FLOOR`; never negative. Tensors or numbers (a 0-d tensor back).

    ``inert`` marks the samples whose attributions are all exactly zero (:func:`inert`): their input equals their
    baseline (an empty text, say), so F(x) = F(x') and completeness holds exactly; the difference the two passes
    compute is rounding alone, and dividing by it would give 0 or 1 by chance. Their error is 0.

    The one definition used by the engine, the adaptive refinement, the reference loop and the reports."""
    sums, scores, baseline_scores = (torch.as_tensor(t, dtype=torch.float64) for t in (sums, scores, baseline_scores))
    diff = scores - baseline_scores
    rel = (sums - diff).abs() / diff.abs().clamp_min(COMPLETENESS_FLOOR)
    return rel if inert is None else torch.where(torch.as_tensor(inert, dtype=torch.bool), 0.0, rel)


def inert(attributions: torch.Tensor) -> torch.Tensor:
    """Per sample (the first dimension), whether every attribution is exactly zero: nothing lies between its input
    and its baseline."""
    return (attributions.flatten(1) == 0).all(1).cpu()


def _rows(n_samples: int, n_alphas: int, device: torch.device) -> torch.Tensor:
    return torch.arange(n_samples, device=device).repeat(n_alphas)


@torch.no_grad()
def evaluate_fp32(forward: ForwardFn, x: torch.Tensor) -> torch.Tensor:
    """F at ``x`` ``(N, L, D)`` in fp32, no autocast, no graph."""
    return forward(x.float(), _rows(x.shape[0], 1, x.device)).double().cpu()


@torch.no_grad()
def evaluate_endpoints(forward: ForwardFn, inputs: torch.Tensor, baselines: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(F(x), F(x')) in fp32 from ONE forward over both (a small request pays one launch sequence, not two)."""
    n = inputs.shape[0]
    rows = _rows(n, 2, inputs.device)
    out = forward(torch.cat([inputs.float(), baselines.float()]), rows).double().cpu()
    return out[:n], out[n:]


def _pass_bytes(forward: ForwardFn, x0: torch.Tensor, rows: int, precision: str) -> float:
    """Bytes used by one forward + input-gradient pass over ``rows`` copies of ``x0`` ``(1, L, D)``."""
    x = x0.expand(rows, *x0.shape[1:]).clone().requires_grad_(True)
    index = torch.zeros(rows, dtype=torch.long, device=x.device)
    device = x.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        with autocast(device, precision):
            out = forward(x, index)
        (grad,) = torch.autograd.grad(out.float().sum(), x)
        peak = torch.cuda.max_memory_allocated(device) - base
        del out, grad
        return float(peak)
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast(device, precision):
        out = forward(x, index)
    (grad,) = torch.autograd.grad(out.float().sum(), x)
    return float(saved + 2 * x.numel() * x.element_size() + out.numel() * 8)


def probe_bytes_per_row(forward: ForwardFn, inputs: torch.Tensor, baselines: torch.Tensor, precision: str,
                        probe_rows: int = 4) -> float:
    """Memory one interpolated row costs in a forward + input-gradient pass, for the longest sample given.

    Measured as the difference between passes over 1 and ``1 + probe_rows`` rows, so that constant costs (the
    weights autograd saves, workspaces) cancel. On CUDA the pass cost is the measured peak allocation; on CPU the
    bytes of the tensors autograd saves for backward (``saved_tensors_hooks``) plus the input, its gradient and
    the output."""
    x0 = (baselines[:1] + 0.5 * (inputs[:1] - baselines[:1])).detach()
    one = _pass_bytes(forward, x0, 1, precision)
    many = _pass_bytes(forward, x0, 1 + probe_rows, precision)
    return max((many - one) / probe_rows, 1.0)


def default_memory_budget(device: torch.device) -> int:
    """Bytes that one batched IG pass may use: half the free GPU memory, or 1 GiB on CPU."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * 0.5)
    return 1 << 30


def rows_for_budget(per_row: float, device: torch.device, memory_budget: int | None = None,
                    max_rows: int = 4096) -> int:
    """How many interpolated rows of ``per_row`` bytes one batched pass may hold (25% headroom)."""
    budget = memory_budget if memory_budget is not None else default_memory_budget(device)
    return int(max(1, min(max_rows, budget // (per_row * 1.25))))


def auto_rows(forward: ForwardFn, inputs: torch.Tensor, baselines: torch.Tensor, precision: str,
              memory_budget: int | None = None, max_rows: int = 4096) -> int:
    """The largest number of interpolated rows per batched pass that fits in the memory budget."""
    per_row = probe_bytes_per_row(forward, inputs, baselines, precision)
    return rows_for_budget(per_row, inputs.device, memory_budget, max_rows)


def integrated_gradients(
    forward: ForwardFn,
    inputs: torch.Tensor,
    baselines: torch.Tensor,
    *,
    n_steps: int = 64,
    method: str = "gausslegendre",
    alpha_batch_size: int | None = None,
    precision: str = "fp32",
    endpoint_scores: tuple[torch.Tensor, torch.Tensor] | None = None,
    baseline_scores: torch.Tensor | None = None,
    fold_endpoints: bool = True,
) -> IGResult:
    """Optimized IG for ``N`` samples at once.

    ``inputs`` and ``baselines`` are ``(N, L, D)`` on the model's device; ``alpha_batch_size`` alphas are evaluated
    per pass for all ``N`` samples (``None`` = all). ``precision`` is a resolved precision (``fp32|fp16|bf16``) for
    the interpolated forwards; the endpoint scores F(x), F(x') are always fp32.

    Endpoints, cheapest first: ``endpoint_scores`` passes precomputed (F(x), F(x')) (e.g. across a tolerance loop)
    and ``baseline_scores`` F(x') alone (e.g. cached per model). When the rule contains an endpoint (alpha = 0 or
    1) and the forward runs in fp32, that evaluation is reused. Otherwise, in fp32 with ``fold_endpoints``, the
    missing endpoint rows ride along in the first gradient pass (their outputs are read, their gradients unused)
    when that adds at most a quarter to the pass's rows, so a small request pays one pass, not a pass and a
    forward; failing that they take one separate forward (:func:`evaluate_endpoints`)."""
    alphas_np, weights_np = quadrature(method, n_steps)
    n = inputs.shape[0]
    inputs = inputs.detach().float()
    baselines = baselines.detach().float()
    diff = inputs - baselines
    chunk = n_steps if alpha_batch_size is None else max(1, min(int(alpha_batch_size), n_steps))
    reuse: dict[float, torch.Tensor] = {}

    if endpoint_scores is not None:
        baseline_scores = endpoint_scores[1]
    in_rule = {float(a) for a in alphas_np if a in (0.0, 1.0)} if precision == "fp32" else set()
    need = [] if endpoint_scores is not None else [
        a for a, known in ((1.0, False), (0.0, baseline_scores is not None)) if not known and a not in in_rule]
    extra = None
    if need and fold_endpoints and precision == "fp32" and len(need) * 4 <= min(chunk, len(alphas_np)):
        extra = torch.cat([inputs if a == 1.0 else baselines for a in need])
    folded: dict[float, torch.Tensor] = {}

    def keep_extra(out: torch.Tensor) -> None:
        for j, a in enumerate(need):
            folded[a] = out[j * n:(j + 1) * n].detach().double().cpu()

    acc = _weighted_grad_sum(forward, inputs, baselines, torch.arange(n, device=inputs.device), alphas_np,
                             weights_np, chunk, precision,
                             on_output=_endpoint_hook(alphas_np, n, reuse) if precision == "fp32" else None,
                             extra=extra, on_extra=keep_extra)
    if endpoint_scores is not None:
        scores, base_scores = endpoint_scores
    else:
        known = {**reuse, **folded}
        if baseline_scores is not None:
            known[0.0] = baseline_scores.double().cpu()
        if 1.0 not in known and 0.0 not in known:
            scores, base_scores = evaluate_endpoints(forward, inputs, baselines)
        else:
            scores = known[1.0] if 1.0 in known else evaluate_fp32(forward, inputs)
            base_scores = known[0.0] if 0.0 in known else evaluate_fp32(forward, baselines)
    return IGResult(diff * acc, scores, base_scores, n_steps, method)


def _endpoint_hook(alphas: np.ndarray, n: int, into: dict[float, torch.Tensor]
                   ) -> Callable[[int, torch.Tensor], None]:
    """An ``on_output`` for passes over ``alphas`` (``n`` samples each) that stores the outputs at alpha = 0 and 1,
    i.e. F(x') and F(x), in ``into``."""

    def keep(start: int, out: torch.Tensor) -> None:
        k = out.shape[0] // n
        for j, alpha in enumerate(alphas[start:start + k]):
            if alpha in (0.0, 1.0):
                into[float(alpha)] = out.detach().view(k, n)[j].double().cpu()

    return keep


def _weighted_grad_sum(forward: ForwardFn, inputs: torch.Tensor, baselines: torch.Tensor, rows: torch.Tensor,
                       alphas: np.ndarray, weights: np.ndarray, chunk: int, precision: str,
                       on_output: Callable[[int, torch.Tensor], None] | None = None,
                       extra: torch.Tensor | None = None,
                       on_extra: Callable[[torch.Tensor], None] | None = None,
                       on_grad: Callable[[int, torch.Tensor], None] | None = None) -> torch.Tensor:
    """Σ_k w_k ∂F/∂x at x' + α_k (x − x') for the samples ``rows`` (fp32, shape of ``inputs``), ``chunk`` alphas
    per batched pass; ``on_output(first alpha index, scores)`` sees each pass's forward output and
    ``on_grad(first alpha index, gradients (k, N, L, D))`` its input gradients. ``extra``
    ``(j * N, L, D)``: further rows (whole copies of the samples, e.g. their endpoints) appended to the first pass
    (fp32 only); ``on_extra`` gets their ``(j * N,)`` outputs, and their gradients are not used."""
    n = inputs.shape[0]
    device = inputs.device
    diff = inputs - baselines
    acc = torch.zeros_like(inputs, dtype=torch.float32)
    for s in range(0, len(alphas), chunk):
        a = torch.tensor(alphas[s:s + chunk], dtype=torch.float32, device=device)
        w = torch.tensor(weights[s:s + chunk], dtype=torch.float32, device=device)
        k = a.shape[0]
        x = (baselines[None] + a[:, None, None, None] * diff[None]).reshape(k * n, *inputs.shape[1:])
        x.requires_grad_(True)
        fwd_rows = rows.repeat(k)
        xin = x
        if extra is not None and s == 0:
            xin = torch.cat([x, extra])
            fwd_rows = rows.repeat(k + extra.shape[0] // n)
        with autocast(device, precision):
            out = forward(xin, fwd_rows)
        if xin is not x:
            if on_extra is not None:
                on_extra(out[k * n:])
            out = out[:k * n]
        (grad,) = torch.autograd.grad(out.float().sum(), x)
        acc += torch.einsum("k,kn...->n...", w, grad.float().view(k, n, *inputs.shape[1:]))
        if on_grad is not None:
            on_grad(s, grad.float().view(k, n, *inputs.shape[1:]))
        if on_output is not None:
            on_output(s, out)
        del x, xin, out, grad
    return acc


# method -> refinement factor of a nested rule (None: not nested). Right/left and the trapezoid double, the
# midpoint triples; Clenshaw-Curtis goes from m to 2m - 1 points (cos(k pi / N) -> cos(k pi / 2N)).
_NESTED = {"riemann_right": 2, "riemann_left": 2, "riemann_middle": 3, "riemann_trapezoid": 2,
           "clenshaw_curtis": 2, "gausslegendre": None}
# nested rules whose earlier nodes keep a constant weight class under refinement (so per-class gradient sums
# suffice); the others keep one contribution per node and reweight it at every level
_CLASS_WEIGHTED = ("riemann_right", "riemann_left", "riemann_middle", "riemann_trapezoid")


def _refine(method: str, n: int) -> int:
    factor = _NESTED[method] or 2
    return 2 * n - 1 if method in NEEDS_TWO else n * factor  # the rules with both ends keep them


def _classes(method: str, alphas: np.ndarray) -> np.ndarray:
    """Weight class of each node: the trapezoid's endpoints (0) and interior (1); one class otherwise."""
    if method == "riemann_trapezoid":
        return np.where((alphas == 0.0) | (alphas == 1.0), 0, 1)
    return np.zeros(len(alphas), dtype=np.int64)


def _class_weights(method: str, n: int) -> list[float]:
    alphas, weights = quadrature(method, n)
    cls = _classes(method, alphas)
    return [float(weights[cls == c][0]) if (cls == c).any() else 0.0 for c in range(int(cls.max()) + 1)]


@dataclass
class AdaptiveIGResult(IGResult):
    """``n_steps`` is the largest rule used; ``steps`` the rule each sample ended with, ``evaluations`` the
    gradient evaluations spent on it, ``converged`` whether it met the tolerance (its per-token error estimate and
    its relative completeness delta), ``token_errors`` that estimate when it stopped (NaN before a second level)."""

    steps: torch.Tensor | None = None
    evaluations: torch.Tensor | None = None
    converged: torch.Tensor | None = None
    token_errors: torch.Tensor | None = None


def token_error(current: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """The per-token error estimate of a refinement, per sample: the largest change of a token's attribution
    between the two levels (``(N, L, D)`` summed over D), relative to the sample's largest |attribution| now (0
    when nothing is attributed at either level)."""
    cur = current.double().sum(-1)
    change = (cur - previous.double().sum(-1)).abs().amax(1)
    scale = cur.abs().amax(1)
    return torch.where(scale > 0, change / scale.clamp_min(torch.finfo(torch.float64).tiny),
                       torch.where(change > 0, torch.full_like(change, float("inf")), torch.zeros_like(change)))


def integrated_gradients_adaptive(
    forward: ForwardFn,
    inputs: torch.Tensor,
    baselines: torch.Tensor,
    *,
    tolerance: float,
    method: str = "gausslegendre",
    start_steps: int = 16,
    max_steps: int = MAX_STEPS,
    alpha_batch_size: int | None = None,
    max_rows: int | None = None,
    precision: str = "fp32",
    token_sums: bool = False,
) -> AdaptiveIGResult:
    """IG refined per sample until it meets ``tolerance`` (or ``max_steps``): its per-token error estimate
    (:func:`token_error`: the largest change of a token's attribution from the previous level, relative to its
    largest attribution; for nested rules Q(2m-1) - Q(m)) and its relative completeness delta both at most
    ``tolerance``. Completeness alone is one scalar in which the tokens' errors cancel, so a sample is never taken
    as converged at its first level.

    Level sizes are ``start_steps`` refined by the rule's factor. For nested rules only the new nodes of a
    level are evaluated. The Riemann rules keep the unweighted gradient sums of each weight class per sample and
    reweight them for the level (for the trapezoid, endpoints and interior nodes have different weights).
    Clenshaw-Curtis weights change per node from level to level, so it keeps each node's contribution
    (x − x') ⊙ ∂F/∂x: ``(N, L, D)`` per node, or ``(N, L, 1)`` with ``token_sums`` (then the returned
    attributions are summed over the last dimension too, ``(N, L, 1)``; a caller that wants per-position
    attributions only should ask for this, it makes the per-node memory D times smaller).

    Alphas per batched pass: ``alpha_batch_size``, else ``max_rows`` divided by the samples still refining (so
    the passes stay as large as the memory budget allows while samples drop out), else all of a level's.

    F(x) and F(x') come from the first level's passes when its rule contains alpha = 0 and 1 and the forward
    runs in fp32 (Clenshaw-Curtis, the trapezoid); otherwise from one fp32 forward over both."""
    if not tolerance > 0:
        raise ValueError("tolerance must be > 0")
    n = max(1, min(start_steps, max_steps))
    if method in NEEDS_TWO:
        n = max(n, 2)
    first_alphas = quadrature(method, n)[0]  # validates the method too
    n_samples = inputs.shape[0]
    device = inputs.device
    inputs = inputs.detach().float()
    baselines = baselines.detach().float()
    diff = inputs - baselines
    from_rule = precision == "fp32" and first_alphas[0] == 0.0 and first_alphas[-1] == 1.0
    ends: dict[float, torch.Tensor] = {}
    scores: torch.Tensor | None = None
    base_scores: torch.Tensor | None = None
    if not from_rule:
        scores, base_scores = evaluate_endpoints(forward, inputs, baselines)
    nested = _NESTED[method] is not None
    per_node = nested and method not in _CLASS_WEIGHTED

    def reduce(t: torch.Tensor) -> torch.Tensor:
        return t.sum(-1, keepdim=True) if token_sums else t

    attributions = reduce(torch.zeros_like(inputs))
    steps = torch.zeros(n_samples, dtype=torch.long)
    evaluations = torch.zeros(n_samples, dtype=torch.long)
    converged = torch.zeros(n_samples, dtype=torch.bool)
    token_errors = torch.full((n_samples,), float("nan"), dtype=torch.float64)
    previous: torch.Tensor | None = None  # the last level's attributions of every sample
    sums: list[torch.Tensor] = []  # per weight class, unweighted gradient sums [N, L, D] (class-weighted rules)
    nodes: list[torch.Tensor | None] = []  # per node of the level, its contribution (per-node rules)
    done_nodes: np.ndarray = np.empty(0)
    active = torch.arange(n_samples)
    level = 0
    while True:
        alphas, weights = quadrature(method, n)
        rows = active.to(device)
        x_a, b_a, d_a = inputs[rows], baselines[rows], diff[rows]
        if alpha_batch_size is not None:
            chunk = max(1, min(int(alpha_batch_size), len(alphas)))
        elif max_rows is not None:
            chunk = max(1, min(int(max_rows) // len(active), len(alphas)))
        else:
            chunk = len(alphas)

        def on_output(evaluated: np.ndarray, first: bool = level == 0) -> Callable[[int, torch.Tensor], None] | None:
            """Keeps F(x') and F(x) from the first level's passes over ``evaluated`` alphas."""
            return _endpoint_hook(evaluated, n_samples, ends) if from_rule and first else None

        if per_node:
            if level > 0:  # the previous level's nodes are this level's even-indexed ones
                nodes = [nodes[i // 2] if i % 2 == 0 else None for i in range(len(alphas))]
            else:
                nodes = [None] * len(alphas)
            todo = np.array([i for i, t in enumerate(nodes) if t is None])
            fresh: list[torch.Tensor] = []

            def keep_node(start: int, grad: torch.Tensor, fresh: list[torch.Tensor] = fresh,
                          d_a: torch.Tensor = d_a) -> None:
                for g in grad:
                    fresh.append(reduce(d_a * g))

            _weighted_grad_sum(forward, x_a, b_a, rows, alphas[todo], np.zeros(len(todo)), chunk, precision,
                               on_output=on_output(alphas[todo]), on_grad=keep_node)
            for i, t in zip(todo, fresh, strict=True):
                full = torch.zeros_like(attributions)
                full[rows] = t
                nodes[int(i)] = full
            evaluations[active] += len(todo)
            attributions[rows] = sum(float(w) * t[rows] for w, t in zip(weights, nodes, strict=True))
        elif nested:
            new = ~np.isin(np.round(alphas * 2**40), np.round(done_nodes * 2**40))
            cls = _classes(method, alphas)
            for c in range(int(cls.max()) + 1):
                sel = new & (cls == c)
                while len(sums) <= c:
                    sums.append(torch.zeros_like(inputs))
                if sel.any():
                    sums[c][rows] += _weighted_grad_sum(forward, x_a, b_a, rows, alphas[sel],
                                                        np.ones(int(sel.sum())), chunk, precision,
                                                        on_output=on_output(alphas[sel]))
            evaluations[active] += int(new.sum())
            done_nodes = alphas
            cw = _class_weights(method, n)
            attributions[rows] = reduce(d_a * sum(w * sums[c][rows] for c, w in enumerate(cw)))
        else:
            total = _weighted_grad_sum(forward, x_a, b_a, rows, alphas, weights, chunk, precision,
                                       on_output=on_output(alphas))
            evaluations[active] += n
            attributions[rows] = reduce(d_a * total)
        if scores is None:
            scores, base_scores = ends[1.0], ends[0.0]
        steps[active] = n
        sums_a = attributions[rows].double().flatten(1).sum(1).cpu()
        rel = relative_delta(sums_a, scores[active], base_scores[active], inert(attributions[rows]))
        if previous is not None:
            token_errors[active] = token_error(attributions[rows], previous[rows]).cpu()
        else:  # an input equal to its baseline has nothing to attribute: no token can be in error
            token_errors[active] = torch.where(inert(attributions[rows]).cpu(), 0.0, float("nan")).double()
        previous = attributions.clone()
        ok = (rel <= tolerance) & (token_errors[active] <= tolerance)
        converged[active[ok]] = True
        # a non-finite delta never converges: stop refining it (the caller reports it), do not spend max_steps
        active = active[~(ok | ~torch.isfinite(rel))]
        nxt = _refine(method, n)
        if len(active) == 0 or nxt > max_steps:
            break
        n = nxt
        level += 1
    return AdaptiveIGResult(attributions, scores, base_scores, int(steps.max()), method, steps=steps,
                            evaluations=evaluations, converged=converged, token_errors=token_errors)


def integrated_gradients_reference(
    score: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    baseline: torch.Tensor,
    *,
    n_steps: int = 64,
    method: str = "gausslegendre",
) -> IGResult:
    """The plain sequential loop for ONE sample: one step, one forward, one ``backward``, in fp32.

    ``score(x)`` takes ``(1, L, D)`` and returns a one-element tensor; it may recompute anything it likes (the
    source recomputed the user vector at every step)."""
    alphas, weights = quadrature(method, n_steps)
    x = x.detach().float()
    baseline = baseline.detach().float()
    total = torch.zeros_like(x)
    for alpha, weight in zip(alphas, weights, strict=True):
        point = (baseline + float(alpha) * (x - baseline)).unsqueeze(0).requires_grad_(True)
        out = score(point).sum()
        out.backward()
        assert point.grad is not None
        total += float(weight) * point.grad[0]
    with torch.no_grad():
        f_x = score(x.unsqueeze(0)).double().reshape(1).cpu()
        f_b = score(baseline.unsqueeze(0)).double().reshape(1).cpu()
    return IGResult(((x - baseline) * total).unsqueeze(0), f_x, f_b, n_steps, method)
