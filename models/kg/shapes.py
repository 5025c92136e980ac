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


# The reference ConvE code's tensor names -> this project's (a state dict imported from elsewhere).
REFERENCE_PREFIXES = {"emb_e.": "ent.", "emb_rel.": "rel.", "conv1.": "conv."}
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def canonical_name(name: str) -> str:
    """This project's name for a ConvE tensor named by the reference code or a training wrapper."""
    for p in WRAPPER_PREFIXES:
        if name.startswith(p):
            name = name[len(p):]
    for old, new in REFERENCE_PREFIXES.items():
        if name.startswith(old):
            name = new + name[len(old):]
    return "ent_bias" if name == "b" else name


def expected_shapes(num_entities: int, relation_rows: int, dim: int, height: int, filters: int = 32,
                    kernel_size: int = 3) -> dict[str, tuple[int, ...]]:
    """Every ConvE tensor's shape (parameters and BatchNorm buffers) for this configuration."""
    width = dim // height
    flat = filters * (2 * height - kernel_size + 1) * (width - kernel_size + 1)
    shapes: dict[str, tuple[int, ...]] = {
        "ent.weight": (num_entities, dim), "rel.weight": (relation_rows, dim),
        "conv.weight": (filters, 1, kernel_size, kernel_size), "conv.bias": (filters,),
        "fc.weight": (dim, flat), "fc.bias": (dim,), "ent_bias": (num_entities,)}
    for bn, size in (("bn0", 1), ("bn1", filters), ("bn2", dim)):
        for t in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{bn}.{t}"] = (size,)
        shapes[f"{bn}.num_batches_tracked"] = ()
    return shapes
