"""Torch-free ConvE facts shared with the API layer (request validation must not import torch)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

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


# PyKEEN's ConvE (``pykeen.models.ConvE``, ``pykeen.nn.modules.ConvEInteraction``) -> this project's names. With
# batch normalisation (PyKEEN's default) ``interaction.hr2d`` is [BN0, Dropout, Conv2d, BN1, ReLU, Dropout2d] and
# ``interaction.hr1d`` is [Linear, Dropout, BN1d, ReLU]; in eval mode that is this project's forward (the order of
# BN0 and the input dropout only matters in training). The entity bias is a [N, 1] table, here a [N] vector; the
# relation rows are interleaved (forward 2r, inverse 2r+1), here forward r and inverse r + R
# (:func:`models.kg.importer.from_pykeen` reorders them).
PYKEEN_PREFIXES = {"entity_representations.0._embeddings.": "ent.", "relation_representations.0._embeddings.": "rel.",
                   "interaction.hr2d.0.": "bn0.", "interaction.hr2d.2.": "conv.", "interaction.hr2d.3.": "bn1.",
                   "interaction.hr1d.0.": "fc.", "interaction.hr1d.2.": "bn2."}
PYKEEN_BIAS = "entity_representations.1._embeddings.weight"
PYKEEN_MARKERS = ("entity_representations.", "relation_representations.", "interaction.")
PYKEEN_EXPORT = 'torch.save(model.state_dict(), "model.pt")'


def is_pykeen(names: Iterable[str]) -> bool:
    """Whether a state dict's tensor names are PyKEEN's (a ``pykeen.models.ERModel``)."""
    return any(n.startswith(PYKEEN_MARKERS) for n in names)


def pykeen_problem(shapes: Mapping[str, Sequence[int]]) -> str | None:
    """Why a PyKEEN state dict cannot be this project's ConvE (from names and shapes only), or None."""
    names = set(shapes)
    if any(n.startswith(("entity_representations.2", "relation_representations.1")) for n in names):
        return "the PyKEEN model has more representations than ConvE's (entity, entity bias, relation): not a ConvE"
    conv = shapes.get("interaction.hr2d.2.weight")
    if conv is None or len(conv) != 4:
        if len(shapes.get("interaction.hr2d.1.weight", ())) == 4 or len(shapes.get("interaction.hr2d.0.weight", ())) == 4:
            return ("the PyKEEN ConvE was trained with apply_batch_normalization=False; this project's ConvE always "
                    "has its three batch norms, so it cannot reproduce that model")
        return "no PyKEEN ConvE convolution (interaction.hr2d.2.weight): not a PyKEEN ConvE state dict"
    if conv[1] != 1:
        return f"the PyKEEN ConvE has input_channels={conv[1]}; this project's ConvE stacks one channel"
    if conv[2] != conv[3]:
        return f"the PyKEEN ConvE has a {conv[2]}x{conv[3]} kernel; this project's ConvE needs a square kernel"
    bias = shapes.get(PYKEEN_BIAS)
    if bias is None or len(bias) != 2 or bias[1] != 1:
        return f"no PyKEEN ConvE entity bias ({PYKEEN_BIAS} [N, 1])"
    unknown = sorted(n for n in names if n != PYKEEN_BIAS and not n.startswith(tuple(PYKEEN_PREFIXES)))
    if unknown:
        return f"tensors a PyKEEN ConvE does not have: {', '.join(unknown[:5])}"
    return None


def pykeen_shapes(shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """This project's names and shapes for a PyKEEN ConvE's (the bias [N, 1] becomes [N])."""
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        if name == PYKEEN_BIAS:
            out["ent_bias"] = tuple(shape[:1])
            continue
        for old, new in PYKEEN_PREFIXES.items():
            if name.startswith(old):
                name = new + name[len(old):]
                break
        out[name] = tuple(shape)
    return out


def infer_height(dim: int, fc_in: int, filters: int, kernel_size: int) -> list[int]:
    """The image heights H (H·W = dim) for which the fc layer's input size is ``fc_in``."""
    return [h for h in range(1, dim + 1) if dim % h == 0 and dim // h >= kernel_size and 2 * h >= kernel_size
            and filters * (2 * h - kernel_size + 1) * (dim // h - kernel_size + 1) == fc_in]
