"""Configuration of Vision-BDH and of the switchable optimisations of the fast model."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class VisionBDHConfig:
    """Hyper-parameters of a Vision-BDH classifier.

    The BDH core has one set of shared weights applied ``n_layer`` times: the encoder E and the value encoder
    E_v, both ``[n_head, n_embd, N]``, and the decoder Dec, ``[n_head * N, n_embd]``, where the per-head neuron
    count is N = mlp_multiplier * n_embd / n_head.
    """

    n_layer: int = 6
    n_embd: int = 192
    n_head: int = 6
    mlp_multiplier: int = 32
    dropout: float = 0.1
    softmax_attention: bool = False
    cls_token: bool = False
    img_size: int = 32
    patch_size: int = 4
    in_channels: int = 3
    num_classes: int = 10

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if (self.mlp_multiplier * self.n_embd) % self.n_head:
            raise ValueError("mlp_multiplier * n_embd must be divisible by n_head")
        if self.neurons_per_head % 2:
            raise ValueError(f"RoPE needs an even neuron count per head, got N={self.neurons_per_head}")
        if self.img_size % self.patch_size:
            raise ValueError(f"img_size ({self.img_size}) must be a multiple of patch_size ({self.patch_size})")
        for name in ("n_layer", "n_embd", "n_head", "mlp_multiplier", "num_classes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def neurons_per_head(self) -> int:
        """N = mlp_multiplier * n_embd / n_head."""
        return self.mlp_multiplier * self.n_embd // self.n_head

    @property
    def num_patches(self) -> int:
        return (self.img_size // self.patch_size) ** 2

    @property
    def num_tokens(self) -> int:
        """Patches plus the CLS token when enabled."""
        return self.num_patches + int(self.cls_token)

    def expected_parameters(self) -> int:
        """Closed-form parameter count.

        patch conv C·p²·D + D, position embedding T·D, CLS token D (optional), BDH core
        E + E_v + Dec = 3·h·D·N = 3·mlp_multiplier·D², head D·K + K. The LayerNorms have no parameters.
        """
        d = self.n_embd
        conv = self.in_channels * self.patch_size**2 * d + d
        pos = self.num_tokens * d
        cls = d if self.cls_token else 0
        core = 3 * self.n_head * d * self.neurons_per_head
        head = d * self.num_classes + self.num_classes
        return conv + pos + cls + core + head

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VisionBDHConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Optimizations:
    """Switches for the optimisations of :class:`models.vision.bdh.VisionBDH`; all on by default.

    - ``rope_cache``: RoPE cos/sin computed once at construction as (non-persistent) buffers instead of every
      forward pass.
    - ``head_major``: activations kept head-major ``[heads, B*T, N]`` so each projection is one batched matmul
      (``bmm``) over the heads, with no broadcast expansion of the shared weights over the batch and no
      transpose/reshape copy before the decoder.
    - ``rope_pair_layout``: the neuron axis is read through a fixed permutation that puts the first element of
      every RoPE pair in the first half and the second element in the second half, so the rotation is two
      contiguous half-width fused multiply-adds instead of a strided stack.
    - ``fast_dropout``: the dropout mask on x_s ⊙ y_s comes from int16 draws compared with a threshold and is
      applied in the same pass as the product (the drop probability is p rounded to a multiple of 2⁻¹⁵), instead
      of a float ``bernoulli_`` draw and two more passes.
    - ``sdpa``: softmax attention through ``torch.nn.functional.scaled_dot_product_attention`` (only used when
      ``softmax_attention`` is on; linear attention has no softmax to fuse).
    """

    rope_cache: bool = True
    head_major: bool = True
    rope_pair_layout: bool = True
    fast_dropout: bool = True
    sdpa: bool = True

    @classmethod
    def none(cls) -> Optimizations:
        return cls(**{name: False for name in cls.names()})

    def without(self, name: str) -> Optimizations:
        return dataclasses.replace(self, **{name: False})

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]
