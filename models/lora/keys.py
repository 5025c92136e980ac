"""LoRA tensor-key parsing, layer sets and header-only dataset inspection. Pure Python: no torch.

A LoRA stores, per adapted linear layer W (out x in), two factors ``down`` (r x in) and ``up`` (out x r), so
that the weight update is ΔW = scale · up · down with scale = alpha / r when an ``alpha`` is stored (kohya) and
1 otherwise (diffusers). Key spellings accepted:

- diffusers (attention processors): ``<layer>.lora.down.weight`` / ``<layer>.lora.up.weight`` and
  ``<layer>_lora.down.weight`` (``...attn1.processor.to_q_lora.down.weight``);
- diffusers / peft: ``<layer>.lora_A.weight`` (down) / ``<layer>.lora_B.weight`` (up);
- kohya: ``<layer>.lora_down.weight`` / ``<layer>.lora_up.weight`` (+ optional ``<layer>.alpha``).

Layer sets (Stable Diffusion U-Net): ``visual`` = layers whose name has the token ``attn1`` (image
self-attention), ``text`` = token ``attn2`` (cross-attention on the text encoding), ``all`` = every LoRA layer.
"""

from __future__ import annotations

import csv
import json
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

LAYER_SETS = ("all", "visual", "text")
LABEL_COLUMN = "category_label"
LABELS_FILE = "labels.csv"

_FACTOR_RE = re.compile(
    r"^(?P<layer>.+?)(?:[._]lora[._](?P<du>down|up)|\.lora_(?P<ab>A|B))\.weight$"
)
_ATTN1_RE = re.compile(r"(?:^|[._])attn1(?:[._]|$)")
_ATTN2_RE = re.compile(r"(?:^|[._])attn2(?:[._]|$)")


class DatasetFormatError(ValueError):
    """The dataset on disk does not have the expected layout. ``field`` names what is wrong."""

    def __init__(self, message: str, field: str = "dataset") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class LayerKeys:
    """The tensor keys of one adapted layer."""

    name: str
    down: str
    up: str
    alpha: str | None = None

    @property
    def group(self) -> str:
        """``visual`` (attn1), ``text`` (attn2) or ``other``."""
        return layer_group(self.name)


def layer_group(name: str) -> str:
    if _ATTN1_RE.search(name):
        return "visual"
    if _ATTN2_RE.search(name):
        return "text"
    return "other"


def parse_factor_key(key: str) -> tuple[str, str] | None:
    """``(layer, "down"|"up")`` for a LoRA factor key, else None."""
    m = _FACTOR_RE.match(key)
    if m is None:
        return None
    if m.group("du"):
        return m.group("layer"), m.group("du")
    return m.group("layer"), "down" if m.group("ab") == "A" else "up"


def pair_layers(keys: Iterable[str]) -> tuple[list[LayerKeys], list[str]]:
    """Match down/up factor keys per layer.

    Returns the layers (sorted by name) that have both factors, and the factor keys left without a partner.
    """
    keys = list(keys)
    key_set = set(keys)
    found: dict[str, dict[str, str]] = {}
    for key in keys:
        parsed = parse_factor_key(key)
        if parsed is None:
            continue
        layer, which = parsed
        slot = found.setdefault(layer, {})
        if which in slot:
            raise DatasetFormatError(f"layer {layer!r} has two {which} factors: {slot[which]!r} and {key!r}")
        slot[which] = key
    layers: list[LayerKeys] = []
    unpaired: list[str] = []
    for name in sorted(found):
        slot = found[name]
        if "down" in slot and "up" in slot:
            alpha = f"{name}.alpha" if f"{name}.alpha" in key_set else None
            layers.append(LayerKeys(name=name, down=slot["down"], up=slot["up"], alpha=alpha))
        else:
            unpaired.extend(slot.values())
    return layers, unpaired


def select_layers(layers: Sequence[LayerKeys], layer_set: str) -> list[LayerKeys]:
    """The layers of one layer set (``all``, ``visual`` or ``text``)."""
    if layer_set not in LAYER_SETS:
        raise ValueError(f"unknown layer set {layer_set!r}; expected one of {LAYER_SETS}")
    if layer_set == "all":
        return list(layers)
    return [layer for layer in layers if layer.group == layer_set]


def read_safetensors_header(path: str | Path) -> dict[str, dict]:
    """The tensor table of a ``.safetensors`` file (key -> {dtype, shape, data_offsets}), read as JSON only.

    The format is an 8-byte little-endian header length followed by a JSON header.
    """
    path = Path(path)
    with path.open("rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise DatasetFormatError(f"{path.name} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", raw)
        if length > 100_000_000:
            raise DatasetFormatError(f"{path.name} is not a safetensors file (header length {length})")
        header = fh.read(length)
    try:
        table = json.loads(header)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetFormatError(f"{path.name} has an unreadable safetensors header: {exc}") from exc
    table.pop("__metadata__", None)
    return table


def read_labels_csv(directory: str | Path) -> list[tuple[str, str]]:
    """``(file, label)`` rows of ``labels.csv`` (header ``file,label``) in a format-1 dataset directory."""
    path = Path(directory) / LABELS_FILE
    if not path.is_file():
        raise DatasetFormatError(f"missing labels file {LABELS_FILE} in the dataset directory", field="dataset")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None or not {"file", "label"} <= set(reader.fieldnames):
            raise DatasetFormatError(f"{LABELS_FILE} must have the columns file,label")
        rows = [(row["file"].strip(), row["label"].strip()) for row in reader if row.get("file")]
    if not rows:
        raise DatasetFormatError(f"{LABELS_FILE} lists no files")
    return rows


@dataclass
class DatasetSummary:
    """What a header-only look at a dataset directory finds."""

    format: str  # "safetensors_dir" | "hf_disk"
    num_items: int
    classes: list[str]
    layers: list[LayerKeys]
    num_layers: dict[str, int] = field(default_factory=dict)


def detect_format(directory: str | Path) -> str:
    directory = Path(directory)
    if (directory / LABELS_FILE).is_file():
        return "safetensors_dir"
    if (directory / "dataset_info.json").is_file() or (directory / "dataset_dict.json").is_file():
        return "hf_disk"
    if any(directory.glob("*.safetensors")):
        raise DatasetFormatError(f"missing labels file {LABELS_FILE} in the dataset directory")
    raise DatasetFormatError(
        f"not a LoRA dataset: expected {LABELS_FILE} with .safetensors files, or a datasets save_to_disk directory"
    )


def hf_split_dir(directory: Path) -> Path:
    """The split directory of a ``save_to_disk`` DatasetDict (``train`` first), or the directory itself."""
    dd = directory / "dataset_dict.json"
    if dd.is_file():
        splits = json.loads(dd.read_text()).get("splits", [])
        if not splits:
            raise DatasetFormatError("dataset_dict.json lists no splits")
        split = "train" if "train" in splits else splits[0]
        return directory / split
    return directory


def summarize_dataset(directory: str | Path) -> DatasetSummary:
    """Inspect a dataset directory without loading tensors (format 1: labels + first file's header;
    format 2: ``dataset_info.json`` features and ``state.json``)."""
    directory = Path(directory)
    fmt = detect_format(directory)
    if fmt == "safetensors_dir":
        rows = read_labels_csv(directory)
        first = directory / rows[0][0]
        missing = [f for f, _ in rows if not (directory / f).is_file()]
        if missing:
            raise DatasetFormatError(f"{len(missing)} file(s) listed in {LABELS_FILE} are missing, e.g. {missing[0]!r}")
        layers, _ = pair_layers(read_safetensors_header(first).keys())
        classes = sorted({label for _, label in rows})
        num_items = len(rows)
    else:
        split_dir = hf_split_dir(directory)
        info_path = split_dir / "dataset_info.json"
        if not info_path.is_file():
            raise DatasetFormatError("datasets directory without dataset_info.json")
        features = json.loads(info_path.read_text()).get("features") or {}
        if LABEL_COLUMN not in features:
            raise DatasetFormatError(f"datasets directory without a {LABEL_COLUMN!r} column")
        layers, _ = pair_layers(features.keys())
        label_feature = features[LABEL_COLUMN]
        classes = list(label_feature.get("names") or [])
        num_items = -1  # the row count is in the arrow files; the worker counts them
    counts = {ls: len(select_layers(layers, ls)) for ls in LAYER_SETS}
    return DatasetSummary(format=fmt, num_items=num_items, classes=classes, layers=layers, num_layers=counts)

# The names of models.lora.representations.REPRESENTATIONS, listed here so the API can validate without torch.
REPRESENTATION_NAMES = (
    "simple_stats", "rank_based", "stats", "spectral", "matrix_norms", "distribution", "frequency",
    "info_theoretic", "ensemble", "flat_vec", "spectral_delta", "delta_norms",
)
