"""A plain ViT-Tiny-style encoder, the speed baseline for Vision-BDH (same patching, width and depth).

Patch conv → position embedding → ``n_layer`` pre-norm transformer blocks (softmax attention over ``n_head``
heads, GELU MLP of width ``mlp_ratio·D``) → LayerNorm → mean-pool → linear head. Per token and layer it does
about 2·(4D² + 2·mlp_ratio·D²) = 24D² multiply-add FLOPs in the projections at mlp_ratio 4, against
2·3·h·D·N = 6·mlp_multiplier·D² in a BDH layer, which is why BDH does several times the work per image.
"""

from __future__ import annotations

import torch
from torch import nn


class ViTTiny(nn.Module):
    def __init__(
        self,
        n_layer: int = 6,
        n_embd: int = 192,
        n_head: int = 3,
        mlp_ratio: int = 4,
        dropout: float = 0.1,
        img_size: int = 32,
        patch_size: int = 4,
        in_channels: int = 3,
        num_classes: int = 10,
    ) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(in_channels, n_embd, kernel_size=patch_size, stride=patch_size)
        self.pos_embed = nn.Parameter(torch.randn(1, (img_size // patch_size) ** 2, n_embd) * 0.02)
        layer = nn.TransformerEncoderLayer(
            n_embd, n_head, dim_feedforward=mlp_ratio * n_embd, dropout=dropout, activation="gelu",
            batch_first=True, norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x.mean(dim=1))
