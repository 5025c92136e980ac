"""The optimised Vision-BDH computes the reference's function: outputs and gradients, every switch."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from models.vision.bdh import VisionBDH, pair_permutation, rope_halves, to_pair_layout
from models.vision.config import Optimizations, VisionBDHConfig
from models.vision.reference import ReferenceVisionBDH, rope_cos_sin, rope_frequencies, rope_interleaved

TINY = VisionBDHConfig(n_layer=2, n_embd=32, n_head=4, mlp_multiplier=4, dropout=0.0, num_classes=10)

SWITCHES = [
    pytest.param(Optimizations(), id="all-on"),
    *[pytest.param(Optimizations().without(n), id=f"no-{n}") for n in Optimizations.names()],
    pytest.param(Optimizations.none(), id="all-off"),
]


def _outputs_and_grads(model: torch.nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    images = images.clone().requires_grad_(True)
    logits = model(images)
    # A loss that weighs every logit differently, so no gradient can cancel by symmetry.
    weights = torch.linspace(-1.0, 1.0, logits.numel(), dtype=logits.dtype).view_as(logits)
    (logits * weights).mean().backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    grads["<input>"] = images.grad.detach().clone()
    return logits.detach(), grads


@pytest.mark.parametrize("softmax", [False, True], ids=["linear", "softmax"])
@pytest.mark.parametrize("opt", SWITCHES)
@pytest.mark.parametrize("cls_token", [False, True], ids=["meanpool", "cls"])
def test_optimized_equals_reference(softmax: bool, opt: Optimizations, cls_token: bool) -> None:
    torch.manual_seed(0)
    config = dataclasses.replace(TINY, softmax_attention=softmax, cls_token=cls_token)
    reference = ReferenceVisionBDH(config)
    fast = VisionBDH(config, opt)
    fast.load_state_dict(reference.state_dict())  # same names and shapes: the weights are shared
    images = torch.randn(3, 3, 32, 32)
    out_ref, grads_ref = _outputs_and_grads(reference, images)
    out_fast, grads_fast = _outputs_and_grads(fast, images)
    assert out_ref.abs().max() > 0.1  # a real signal, not a collapsed network
    torch.testing.assert_close(out_fast, out_ref, rtol=0, atol=1e-5)
    assert grads_fast.keys() == grads_ref.keys()
    for name, g in grads_ref.items():
        assert g.abs().max() > 0, name
        torch.testing.assert_close(grads_fast[name], g, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_float64_agreement_is_tight() -> None:
    """In float64 the only difference is summation order: agreement to ~1e-12."""
    torch.manual_seed(1)
    config = dataclasses.replace(TINY, softmax_attention=True)
    reference = ReferenceVisionBDH(config).double()
    fast = VisionBDH(config).double()
    fast.load_state_dict(reference.state_dict())
    images = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    torch.testing.assert_close(fast(images), reference(images), rtol=0, atol=1e-11)


def test_eval_mode_with_dropout_agrees() -> None:
    torch.manual_seed(2)
    config = dataclasses.replace(TINY, dropout=0.3)
    reference, fast = ReferenceVisionBDH(config).eval(), VisionBDH(config).eval()
    fast.load_state_dict(reference.state_dict())
    images = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(fast(images), reference(images), rtol=0, atol=1e-5)
    # and in training mode dropout really acts
    fast.train()
    assert not torch.allclose(fast(images), fast(images))


def test_rope_pair_layout_is_the_interleaved_rotation_permuted() -> None:
    n, t = 16, 5
    freqs = rope_frequencies(n)
    assert torch.equal(freqs[0::2], freqs[1::2])  # BDH's frequencies are shared within a pair
    cos, sin = rope_cos_sin(t, freqs)
    v = torch.randn(2, t, n)
    perm = pair_permutation(n)
    rotated = rope_interleaved(v, cos, sin)
    expected = rotated[..., perm]
    got = rope_halves(v[..., perm], cos[:, ::2], sin[:, ::2])
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(to_pair_layout(v, -1), v[..., perm])
    # the hand-written backward is the vector-Jacobian product of the rotation
    v64 = v.double().requires_grad_(True)
    c64, s64 = cos[:, ::2].double(), sin[:, ::2].double()
    assert torch.autograd.gradcheck(lambda x: rope_halves(x, c64, s64), (v64,))
    # position 0 is the identity; rotations preserve each pair's norm
    torch.testing.assert_close(rotated[:, 0], v[:, 0])
    pairs = lambda x: x.view(2, t, n // 2, 2).norm(dim=-1)  # noqa: E731
    torch.testing.assert_close(pairs(rotated), pairs(v))


@pytest.mark.parametrize("cls_token", [False, True])
def test_parameter_count_matches_formula(cls_token: bool) -> None:
    for config in (dataclasses.replace(TINY, cls_token=cls_token), VisionBDHConfig(cls_token=cls_token)):
        model = VisionBDH(config)
        assert sum(p.numel() for p in model.parameters()) == config.expected_parameters()
    # the default model: 3·32·192² BDH core plus embedding and head
    assert VisionBDHConfig().expected_parameters() == 3 * 32 * 192**2 + (48 * 192 + 192) + 64 * 192 + 1930


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="divisible by n_head"):
        VisionBDHConfig(n_embd=100, n_head=6)
    with pytest.raises(ValueError, match="dropout"):
        VisionBDHConfig(dropout=1.5)
    assert VisionBDHConfig.from_dict({**TINY.to_dict(), "unknown": 1}) == TINY


def test_default_model_shapes() -> None:
    config = VisionBDHConfig(n_layer=1)
    model = VisionBDH(config)
    assert config.neurons_per_head == 1024 and config.num_tokens == 64
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_fast_dropout_rate_rescale_and_gradient() -> None:
    from models.vision.bdh import _GatedDropout, dropout_threshold, gated_dropout

    torch.manual_seed(3)
    x_s, y_s = torch.rand(4, 256, 512) + 0.1, torch.rand(4, 256, 512) + 0.1
    out, scale = gated_dropout(x_s, y_s, 0.1)
    dropped = (out == 0).float().mean().item()
    threshold, p_eff = dropout_threshold(0.1)
    assert threshold == 3277 and abs(p_eff - 0.1) < 1e-4
    assert abs(dropped - p_eff) < 0.003  # 524k draws: the standard error is 4e-4
    assert scale == pytest.approx(1 / (1 - p_eff))
    kept = out != 0
    torch.testing.assert_close(out[kept], (x_s * y_s)[kept], rtol=0, atol=0)
    assert gated_dropout(x_s, y_s, 0.0)[1] == 1.0
    # the hand-written backward against finite differences, for a fixed mask
    a = torch.rand(3, 5, dtype=torch.float64, requires_grad=True)
    b = torch.rand(3, 5, dtype=torch.float64, requires_grad=True)
    drop = torch.rand(3, 5) < 0.3
    assert torch.autograd.gradcheck(lambda u, v: _GatedDropout.apply(u, v, drop), (a, b))


def test_fast_dropout_trains_like_dropout_in_expectation() -> None:
    """Averaged over many masks, the fast dropout model's output matches the standard-dropout model's average."""
    torch.manual_seed(4)
    config = dataclasses.replace(TINY, dropout=0.2, n_layer=1)
    fast = VisionBDH(config).train()
    slow = VisionBDH(config, Optimizations().without("fast_dropout")).train()
    slow.load_state_dict(fast.state_dict())
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        mean_fast = torch.stack([fast(images) for _ in range(300)]).mean(0)
        mean_slow = torch.stack([slow(images) for _ in range(300)]).mean(0)
        spread = torch.stack([fast(images) for _ in range(50)]).std(0).max()
    assert spread > 1e-3  # dropout is active
    torch.testing.assert_close(mean_fast, mean_slow, rtol=0, atol=float(6 * spread / 300**0.5) + 1e-4)


@pytest.mark.slow  # the real torch.compile (inductor, a C compiler): about a minute per case on 2 cores
@pytest.mark.parametrize("softmax", [False, True], ids=["linear", "softmax"])
def test_compiled_model_equals_reference(softmax: bool) -> None:
    torch.manual_seed(5)
    config = dataclasses.replace(TINY, softmax_attention=softmax)
    reference = ReferenceVisionBDH(config)
    fast = VisionBDH(config)
    fast.load_state_dict(reference.state_dict())
    images = torch.randn(3, 3, 32, 32)
    out_ref, grads_ref = _outputs_and_grads(reference, images)
    # static shapes, as the trainer compiles (with torch 2.13 inductor's dynamic-shape path fails on this model, and
    # dynamo turns shapes dynamic by itself once it saw the same code with other shapes earlier in the process)
    torch._dynamo.reset()
    compiled = torch.compile(fast, dynamic=False)
    out, grads = _outputs_and_grads(compiled, images)
    grads = {name.removeprefix("_orig_mod."): g for name, g in grads.items()}
    torch.testing.assert_close(out, out_ref, rtol=0, atol=1e-5)
    assert grads.keys() == grads_ref.keys()
    for name, g in grads_ref.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-5, atol=1e-5)


def test_symmetric_linear_attention_backward() -> None:
    from models.vision.bdh import _SymmetricLinearAttention

    q = torch.randn(2, 3, 5, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 3, 5, 4, dtype=torch.float64, requires_grad=True)  # broadcast over the heads
    assert torch.autograd.gradcheck(_SymmetricLinearAttention.apply, (q, v))
    torch.testing.assert_close(_SymmetricLinearAttention.apply(q, v), (q @ q.transpose(-1, -2)) @ v)


def test_bf16_autocast_trains_and_stays_close_to_reference() -> None:
    """Under CPU bf16 autocast the custom backward passes keep dtypes consistent and track the reference."""
    torch.manual_seed(6)
    reference = ReferenceVisionBDH(TINY)
    fast = VisionBDH(TINY)
    fast.load_state_dict(reference.state_dict())
    images = torch.randn(3, 3, 32, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_fast, out_ref = fast(images), reference(images)
    out_fast.float().square().mean().backward()
    out_ref.float().square().mean().backward()
    torch.testing.assert_close(out_fast.float(), out_ref.float(), rtol=0.1, atol=0.1)
    for (name, p), q in zip(fast.named_parameters(), reference.parameters(), strict=True):
        assert p.grad is not None and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all(), name
        cos = torch.nn.functional.cosine_similarity(p.grad.flatten(), q.grad.flatten(), dim=0)
        assert cos > 0.95, (name, float(cos))


def test_optimized_equals_reference_at_the_default_width() -> None:
    """The default model's width (N = 192·32/6 = 1024 neurons per head) with a small batch, all switches on:
    longer sums than the tiny configs, so rounding is checked where the real model runs."""
    torch.manual_seed(5)
    config = dataclasses.replace(VisionBDHConfig(), n_layer=2, dropout=0.0, num_classes=10)
    assert config.n_embd * config.mlp_multiplier // config.n_head == 1024
    reference = ReferenceVisionBDH(config)
    fast = VisionBDH(config)
    fast.load_state_dict(reference.state_dict())
    images = torch.randn(2, 3, 32, 32)
    out_ref, grads_ref = _outputs_and_grads(reference, images)
    out_fast, grads_fast = _outputs_and_grads(fast, images)
    assert out_ref.abs().max() > 0.1
    torch.testing.assert_close(out_fast, out_ref, rtol=0, atol=1e-4)
    for name, g in grads_ref.items():
        torch.testing.assert_close(grads_fast[name], g, rtol=1e-4, atol=1e-5 * float(g.abs().max()),
                                   msg=lambda m, n=name: f"{n}: {m}")
