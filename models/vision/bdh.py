"""Optimised Vision-BDH: the same function as :mod:`models.vision.reference`, computed faster.

Each optimisation is a switch in :class:`models.vision.config.Optimizations` and is checked against the reference
in ``tests/test_bdh_model.py`` (outputs and gradients, fp32, softmax on and off, every switch off in turn).

- **RoPE cache.** cos/sin of the angles 2π·frac(t·f) are ``[T, N]`` constants of the architecture: they are
  non-persistent buffers computed once (``rope_cache``), so the state dict is the reference's.
- **Head-major activations.** With ``x`` ``[M = B·T, D]`` the encoders are one ``bmm`` each,
  ``[h, M, D] @ [h, D, N] -> [h, M, N]`` (``head_major``), and the decoder is Σ_h (x_s⊙y_s)_h Dec_h, one ``bmm``
  ``[h, M, N] @ [h, N, D]`` and a sum over the heads. The reference broadcasts the shared ``[h, D, N]`` weights over
  the batch (autograd then reduces B weight-sized gradients) and copies ``[B, h, T, N]`` into ``[B, T, h·N]`` before
  the decoder.
- **RoPE pair layout.** BDH's frequencies are equal within each neuron pair (2k, 2k+1) and the rotation mixes only
  the two members of a pair. Reading the neuron axis through the fixed permutation P = (0, 2, 4, …, 1, 3, 5, …)
  (``rope_pair_layout``) makes the pair members the two contiguous halves a, b of the axis, so
  RoPE(v) = [a·c − b·s, b·c + a·s] without a strided ``stack``. The permutation is applied to the columns of E and
  E_v and to the rows of Dec, which leaves the layer's function unchanged: x_s ⊙ y_s is permuted consistently and
  the decoder sums over the permuted axis. Attention is invariant to the order of the neurons it sums over.
- **SDPA.** Softmax attention goes through ``scaled_dot_product_attention`` with scale 1/√N (``sdpa``).

Dropout masks are drawn in a different layout than the reference's, so the two agree exactly in eval mode or with
``dropout=0``; the distributions are the same.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from models.vision.config import Optimizations, VisionBDHConfig
from models.vision.reference import BDHParameters, rope_cos_sin, rope_frequencies, rope_interleaved


def pair_permutation(n: int) -> torch.Tensor:
    """P = (0, 2, 4, …, n−2, 1, 3, …, n−1): first members of RoPE pairs, then the second members."""
    return torch.cat((torch.arange(0, n, 2), torch.arange(1, n, 2)))


def _rotate_halves(v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool) -> torch.Tensor:
    """[a | b] -> [a·c ∓ b·s | b·c ± a·s] written straight into one output (no slices kept for autograd)."""
    half = v.shape[-1] // 2
    a, b = v[..., :half], v[..., half:]
    out = torch.empty(v.shape, dtype=torch.result_type(v, cos), device=v.device)
    out_a, out_b = out[..., :half], out[..., half:]
    torch.mul(a, cos, out=out_a)
    out_a.addcmul_(b, sin, value=1.0 if inverse else -1.0)
    torch.mul(b, cos, out=out_b)
    out_b.addcmul_(a, sin, value=-1.0 if inverse else 1.0)
    return out


class _RopeHalves(torch.autograd.Function):
    """RoPE in pair layout with a hand-written backward.

    Per pair the map is the rotation R(θ) = [[c, −s], [s, c]], so the vector-Jacobian product is the inverse
    rotation Rᵀ g = [c·g_a + s·g_b, −s·g_a + c·g_b]. Only cos/sin are saved, not the activations.
    """

    @staticmethod
    def forward(ctx, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(cos, sin)
        return _rotate_halves(v, cos, sin, inverse=False)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # noqa: ANN001
        cos, sin = ctx.saved_tensors
        return _rotate_halves(grad, cos, sin, inverse=True), None, None


def rope_halves(v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in pair layout: ``v = [a | b]`` with pair k = (a_k, b_k); ``cos``/``sin`` are ``[T, N/2]``.

    Returns [a·cos − b·sin | b·cos + a·sin], the reference rotation read through the pair permutation.
    """
    if cos.requires_grad or sin.requires_grad:
        half = v.shape[-1] // 2
        a, b = v[..., :half], v[..., half:]
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    return _RopeHalves.apply(v, cos, sin)


DROPOUT_LEVELS = 2**15  # int16 random_() draws uniformly from [0, 2^15)


def dropout_threshold(p: float) -> tuple[int, float]:
    """Integer threshold t with P(r < t) = t / 2^15 ≈ p for r uniform on [0, 2^15), and that exact probability."""
    t = int(round(p * DROPOUT_LEVELS))
    return t, t / DROPOUT_LEVELS


class _GatedDropout(torch.autograd.Function):
    """x_s ⊙ y_s with the dropped entries zeroed, in one output pass (the 1/(1 − p) rescale is left to the caller).

    Backward: with g' = g ⊙ keep, ∂/∂x_s = g' ⊙ y_s and ∂/∂y_s = g' ⊙ x_s.
    """

    @staticmethod
    def forward(ctx, x_s: torch.Tensor, y_s: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(x_s, y_s, drop)
        return torch.mul(x_s, y_s).masked_fill_(drop, 0.0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:  # noqa: ANN001
        x_s, y_s, drop = ctx.saved_tensors
        grad = grad.masked_fill(drop, 0.0)
        return grad * y_s, grad * x_s, None


def gated_dropout(x_s: torch.Tensor, y_s: torch.Tensor, p: float) -> tuple[torch.Tensor, float]:
    """Dropout of the gated product without a float Bernoulli draw: returns (x_s ⊙ y_s ⊙ keep, 1/(1 − p')).

    ``bernoulli_`` on CPU is several times slower than drawing int16 words and comparing them with a threshold;
    the drop probability becomes p' = round(p·2^15)/2^15 (0.1 → 0.100006) and the rescale uses p' exactly, so the
    expectation is unchanged. Since the rescale is a scalar, the caller applies it after the decoder matmul, on a
    tensor h·N/D times smaller.
    """
    threshold, p_eff = dropout_threshold(p)
    if threshold == 0:
        return x_s * y_s, 1.0
    drop = torch.empty(x_s.shape, dtype=torch.int16, device=x_s.device).random_() < threshold
    return _GatedDropout.apply(x_s, y_s, drop), 1.0 / (1.0 - p_eff)


def to_pair_layout(w: torch.Tensor, dim: int) -> torch.Tensor:
    """Read axis ``dim`` (even length) through P = (0, 2, …, 1, 3, …): a reshape-transpose copy, not a gather."""
    dim = dim % w.ndim
    n = w.shape[dim]
    return w.unflatten(dim, (n // 2, 2)).transpose(dim, dim + 1).flatten(dim, dim + 1)


class VisionBDH(BDHParameters):
    """Vision-BDH image classifier with switchable optimisations (all on by default)."""

    def __init__(self, config: VisionBDHConfig, optimizations: Optimizations | None = None) -> None:
        super().__init__(config)
        self.opt = optimizations or Optimizations()
        n = config.neurons_per_head
        self.freqs = rope_frequencies(n)  # plain attribute, for the uncached path
        if self.opt.rope_cache:
            cos, sin = rope_cos_sin(config.num_tokens, self.freqs)
            if self.opt.rope_pair_layout:
                cos, sin = cos[:, ::2].contiguous(), sin[:, ::2].contiguous()
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    # -- pieces ---------------------------------------------------------------------------------------------------

    def _cos_sin(self, t: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self.opt.rope_cache:
            if t != self.rope_cos.shape[0]:
                raise ValueError(f"the model was built for {self.rope_cos.shape[0]} tokens, got {t}")
            return self.rope_cos, self.rope_sin
        cos, sin = rope_cos_sin(t, self.freqs.to(device))
        if self.opt.rope_pair_layout:
            cos, sin = cos[:, ::2], sin[:, ::2]
        return cos, sin

    def _rope(self, v: torch.Tensor) -> torch.Tensor:
        cos, sin = self._cos_sin(v.shape[-2], v.device)
        if self.opt.rope_pair_layout:
            return rope_halves(v, cos, sin)
        return rope_interleaved(v, cos, sin)

    def _attention(self, x_s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Bidirectional attention of ``x_s [..., T, N]`` (Q = K = RoPE(x_s)) over values ``v [..., T, D]``."""
        qr = self._rope(x_s)
        n = qr.shape[-1]
        if self.config.softmax_attention:
            if self.opt.sdpa:
                v = v.expand(*qr.shape[:-1], v.shape[-1])
                return F.scaled_dot_product_attention(qr, qr, v, scale=1.0 / math.sqrt(n))
            return torch.softmax((qr @ qr.transpose(-1, -2)) / math.sqrt(n), dim=-1) @ v
        # (QR QRᵀ) V costs T²(N + D) per head against 2TND for QR (QRᵀ V): for T=64, N=1024, D=192, 5x less.
        return (qr @ qr.transpose(-1, -2)) @ v

    def _weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """E, E_v ``[h, D, N]`` and Dec ``[h, N, D]``, read through the pair permutation when it is on."""
        c = self.config
        dec = self.decoder.view(c.n_head, c.neurons_per_head, c.n_embd)
        if not self.opt.rope_pair_layout:
            return self.encoder, self.encoder_v, dec
        return to_pair_layout(self.encoder, 2), to_pair_layout(self.encoder_v, 2), to_pair_layout(dec, 1)

    def _gate(self, x_s: torch.Tensor, y_s: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Dropout(x_s ⊙ y_s) as (tensor, scalar rescale to apply after the decoder)."""
        p = self.config.dropout
        if not self.training or p == 0.0:
            return x_s * y_s, 1.0
        if self.opt.fast_dropout:
            return gated_dropout(x_s, y_s, p)
        return self.drop(x_s * y_s), 1.0

    # -- forward --------------------------------------------------------------------------------------------------

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(images)  # [B, T, D]
        if self.opt.head_major:
            x = self._core_head_major(x)
        else:
            x = self._core_batch_major(x)
        return self.classify(x)

    def _core_head_major(self, x: torch.Tensor) -> torch.Tensor:
        c = self.config
        b, t, d = x.shape
        h, n, m = c.n_head, c.neurons_per_head, b * t
        enc, enc_v, dec = self._weights()
        x = x.reshape(m, d)
        for _ in range(c.n_layer):
            # One bmm over the heads; the expanded x is read in place (batch stride 0), not copied per head.
            x_s = F.relu(torch.bmm(x.expand(h, m, d), enc))  # [h, M, N]
            a = self._attention(x_s.view(h, b, t, n), x.view(1, b, t, d))  # [h, B, T, D]
            a = self.ln(a).view(h, m, d)
            y_s = F.relu(torch.bmm(a, enc_v))  # [h, M, N]
            xy, scale = self._gate(x_s, y_s)
            y = torch.bmm(xy, dec).sum(0)  # Σ_h (x_s ⊙ y_s)_h Dec_h: [M, D]
            y = self.ln(y * scale if scale != 1.0 else y)
            x = self.ln(x + y)
        return x.view(b, t, d)

    def _core_batch_major(self, x: torch.Tensor) -> torch.Tensor:
        c = self.config
        b, t, d = x.shape
        h, n = c.n_head, c.neurons_per_head
        enc, enc_v, dec = self._weights()
        dec = dec.reshape(h * n, d)
        x = x.unsqueeze(1)  # [B, 1, T, D]
        for _ in range(c.n_layer):
            x_s = F.relu(x @ enc)  # [B, h, T, N]
            a = self.ln(self._attention(x_s, x))
            y_s = F.relu(a @ enc_v)
            xy, scale = self._gate(x_s, y_s)
            y = xy.transpose(1, 2).reshape(b, 1, t, h * n) @ dec
            y = self.ln(y * scale if scale != 1.0 else y)
            x = self.ln(x + y)
        return x.squeeze(1)
