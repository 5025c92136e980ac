"""Deterministic synthetic LoRA datasets (format 1) with a planted class signal, on Stable Diffusion 1.5 shapes.

SD 1.5's U-Net has 16 transformer blocks (down 0/1/2 x2, mid x1, up 1/2/3 x3) at widths 320/640/1280; each has
``attn1`` (self-attention, to_q/k/v/out all d x d) and ``attn2`` (cross-attention: to_q and to_out d x d, to_k
and to_v d x 768 from the text encoder). That is 16 x 8 = 128 adapted layers. ``width_divisor`` shrinks every
width (tests and the demo use small ones); ``max_blocks`` keeps the first blocks only.

Adapter i of class c, layer l: ``down = g_i·a_{c,l}·N(0, 1/in)``, ``up = g_i·b_{c,l}·N(0, σ_up²)`` with a
per-adapter jitter g_i = exp(0.1·ε_i) shared by all layers, and class gains a_{c,l} = exp(strength·z) (z a fixed
N(0,1) draw per class and layer) on the layers of the ``signal`` layer sets, 1 elsewhere. So the class is
readable from factor norms and spectra of the signal layers and nowhere else.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

CROSS_DIM = 768


@dataclass(frozen=True)
class LayerSpec:
    """One adapted linear layer: diffusers-style module path and (out, in) features."""

    path: str
    out_features: int
    in_features: int


def sd15_layer_specs(width_divisor: int = 1, max_blocks: int | None = None) -> list[LayerSpec]:
    """The 128 attention projections of the SD 1.5 U-Net (fewer with ``max_blocks``), widths / divisor."""
    blocks: list[tuple[str, int]] = []
    for i, width in enumerate((320, 640, 1280)):
        blocks += [(f"down_blocks.{i}.attentions.{j}.transformer_blocks.0", width) for j in range(2)]
    blocks.append(("mid_block.attentions.0.transformer_blocks.0", 1280))
    for i, width in zip((1, 2, 3), (1280, 640, 320), strict=True):
        blocks += [(f"up_blocks.{i}.attentions.{j}.transformer_blocks.0", width) for j in range(3)]
    if max_blocks is not None:
        blocks = blocks[:max_blocks]
    cross = max(1, CROSS_DIM // width_divisor)
    specs: list[LayerSpec] = []
    for prefix, width in blocks:
        d = max(1, width // width_divisor)
        for attn in ("attn1", "attn2"):
            for proj in ("to_q", "to_k", "to_v", "to_out.0"):
                in_features = cross if attn == "attn2" and proj in ("to_k", "to_v") else d
                specs.append(LayerSpec(f"unet.{prefix}.{attn}.{proj}", d, in_features))
    return specs


def factor_keys(spec: LayerSpec, naming: str) -> tuple[str, str, str | None]:
    """(down key, up key, alpha key) for a layer in ``diffusers`` or ``kohya`` naming."""
    if naming == "diffusers":
        return f"{spec.path}.lora.down.weight", f"{spec.path}.lora.up.weight", None
    if naming == "kohya":
        name = "lora_unet_" + spec.path.removeprefix("unet.").replace(".", "_")
        return f"{name}.lora_down.weight", f"{name}.lora_up.weight", f"{name}.alpha"
    raise ValueError(f"naming must be diffusers or kohya, got {naming!r}")


def _group(path: str) -> str:
    return "visual" if ".attn1." in path else "text" if ".attn2." in path else "other"


def generate_dataset(
    out_dir: str | Path,
    num_classes: int = 4,
    per_class: int = 20,
    rank: int = 1,
    signal: Sequence[str] | Mapping[str, float] = ("visual",),
    strength: float = 0.5,
    width_divisor: int = 1,
    max_blocks: int | None = None,
    naming: str = "diffusers",
    dtype: torch.dtype = torch.float16,
    up_std: float = 1e-2,
    seed: int = 0,
    progress: bool = False,
) -> Path:
    """Write ``num_classes·per_class`` adapters ``lora_00000.safetensors``... and ``labels.csv`` (format 1).

    ``signal`` lists the layer sets carrying the class signal (``visual``, ``text``, or ``all``) at
    ``strength``, or maps each to its own strength; an empty list gives a dataset with no signal (accuracy at
    chance). Same arguments, same bytes.
    """
    from safetensors.torch import save_file
    from tqdm import tqdm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specs = sd15_layer_specs(width_divisor, max_blocks)
    per_set = dict(signal) if isinstance(signal, Mapping) else {ls: strength for ls in signal}
    if "all" in per_set:
        per_set = {"visual": per_set["all"], "text": per_set["all"], "other": per_set["all"]} | {
            k: v for k, v in per_set.items() if k != "all"}
    gen = torch.Generator().manual_seed(seed)
    # Class gains per layer and factor: log-normal around 1 on signal layers.
    z = torch.randn(num_classes, len(specs), 2, generator=gen, dtype=torch.float64)
    on = torch.tensor([per_set.get(_group(s.path), 0.0) for s in specs], dtype=torch.float64)
    gains = torch.exp(z * on[None, :, None])
    n = num_classes * per_class
    rows: list[tuple[str, str]] = []
    width = max(5, len(str(n)))
    for i in tqdm(range(n), desc="synthetic LoRAs", disable=not progress, unit="lora"):
        c = i % num_classes
        g = torch.Generator().manual_seed(seed * 1_000_003 + 7919 * i + 1)
        jitter = math.exp(0.1 * float(torch.randn((), generator=g, dtype=torch.float64)))
        tensors: dict[str, torch.Tensor] = {}
        for j, spec in enumerate(specs):
            down_key, up_key, alpha_key = factor_keys(spec, naming)
            down = torch.randn(rank, spec.in_features, generator=g) / math.sqrt(spec.in_features)
            up = torch.randn(spec.out_features, rank, generator=g) * up_std
            down = down * (jitter * float(gains[c, j, 0]))
            up = up * (jitter * float(gains[c, j, 1]))
            tensors[down_key] = down.to(dtype).contiguous()
            tensors[up_key] = up.to(dtype).contiguous()
            if alpha_key is not None:
                tensors[alpha_key] = torch.tensor(float(rank), dtype=dtype)
        name = f"lora_{i:0{width}d}.safetensors"
        save_file(tensors, str(out / name), metadata={"explainq_synthetic": f"class_{c}"})  # one key: the
        # header's metadata map is written in hash order, so several keys would make the bytes non-deterministic
        rows.append((name, f"class_{c}"))
    with (out / "labels.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["file", "label"])
        writer.writerows(rows)
    return out


def to_hf_disk(src_dir: str | Path, out_dir: str | Path) -> Path:
    """Convert a format-1 directory to format 2 (``datasets`` ``save_to_disk``; one column per tensor key and a
    ``category_label`` column), as the source's datasets are laid out. Needs the optional ``datasets``."""
    import datasets
    from safetensors.torch import load_file

    from models.lora.keys import LABEL_COLUMN, read_labels_csv

    src = Path(src_dir)
    rows = read_labels_csv(src)
    columns: dict[str, list] = {}
    for f, _ in rows:
        for key, t in load_file(str(src / f)).items():
            columns.setdefault(key, []).append(t.float().numpy())
    classes = sorted({lab for _, lab in rows})
    columns[LABEL_COLUMN] = [classes.index(lab) for _, lab in rows]
    features = {k: datasets.Array2D(shape=v[0].shape, dtype="float32") if v[0].ndim == 2 else datasets.Value("float32")
                for k, v in columns.items() if k != LABEL_COLUMN}
    features[LABEL_COLUMN] = datasets.ClassLabel(names=classes)
    ds = datasets.Dataset.from_dict(columns, features=datasets.Features(features))
    ds.save_to_disk(str(out_dir))
    return Path(out_dir)
