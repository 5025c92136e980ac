"""Torch-free ConvE facts shared with the API layer (request validation must not import torch)."""

from __future__ import annotations

# ConvE parameter names, in ``named_parameters()`` order; TracIn ``layers`` may name these or their modules.
PARAMETER_NAMES = ("ent.weight", "rel.weight", "bn0.weight", "bn0.bias", "conv.weight", "conv.bias", "bn1.weight",
                   "bn1.bias", "fc.weight", "fc.bias", "bn2.weight", "bn2.bias", "ent_bias")
OUTPUT_TABLE = "ent.weight:output"  # the entity table in its output role only (x·Eᵀ)
MODULE_NAMES = ("ent", "rel", "bn0", "conv", "bn1", "fc", "bn2")
LAYER_NAMES = PARAMETER_NAMES + (OUTPUT_TABLE,) + MODULE_NAMES


def default_height(dim: int) -> int:
    """The ConvE image height for ``dim``: 10 for 200 (10×20), else the divisor closest to √(dim/2) with width >= 3."""
    if dim % 10 == 0 and dim // 10 >= 10:
        return 10
    target = (dim / 2) ** 0.5
    divisors = [h for h in range(2, dim + 1) if dim % h == 0 and dim // h >= 3]
    if not divisors:
        raise ValueError(f"embedding_dim {dim} cannot be reshaped to an image of width >= 3")
    return min(divisors, key=lambda h: abs(h - target))


def check_image(dim: int, height: int | None, kernel_size: int = 3) -> str | None:
    """Why ``dim`` cannot be reshaped to ``height × dim/height`` for a ``kernel_size`` convolution, or None."""
    try:
        h = height if height is not None else default_height(dim)
    except ValueError as exc:
        return str(exc)
    if h < 1 or dim % h:
        return f"embedding_dim {dim} is not a multiple of embedding_height {h}"
    if dim // h < kernel_size or 2 * h < kernel_size:
        return f"a {h}x{dim // h} embedding image is smaller than the {kernel_size}x{kernel_size} kernel"
    return None
