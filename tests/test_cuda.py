"""Half precision on the GPU against fp32: IG, TracIn, a Vision-BDH training step and the LoRA probe.

Marked ``cuda``; skipped where ``torch.cuda.is_available()`` is false. Run with ``pytest -m cuda``.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is "
                       "false)"),
]

CUDA = torch.device("cuda")


@pytest.fixture()
def autograd_kernels():
    """PyTorch's nn.TransformerEncoder runs a fused inference kernel under no_grad whose outputs differ from the
    autograd path's by about 1e-4 relative on CUDA (measured on an H100: 7.5e-5 on a score of 0.7). IG integrates
    the autograd path's gradients and reads F(x), F(x') off a separate no_grad forward when the forward runs in half
    precision, so the comparison is made on one kernel path: the fused one is switched off for the test."""
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    yield
    torch.backends.mha.set_fastpath_enabled(before)


def _encoder(d: int = 64) -> torch.nn.Module:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True, activation="gelu")
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to(CUDA).eval()
    for p in enc.parameters():
        p.requires_grad_(False)
    return enc


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_ig_half_precision_against_fp32(precision: str, autograd_kernels: None) -> None:
    from models.explain.ig import integrated_gradients

    enc = _encoder()
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(4, 12, 64, generator=g).to(CUDA)
    ctx = torch.randn(4, 64, generator=g).to(CUDA)
    # the baseline is another input, not zeros: after each residual the encoder applies LayerNorm, which is scale-
    # invariant, so along the straight path from zeros F is flat except in a spike near alpha = 0 that no 64-node
    # rule resolves (relative deltas up to 3.5 in fp32, on the CPU as on CUDA); between two inputs the path is smooth
    base = torch.randn(4, 12, 64, generator=g).to(CUDA)

    def fwd(z: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return (enc(z).mean(1).float() * ctx[rows]).sum(-1)

    ref = integrated_gradients(fwd, x, base, n_steps=64, precision="fp32")
    half = integrated_gradients(fwd, x, base, n_steps=64, precision=precision)
    assert half.attributions.dtype == torch.float32
    # endpoints are always fp32: equal up to fp32 summation order (one batch of rows against another: 3e-7 seen on
    # an H100); endpoints computed in half precision would be off by 1e-3 (fp16) to 1e-2 (bf16)
    torch.testing.assert_close(half.scores, ref.scores, rtol=1e-5, atol=1e-6)
    assert float(ref.relative_deltas.max()) < 1e-4
    assert float(half.relative_deltas.max()) < (2e-2 if precision == "bf16" else 5e-3)
    scale = float(ref.attributions.abs().max())
    torch.testing.assert_close(half.attributions, ref.attributions, rtol=5e-2,
                               atol=(2e-2 if precision == "bf16" else 5e-3) * scale)


@pytest.mark.parametrize("layers", [["rel.weight"], ["conv", "bn0", "bn1"], ["fc"], "all"], ids=str)
def test_tracin_fp16_path_against_fp32(layers) -> None:
    from models.kg.conve import ConvE, ConvEConfig
    from models.kg.tracin import ghost_factors, ghost_kernel, resolve_layers

    torch.manual_seed(0)
    n = 15_000
    model = ConvE(ConvEConfig(num_entities=n, num_relations=20, embedding_dim=32, embedding_height=4,
                              num_filters=8)).to(CUDA).eval()
    with torch.no_grad():
        model.ent_bias.copy_(-math.log(n) + 0.5 * torch.randn(n, device=CUDA))
    for p in model.parameters():
        p.requires_grad_(False)
    q = torch.stack([torch.randint(0, n, (64,)), torch.randint(0, 40, (64,)), torch.randint(0, n, (64,))], 1)
    names = resolve_layers(model, layers)
    ref = ghost_factors(model, q, names, precision="fp32")
    half = ghost_factors(model, q, names, precision="fp16")
    k_ref, k_half = ghost_kernel(ref, ref, names), ghost_kernel(half, half, names)
    assert float((k_half - k_ref).norm() / k_ref.norm()) < 2e-3


@pytest.mark.parametrize("softmax", [False, True], ids=["linear", "softmax-sdpa"])
@pytest.mark.parametrize("sdpa", [True, False], ids=["sdpa", "no-sdpa"])
def test_bdh_training_step_under_amp(softmax: bool, sdpa: bool) -> None:
    from models.common import autocast
    from models.vision.bdh import VisionBDH
    from models.vision.config import Optimizations, VisionBDHConfig

    torch.manual_seed(0)
    config = VisionBDHConfig(n_layer=2, n_embd=64, n_head=4, mlp_multiplier=8, dropout=0.0, num_classes=10,
                             softmax_attention=softmax)
    opt = Optimizations() if sdpa else Optimizations().without("sdpa")
    model = VisionBDH(config, opt).to(CUDA)
    images = torch.randn(8, 3, 32, 32, device=CUDA)
    labels = torch.randint(0, 10, (8,), device=CUDA)

    def step(precision: str) -> tuple[float, dict]:
        model.zero_grad(set_to_none=True)
        with autocast(CUDA, precision):
            logits = model(images)
        loss = torch.nn.functional.cross_entropy(logits.float(), labels)
        loss.backward()
        return float(loss), {n: p.grad.detach().float().clone() for n, p in model.named_parameters()}

    loss32, g32 = step("fp32")
    for precision in ("bf16", "fp16"):
        loss, g = step(precision)
        assert math.isfinite(loss) and loss == pytest.approx(loss32, rel=3e-2)
        for name, grad in g.items():
            assert torch.isfinite(grad).all(), name
            cos = torch.nn.functional.cosine_similarity(grad.flatten(), g32[name].flatten(), dim=0)
            assert float(cos) > 0.95, (precision, name, float(cos))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_lora_probe_under_amp(precision: str) -> None:
    from models.lora.probe import ProbeConfig, predict, train_probe

    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 32, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    cfg = ProbeConfig(hidden_dim=64, dropout=0.0, max_epochs=30, patience=30, batch_size=64, precision=precision)
    res = train_probe(x[:300].to(CUDA), y[:300].to(CUDA), x[300:].to(CUDA), y[300:].to(CUDA), 2, cfg, seed=0,
                      device=CUDA)
    ref = train_probe(x[:300].to(CUDA), y[:300].to(CUDA), x[300:].to(CUDA), y[300:].to(CUDA), 2,
                      dataclasses.replace(cfg, precision="fp32"), seed=0, device=CUDA)
    # the task is learnable to about 0.88 from 300 samples (fp32 on the CPU and on an H100 alike; chance is 0.5):
    # the half-precision probe must learn it as well as fp32 does
    assert ref.best_val_acc >= 0.8
    assert res.best_val_acc >= ref.best_val_acc - 0.03, (res.best_val_acc, ref.best_val_acc)
    fp32 = float((predict(res.model, x[300:].to(CUDA), 64, CUDA, "fp32") == y[300:].to(CUDA)).float().mean())
    assert fp32 == pytest.approx(res.best_val_acc, abs=3 / 100 + 1e-9)  # a few logits near a tie may flip
