"""The IG engine on small functions where the answer is known, and against Captum."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.explain.ig import (
    METHODS,
    auto_rows,
    evaluate_fp32,
    integrated_gradients,
    integrated_gradients_adaptive,
    integrated_gradients_reference,
    quadrature,
)
from models.explain.occlusion import occlusion


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n", [2, 7, 64, 4096])
def test_quadrature_weights_sum_to_one(method: str, n: int) -> None:
    alphas, weights = quadrature(method, n)
    assert len(alphas) == len(weights) == n
    assert abs(weights.sum() - 1.0) < 1e-12
    assert alphas.min() >= 0.0 and alphas.max() <= 1.0


def test_quadrature_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="n_steps"):
        quadrature("gausslegendre", 0)
    with pytest.raises(ValueError, match="n_steps"):
        quadrature("gausslegendre", 4097)
    with pytest.raises(ValueError, match="method"):
        quadrature("simpson", 8)


@pytest.mark.parametrize("n", [1, 3, 8])
def test_gauss_legendre_is_exact_for_polynomials_of_degree_2n_minus_1(n: int) -> None:
    alphas, weights = quadrature("gausslegendre", n)
    for k in range(2 * n):
        assert abs(float((weights * alphas**k).sum()) - 1.0 / (k + 1)) < 1e-12


@pytest.mark.parametrize("n", [2, 3, 5, 9, 17])
def test_clenshaw_curtis_weights_are_the_interpolatory_ones(n: int) -> None:
    # independent oracle: the interpolatory rule on these nodes integrates every polynomial of degree < n
    # exactly, so its weights solve the moment equations in a well-conditioned basis, the shifted Legendre
    # polynomials (their integrals over [0, 1] are 1, 0, 0, ...); the nodes are (1 - cos(k pi / (n-1))) / 2
    alphas, weights = quadrature("clenshaw_curtis", n)
    np.testing.assert_allclose(alphas, (1 - np.cos(np.pi * np.arange(n) / (n - 1))) / 2, atol=1e-15)
    vander = np.polynomial.legendre.legvander(2 * alphas - 1, n - 1)
    oracle = np.linalg.solve(vander.T, np.eye(n)[0])
    np.testing.assert_allclose(weights, oracle, rtol=1e-9, atol=1e-12)
    assert (weights > 0).all()


@pytest.mark.parametrize("n", [2, 16, 31, 1000])
def test_clenshaw_curtis_is_nested_under_m_to_2m_minus_1(n: int) -> None:
    coarse, _ = quadrature("clenshaw_curtis", n)
    fine, _ = quadrature("clenshaw_curtis", 2 * n - 1)
    np.testing.assert_allclose(fine[::2], coarse, rtol=0, atol=1e-15)


def test_captum_trapezoid_is_biased_and_ours_is_not() -> None:
    from captum.attr._utils.approximation_methods import approximation_parameters

    step_sizes, _ = approximation_parameters("riemann_trapezoid")
    n = 10
    assert abs(sum(step_sizes(n)) - (n - 1) / n) < 1e-9  # the bias this module does not copy
    assert abs(quadrature("riemann_trapezoid", n)[1].sum() - 1.0) < 1e-12


def _context_net(d: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(d, 16, generator=g) / d**0.5
    w2 = torch.randn(16, d, generator=g) / 4

    def f(x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(x @ w1) @ w2  # (M, L, d)
        return (h.sum(1) * ctx).sum(-1)

    return f


@pytest.mark.parametrize("method", ["gausslegendre", "riemann_trapezoid", "riemann_middle"])
def test_exact_on_a_quadratic(method: str) -> None:
    # F(x) = sum c x^2: the integrand is linear in alpha, so every rule here integrates it exactly:
    # IG_i = c_i (x_i^2 - x'_i^2).
    g = torch.Generator().manual_seed(1)
    c = torch.randn(4, 3, generator=g)
    x, base = torch.randn(2, 4, 3, generator=g), torch.randn(2, 4, 3, generator=g)
    res = integrated_gradients(lambda z, rows: (c * z**2).flatten(1).sum(1), x, base, n_steps=4, method=method)
    torch.testing.assert_close(res.attributions, c * (x**2 - base**2), rtol=1e-5, atol=1e-6)
    assert float(res.relative_deltas.max()) < 1e-5


@pytest.mark.parametrize("method", ["gausslegendre", "riemann_right", "riemann_left", "riemann_middle"])
def test_matches_captum_integrated_gradients(method: str) -> None:
    from captum.attr import IntegratedGradients

    f = _context_net()
    g = torch.Generator().manual_seed(2)
    x, base, ctx = torch.randn(3, 6, 5, generator=g), torch.randn(3, 6, 5, generator=g), torch.randn(3, 5, generator=g)
    ours = integrated_gradients(lambda z, rows: f(z, ctx[rows]), x, base, n_steps=24, method=method,
                                alpha_batch_size=5)
    theirs = IntegratedGradients(f).attribute(x, baselines=base, additional_forward_args=(ctx,), n_steps=24,
                                              method=method)
    torch.testing.assert_close(ours.attributions, theirs, rtol=1e-5, atol=1e-7)


def test_alpha_chunks_and_reference_agree() -> None:
    f = _context_net(seed=3)
    g = torch.Generator().manual_seed(3)
    x, base, ctx = torch.randn(2, 4, 5, generator=g), torch.zeros(2, 4, 5), torch.randn(2, 5, generator=g)
    whole = integrated_gradients(lambda z, rows: f(z, ctx[rows]), x, base, n_steps=16)
    chunked = integrated_gradients(lambda z, rows: f(z, ctx[rows]), x, base, n_steps=16, alpha_batch_size=3)
    torch.testing.assert_close(whole.attributions, chunked.attributions, rtol=1e-6, atol=1e-7)
    for i in range(2):
        ref = integrated_gradients_reference(lambda z, i=i: f(z, ctx[i:i + 1]), x[i], base[i], n_steps=16)
        torch.testing.assert_close(ref.attributions[0], whole.attributions[i], rtol=1e-5, atol=1e-7)
        assert abs(float(ref.scores[0]) - float(whole.scores[i])) < 1e-6


def test_endpoint_reuse_matches_a_separate_evaluation() -> None:
    f = _context_net(seed=4)
    g = torch.Generator().manual_seed(4)
    x, base, ctx = torch.randn(2, 3, 5, generator=g), torch.randn(2, 3, 5, generator=g), torch.randn(2, 5, generator=g)
    fwd = lambda z, rows: f(z, ctx[rows])  # noqa: E731
    res = integrated_gradients(fwd, x, base, n_steps=8, method="riemann_trapezoid")
    torch.testing.assert_close(res.scores, evaluate_fp32(fwd, x), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(res.baseline_scores, evaluate_fp32(fwd, base), rtol=1e-6, atol=1e-7)


def test_bf16_forward_keeps_fp32_endpoints() -> None:
    f = _context_net(seed=5)
    g = torch.Generator().manual_seed(5)
    x, base, ctx = torch.randn(2, 3, 5, generator=g), torch.zeros(2, 3, 5), torch.randn(2, 5, generator=g)
    fwd = lambda z, rows: f(z, ctx[rows])  # noqa: E731
    lo = integrated_gradients(fwd, x, base, n_steps=8, method="riemann_right", precision="bf16")
    assert lo.attributions.dtype == torch.float32
    torch.testing.assert_close(lo.scores, evaluate_fp32(fwd, x))


def test_auto_rows_grows_with_the_budget() -> None:
    lin = torch.nn.Linear(32, 32)
    for p in lin.parameters():
        p.requires_grad_(False)
    x = torch.randn(2, 10, 32)
    fwd = lambda z, rows: torch.tanh(lin(z)).sum((1, 2))  # noqa: E731
    small = auto_rows(fwd, x, torch.zeros_like(x), "fp32", memory_budget=1 << 20)
    large = auto_rows(fwd, x, torch.zeros_like(x), "fp32", memory_budget=1 << 24)
    assert 1 <= small < large


def test_occlusion_is_the_score_drop() -> None:
    f = _context_net(seed=6)
    g = torch.Generator().manual_seed(6)
    x, base, ctx = torch.randn(2, 4, 5, generator=g), torch.zeros(2, 4, 5), torch.randn(2, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])
    res = occlusion(lambda z, rows: f(z, ctx[rows]), x, base, mask)
    for i in range(2):
        for j in range(4):
            if not mask[i, j]:
                assert float(res.attributions[i, j, 0]) == 0.0
                continue
            z = x[i:i + 1].clone()
            z[0, j] = base[i, j]
            expect = float(f(x[i:i + 1], ctx[i:i + 1]) - f(z, ctx[i:i + 1]))
            assert np.isclose(float(res.attributions[i, j, 0]), expect, rtol=1e-5, atol=1e-6)


def _exp_net(rate: torch.Tensor):
    """F(x) = Σ_l exp(rate_l · Σ_d x_ld): the integrand along the path is exp(α·c), smooth, and its difficulty
    (curvature) grows with ``rate``; IG is known in closed form."""

    def f(z: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return torch.exp(rate[rows][:, None] * z.sum(-1)).sum(-1)

    return f


def _atan_net(rate: torch.Tensor):
    """F(x) = Σ_l atan(rate_l (Σ_d x_ld − 1/2)): along the path the integrand has poles at distance ~1/rate from
    the real axis, hard for spectral rules when the rate is large."""

    def f(z: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return torch.atan(rate[rows][:, None] * (z.sum(-1) - 0.5)).sum(-1)

    return f


def _exp_ig(rate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # baseline 0: ∂F/∂x_ld = r e^{r S_l}; ∫ r e^{α r S_l} dα = (e^{r S_l} − 1)/S_l, times x_ld
    total = x.sum(-1, keepdim=True)
    return x * (torch.exp(rate[:, None, None] * total) - 1) / total


@pytest.mark.parametrize("method", ["riemann_right", "riemann_left", "riemann_trapezoid", "riemann_middle",
                                    "clenshaw_curtis"])
def test_adaptive_nested_rules_reuse_their_nodes(method: str) -> None:
    # an easy sample (rate 0.01) converges at the second level (the first whose per-token error can be estimated),
    # a hard one needs more refinement; a nested rule spends exactly its final number of nodes on each, never the
    # sum of the levels. Clenshaw-Curtis integrates the exponential to 1e-7 at 16 nodes, so it gets an integrand
    # with poles near [0, 1] (atan, rate 30).
    x = torch.full((2, 3, 2), 0.5, dtype=torch.float64)
    if method == "clenshaw_curtis":
        rate = torch.tensor([0.01, 30.0], dtype=torch.float64)
        f = _atan_net(rate)
    else:
        rate = torch.tensor([0.01, 4.0], dtype=torch.float64)
        f = _exp_net(rate)
    res = integrated_gradients_adaptive(lambda z, rows: f(z.double(), rows), x.float(), torch.zeros(2, 3, 2),
                                        tolerance=1e-3, method=method)
    from models.explain.ig import _refine

    assert bool(res.converged.all())
    assert int(res.steps[0]) == _refine(method, 16) and int(res.steps[1]) > 16
    assert int(res.evaluations[0]) == int(res.steps[0])
    assert int(res.evaluations[1]) == int(res.steps[1])
    assert float(res.token_errors.max()) <= 1e-3
    # the refined attributions equal a one-shot run at the final number of steps
    one = integrated_gradients(lambda z, rows: f(z.double(), rows + 1), x[1:].float(), torch.zeros(1, 3, 2),
                               n_steps=int(res.steps[1]), method=method)
    torch.testing.assert_close(res.attributions[1:], one.attributions, rtol=1e-5, atol=1e-7)
    assert float(res.relative_deltas.max()) <= 1e-3


@pytest.mark.parametrize("method", ["gausslegendre", "clenshaw_curtis", "riemann_trapezoid"])
def test_adaptive_token_sums_equal_the_full_attributions_summed(method: str) -> None:
    f = _context_net(seed=3)
    g = torch.Generator().manual_seed(3)
    x, base, ctx = torch.randn(3, 4, 5, generator=g), torch.randn(3, 4, 5, generator=g), torch.randn(3, 5, generator=g)
    fwd = lambda z, rows: f(z, ctx[rows])  # noqa: E731
    full = integrated_gradients_adaptive(fwd, x, base, tolerance=1e-5, method=method, alpha_batch_size=5)
    sums = integrated_gradients_adaptive(fwd, x, base, tolerance=1e-5, method=method, alpha_batch_size=5,
                                         token_sums=True)
    assert sums.attributions.shape == (3, 4, 1)
    torch.testing.assert_close(sums.attributions, full.attributions.sum(-1, keepdim=True), rtol=1e-5, atol=1e-7)
    assert torch.equal(sums.steps, full.steps) and torch.equal(sums.evaluations, full.evaluations)
    # the deltas differ only by fp32 summation order (they sit near its floor here, after several levels)
    torch.testing.assert_close(sums.relative_deltas, full.relative_deltas, rtol=0, atol=5e-6)
    assert float(sums.relative_deltas.max()) <= 1e-5


def test_adaptive_clenshaw_curtis_reads_the_endpoints_from_its_own_nodes() -> None:
    # alpha = 0 and 1 are nodes of the rule: in fp32 no separate endpoint forward is run, and the scores equal one
    f = _context_net(seed=4)
    g = torch.Generator().manual_seed(4)
    x, base, ctx = torch.randn(3, 4, 5, generator=g), torch.randn(3, 4, 5, generator=g), torch.randn(3, 5, generator=g)
    fwd, calls = _counting(lambda z, rows: f(z, ctx[rows]))
    res = integrated_gradients_adaptive(fwd, x, base, tolerance=1e-4, method="clenshaw_curtis")
    assert calls[0] == 16 * 3  # the first level's pass, not a 2N-row endpoint forward
    assert 2 * 3 not in calls
    torch.testing.assert_close(res.scores, evaluate_fp32(lambda z, rows: f(z, ctx[rows]), x), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(res.baseline_scores, evaluate_fp32(lambda z, rows: f(z, ctx[rows]), base),
                               rtol=1e-6, atol=1e-7)
    # in bf16 the endpoints stay fp32 evaluations of their own
    fwd16, calls16 = _counting(lambda z, rows: f(z, ctx[rows]))
    integrated_gradients_adaptive(fwd16, x, base, tolerance=1e-1, method="clenshaw_curtis", precision="bf16")
    assert calls16[0] == 2 * 3


def test_adaptive_gauss_legendre_meets_the_tolerance_per_sample() -> None:
    rate = torch.tensor([0.01, 1.0, 3.0], dtype=torch.float64)
    x = torch.full((3, 2, 2), 0.5, dtype=torch.float64)
    f = _exp_net(rate)
    fwd = lambda z, rows: f(z.double(), rows)  # noqa: E731
    res = integrated_gradients_adaptive(fwd, x.float(), torch.zeros(3, 2, 2), tolerance=1e-6, start_steps=2)
    assert bool(res.converged.all())
    assert res.steps.tolist() == sorted(res.steps.tolist())  # harder samples needed more steps
    assert int(res.steps[0]) < int(res.steps[2])
    assert float(res.relative_deltas.max()) <= 1e-6
    torch.testing.assert_close(res.attributions.double(), _exp_ig(rate, x), rtol=1e-5, atol=1e-7)
    # not nested: each level (2, 4, 8, ...) is evaluated in full, for the samples still refining only; none
    # stops at its first level (its per-token error needs a second)
    assert int(res.steps[0]) >= 4 and int(res.evaluations[0]) == 2 * int(res.steps[0]) - 2
    assert int(res.evaluations[0]) < int(res.evaluations[2])
    assert float(res.token_errors.max()) <= 1e-6


def test_adaptive_stops_at_max_steps_and_says_so() -> None:
    rate = torch.tensor([8.0], dtype=torch.float64)
    x = torch.full((1, 2, 2), 1.0)
    f = _exp_net(rate)
    res = integrated_gradients_adaptive(lambda z, rows: f(z.double(), rows), x, torch.zeros_like(x),
                                        tolerance=1e-9, method="riemann_right", max_steps=64)
    assert int(res.steps[0]) == 64 and not bool(res.converged[0])


def _counting(fwd):
    """``fwd`` that records the number of rows of every call."""
    calls: list[int] = []

    def f(z: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        calls.append(int(z.shape[0]))
        return fwd(z, rows)

    return f, calls


def test_folded_endpoints_ride_in_the_first_gradient_pass_and_equal_a_separate_forward() -> None:
    f = _context_net(seed=7)
    g = torch.Generator().manual_seed(7)
    x, base, ctx = torch.randn(3, 4, 5, generator=g), torch.randn(3, 4, 5, generator=g), torch.randn(3, 5, generator=g)
    folded_fwd, folded_calls = _counting(lambda z, rows: f(z, ctx[rows]))
    folded = integrated_gradients(folded_fwd, x, base, n_steps=8)
    separate_fwd, separate_calls = _counting(lambda z, rows: f(z, ctx[rows]))
    separate = integrated_gradients(separate_fwd, x, base, n_steps=8, fold_endpoints=False)
    # one pass of 8 alphas x 3 samples plus the 3 inputs and 3 baselines, against that pass and one forward
    assert folded_calls == [8 * 3 + 2 * 3]
    assert separate_calls == [8 * 3, 2 * 3]
    torch.testing.assert_close(folded.attributions, separate.attributions, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(folded.scores, evaluate_fp32(lambda z, rows: f(z, ctx[rows]), x), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(folded.baseline_scores, evaluate_fp32(lambda z, rows: f(z, ctx[rows]), base),
                               rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(folded.scores, separate.scores, rtol=1e-6, atol=1e-7)


def test_endpoints_are_not_folded_into_a_small_pass_or_a_low_precision_one() -> None:
    f = _context_net(seed=8)
    g = torch.Generator().manual_seed(8)
    x, base, ctx = torch.randn(2, 3, 5, generator=g), torch.zeros(2, 3, 5), torch.randn(2, 5, generator=g)
    fwd, calls = _counting(lambda z, rows: f(z, ctx[rows]))
    integrated_gradients(fwd, x, base, n_steps=8, alpha_batch_size=7)  # 2 endpoints would add over a quarter
    assert calls == [7 * 2, 1 * 2, 2 * 2]
    fwd, calls = _counting(lambda z, rows: f(z, ctx[rows]))
    lo = integrated_gradients(fwd, x, base, n_steps=8, precision="bf16")
    assert calls == [8 * 2, 2 * 2]  # the endpoints stay fp32, in their own forward
    torch.testing.assert_close(lo.scores, evaluate_fp32(lambda z, rows: f(z, ctx[rows]), x))


def test_given_baseline_scores_are_used_and_only_the_inputs_are_evaluated() -> None:
    f = _context_net(seed=9)
    g = torch.Generator().manual_seed(9)
    x, base, ctx = torch.randn(2, 3, 5, generator=g), torch.randn(2, 3, 5, generator=g), torch.randn(2, 5, generator=g)
    fwd, calls = _counting(lambda z, rows: f(z, ctx[rows]))
    given = torch.tensor([0.25, -1.5], dtype=torch.float64)
    res = integrated_gradients(fwd, x, base, n_steps=4, baseline_scores=given)
    assert calls == [4 * 2 + 2]  # the alphas and F(x); F(x') is not recomputed
    assert res.baseline_scores.tolist() == given.tolist()
    torch.testing.assert_close(res.scores, evaluate_fp32(lambda z, rows: f(z, ctx[rows]), x), rtol=1e-6, atol=1e-7)


def test_relative_delta_is_the_one_completeness_measure_and_never_negative():
    """|Σattr − (F(x) − F(x'))| / |F(x) − F(x')|, worked by hand: an attribution sum short of the score difference
    and one past it give the same positive error, a zero difference is floored, numbers and tensors agree."""
    from models.explain.ig import COMPLETENESS_FLOOR, relative_delta

    assert float(relative_delta(1.0, 3.0, 1.0)) == 0.5       # |1 - 2| / 2
    assert float(relative_delta(3.0, 3.0, 1.0)) == 0.5       # |3 - 2| / 2: over, not -0.5
    assert float(relative_delta(-1.0, 1.0, 3.0)) == 0.5      # F(x) < F(x'): |-1 - (-2)| / 2
    assert float(relative_delta(1e-3, 2.0, 2.0)) == pytest.approx(1e-3 / COMPLETENESS_FLOOR)
    sums, scores, base = torch.tensor([1.0, 3.0]), torch.tensor([3.0, 3.0]), torch.tensor([1.0, 1.0])
    out = relative_delta(sums, scores, base)
    assert out.dtype == torch.float64 and out.tolist() == [0.5, 0.5]


def test_an_input_equal_to_its_baseline_meets_completeness_exactly():
    """Nothing between the input and the baseline (an empty text): every attribution is exactly zero, F(x) = F(x'),
    and the difference two passes compute is rounding alone. Its relative error is 0 whatever that rounding (it
    would be 1 or 0 by chance), and the adaptive rule takes it as converged at once."""
    from models.explain.ig import inert, relative_delta

    assert float(relative_delta(0.0, 1.0 + 1e-7, 1.0)) == pytest.approx(1.0)  # the noise, divided by itself
    assert float(relative_delta(0.0, 1.0 + 1e-7, 1.0, inert=True)) == 0.0
    assert float(relative_delta(0.0, 1.0, 1.0, inert=True)) == 0.0
    same = relative_delta(torch.tensor([0.0, 1.0]), torch.tensor([1.0 + 1e-7, 3.0]), torch.tensor([1.0, 1.0]),
                          inert=torch.tensor([True, False]))
    assert same.tolist() == [0.0, 0.5]
    assert inert(torch.tensor([[0.0, 0.0], [0.0, 1e-30]])).tolist() == [True, False]

    rate = torch.tensor([1.0, 1.0], dtype=torch.float64)
    f = _exp_net(rate)
    x = torch.stack([torch.zeros(2, 2), torch.full((2, 2), 0.5)])  # the first sample is its own baseline
    res = integrated_gradients_adaptive(lambda z, rows: f(z.double(), rows), x, torch.zeros(2, 2, 2),
                                        tolerance=1e-6, start_steps=2)
    assert bool(res.converged.all()) and int(res.steps[0]) == 2  # not refined to max_steps
    assert res.relative_deltas.tolist()[0] == 0.0 and float(res.attributions[0].abs().sum()) == 0.0
