"""Plain reference Vision-BDH, kept as the test oracle for the optimised model.

Written the way the BDH papers' code reads (pathwaycom/bdh, takzen/vision-bdh v2), with no optimisation: RoPE
phases recomputed at every layer, the rotation built with a strided ``stack``, attention written out by hand,
activations in ``[B, heads, T, N]`` layout with the shared weights broadcast over the batch.

One layer (shared weights E, E_v ``[h, D, N]``, Dec ``[h·N, D]``, ``x`` is ``[B, 1, T, D]``)::

    x_s = ReLU(x E)                                   # [B, h, T, N], sparse positive neurons
    a   = LN(RoPE(x_s) RoPE(x_s)ᵀ x)                  # bidirectional linear attention, per head
          (softmax option: LN(softmax(RoPE(x_s) RoPE(x_s)ᵀ / √N) x))
    y_s = ReLU(a E_v)                                 # [B, h, T, N]
    y   = LN((x_s ⊙ y_s) Dec)                         # heads concatenated on the neuron axis
    x   = LN(x + y)

The embedding is a ``patch_size`` conv with stride ``patch_size`` (64 tokens for 32×32 input and 4×4 patches), a
learned position embedding and a LayerNorm (as BDH normalises its token embedding). The classifier is mean-pool
(or the CLS token), LayerNorm and a linear head. All LayerNorms are parameter-free, as in BDH.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models.vision.config import VisionBDHConfig

ROPE_THETA = 2**16


def rope_frequencies(n: int, theta: float = ROPE_THETA, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """BDH's RoPE frequencies in turns per position, equal within each (2k, 2k+1) pair.

    f_i = θ^(−2⌊i/2⌋/n) / (2π), so the angle at position t is 2π·frac(t·f_i).
    """
    quantized = torch.floor(torch.arange(0, n, dtype=dtype) / 2) * 2
    return 1.0 / (theta ** (quantized / n)) / (2 * math.pi)


def rope_cos_sin(num_tokens: int, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the RoPE angles 2π·frac(t·f), ``[T, N]``."""
    phases = torch.arange(num_tokens, dtype=freqs.dtype, device=freqs.device).view(-1, 1) * freqs.view(1, -1)
    phases = (phases % 1) * (2 * math.pi)
    return torch.cos(phases), torch.sin(phases)


def rope_interleaved(v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each neuron pair (2k, 2k+1) of ``v [..., T, N]`` by its angle: v·cos + rot(v)·sin,
    rot(v)_{2k} = −v_{2k+1}, rot(v)_{2k+1} = v_{2k}."""
    v_rot = torch.stack((-v[..., 1::2], v[..., ::2]), dim=-1).view(*v.size())
    return v * cos + v_rot * sin


def init_bdh_parameters(model: nn.Module) -> None:
    """Shared initialisation of both implementations (so one seed gives the same weights in either).

    BDH's shared matrices and the position embedding: N(0, 0.02²); conv and head: Xavier-uniform, zero bias.
    """
    for name in ("encoder", "encoder_v", "decoder", "pos_embed"):
        nn.init.normal_(getattr(model, name), std=0.02)
    if getattr(model, "cls", None) is not None:
        nn.init.normal_(model.cls, std=0.02)
    for module in (model.patch_embed, model.head):
        nn.init.xavier_uniform_(module.weight)
        nn.init.zeros_(module.bias)


class BDHParameters(nn.Module):
    """The parameter set both implementations share (same names and shapes, so one state dict loads in either)."""

    def __init__(self, config: VisionBDHConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        d, h, n = c.n_embd, c.n_head, c.neurons_per_head
        self.patch_embed = nn.Conv2d(c.in_channels, d, kernel_size=c.patch_size, stride=c.patch_size)
        self.pos_embed = nn.Parameter(torch.empty(1, c.num_tokens, d))
        self.cls = nn.Parameter(torch.empty(1, 1, d)) if c.cls_token else None
        self.encoder = nn.Parameter(torch.empty(h, d, n))
        self.encoder_v = nn.Parameter(torch.empty(h, d, n))
        self.decoder = nn.Parameter(torch.empty(h * n, d))
        self.head = nn.Linear(d, c.num_classes)
        self.drop = nn.Dropout(c.dropout)
        init_bdh_parameters(self)

    def ln(self, x: torch.Tensor) -> torch.Tensor:
        """Parameter-free LayerNorm over the embedding axis."""
        return F.layer_norm(x, (x.shape[-1],))

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Patch conv, CLS token, position embedding and LayerNorm: ``[B, C, H, W] -> [B, T, D]``."""
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        if self.cls is not None:
            x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), dim=1)
        return self.ln(x + self.pos_embed)

    def classify(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, D]`` tokens to logits: CLS token or mean-pool, LayerNorm, linear head."""
        pooled = x[:, 0] if self.cls is not None else x.mean(dim=1)
        return self.head(self.ln(pooled))


class ReferenceVisionBDH(BDHParameters):
    """Plain, unoptimised Vision-BDH (see the module docstring for the maths)."""

    def __init__(self, config: VisionBDHConfig) -> None:
        super().__init__(config)
        # A plain tensor attribute, not a buffer: the state dict holds parameters only, as in the fast model.
        self.freqs = rope_frequencies(config.neurons_per_head)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        c = self.config
        b = images.shape[0]
        h, n = c.n_head, c.neurons_per_head
        x = self.embed(images).unsqueeze(1)  # [B, 1, T, D]
        t = x.shape[2]
        for _ in range(c.n_layer):
            x_s = F.relu(x @ self.encoder)  # [B, h, T, N]
            cos, sin = rope_cos_sin(t, self.freqs.to(x.device))  # recomputed every layer on purpose
            qr = rope_interleaved(x_s, cos, sin)
            scores = qr @ qr.transpose(-1, -2)  # [B, h, T, T]
            if c.softmax_attention:
                scores = torch.softmax(scores / math.sqrt(n), dim=-1)
            a = self.ln(scores @ x)  # [B, h, T, D]
            y_s = F.relu(a @ self.encoder_v)  # [B, h, T, N]
            xy = self.drop(x_s * y_s)
            y = self.ln(xy.transpose(1, 2).reshape(b, 1, t, h * n) @ self.decoder)  # [B, 1, T, D]
            x = self.ln(x + y)
        return self.classify(x.squeeze(1))
