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

from models.files import LOCAL, FileAccess, open_text, read_bytes

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


MAX_HEADER_BYTES = 100_000_000   # safetensors' own limit on the JSON header
MAX_JSON_DEPTH = 8               # a tensor table is {name: {dtype, shape, data_offsets}}: depth 3
MAX_TENSOR_DIMS = 8
MAX_LABEL_ROWS = 1_000_000


def _json_depth_ok(raw: bytes, limit: int) -> bool:
    """Nesting of a JSON text at most ``limit`` (counted on brackets outside strings), before parsing it: a
    100,000-deep array would exhaust the parser's recursion."""
    depth = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return False
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return True


def _check_table(table: object, shown: str) -> dict[str, dict]:
    """The header is ``{name: {"dtype": str, "shape": [int, ...], "data_offsets": [int, int]}}`` (plus
    ``__metadata__``); anything else is a DatasetFormatError naming the file and the tensor."""
    if not isinstance(table, dict):
        raise DatasetFormatError(f"{shown}: the safetensors header is not a JSON object")
    table = {k: v for k, v in table.items() if k != "__metadata__"}
    for name, info in table.items():
        if not isinstance(info, dict):
            raise DatasetFormatError(f"{shown}: tensor {name!r} is not described by an object")
        shape = info.get("shape")
        if not isinstance(shape, list) or len(shape) > MAX_TENSOR_DIMS or \
                not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise DatasetFormatError(f"{shown}: tensor {name!r} has no valid shape (a list of at most "
                                     f"{MAX_TENSOR_DIMS} non-negative integers)")
        if not isinstance(info.get("dtype"), str):
            raise DatasetFormatError(f"{shown}: tensor {name!r} has no dtype")
    return table


def read_safetensors_header(path: str | Path, files: FileAccess = LOCAL) -> dict[str, dict]:
    """The tensor table of a ``.safetensors`` file (key -> {dtype, shape, data_offsets}), read as JSON only.

    The format is an 8-byte little-endian header length followed by a JSON header. The header is bounded in size
    and nesting and checked to be a table of tensors with shapes before anyone uses it."""
    path = Path(path)
    shown = files.display(path)
    with files.open(path, "safetensors") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise DatasetFormatError(f"{shown} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER_BYTES:
            raise DatasetFormatError(f"{shown} is not a safetensors file (its header length is over "
                                     f"{MAX_HEADER_BYTES} bytes)")
        header = fh.read(length)
    if len(header) != length:
        raise DatasetFormatError(f"{shown} is not a safetensors file (the header is cut short)")
    if not _json_depth_ok(header, MAX_JSON_DEPTH):
        raise DatasetFormatError(f"{shown} has an unreadable safetensors header (nested too deep)")
    try:
        table = json.loads(header)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise DatasetFormatError(f"{shown} has an unreadable safetensors header (not JSON)") from None
    return _check_table(table, shown)


def _dataset_member(directory: Path, name: str, shown: str) -> Path:
    """A file listed in ``labels.csv``: a relative path that stays inside the dataset directory."""
    rel = Path(name)
    if not name or rel.is_absolute() or ".." in rel.parts or "\x00" in name:
        raise DatasetFormatError(f"{shown} lists {name!r}: files must be relative paths inside the dataset "
                                 "directory", field="dataset")
    return directory / rel


def read_labels_csv(directory: str | Path, files: FileAccess = LOCAL, groups: bool = False) -> list[tuple]:
    """``(file, label)`` rows of ``labels.csv`` (header ``file,label``, optionally ``group``) in a format-1 dataset
    directory; with ``groups``, ``(file, label, group)`` rows (``group`` is ``""`` where the column is absent or
    empty). Every file must be a relative path inside the directory (no absolute paths, no ``..``)."""
    directory = Path(directory)
    path = directory / LABELS_FILE
    shown = files.display(path)
    if not path.is_file():
        raise DatasetFormatError(f"missing labels file {LABELS_FILE} in the dataset directory", field="dataset")
    rows = []
    with open_text(files, path, "labels_csv") as fh:
        reader = csv.DictReader(fh)
        try:
            if reader.fieldnames is None or not {"file", "label"} <= set(reader.fieldnames):
                raise DatasetFormatError(f"{shown} must have the columns file,label")
            for row in reader:
                if not row.get("file"):
                    continue
                if len(rows) >= MAX_LABEL_ROWS:
                    raise DatasetFormatError(f"{shown} lists more than {MAX_LABEL_ROWS} files")
                name, label = row["file"].strip(), (row.get("label") or "").strip()
                _dataset_member(directory, name, shown)
                group = (row.get("group") or "").strip()
                rows.append((name, label, group) if groups else (name, label))
        except csv.Error as exc:
            raise DatasetFormatError(f"{shown}:{reader.line_num}: {exc}") from None
    if not rows:
        raise DatasetFormatError(f"{shown} lists no files")
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


def _read_json(path: Path, files: FileAccess) -> object:
    shown = files.display(path)
    raw = read_bytes(files, path, "json")
    if not _json_depth_ok(raw, 64):
        raise DatasetFormatError(f"{shown} is nested too deep")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise DatasetFormatError(f"{shown} is not JSON") from None


def hf_split_dir(directory: Path, files: FileAccess = LOCAL) -> Path:
    """The split directory of a ``save_to_disk`` DatasetDict (``train`` first), or the directory itself."""
    dd = directory / "dataset_dict.json"
    if dd.is_file():
        info = _read_json(dd, files)
        splits = info.get("splits", []) if isinstance(info, dict) else []
        if not splits or not isinstance(splits, list) or not all(isinstance(x, str) for x in splits):
            raise DatasetFormatError("dataset_dict.json lists no splits")
        split = "train" if "train" in splits else splits[0]
        _dataset_member(directory, split, files.display(dd))
        return directory / split
    return directory


def summarize_dataset(directory: str | Path, files: FileAccess = LOCAL) -> DatasetSummary:
    """Inspect a dataset directory without loading tensors (format 1: labels + first file's header;
    format 2: ``dataset_info.json`` features and ``state.json``). Every file is opened through ``files``."""
    directory = Path(directory)
    fmt = detect_format(directory)
    if fmt == "safetensors_dir":
        rows = read_labels_csv(directory, files)
        missing = [f for f, _ in rows if not (directory / f).is_file()]
        if missing:
            raise DatasetFormatError(f"{len(missing)} file(s) listed in {LABELS_FILE} are missing, e.g. {missing[0]!r}")
        layers, _ = pair_layers(read_safetensors_header(directory / rows[0][0], files).keys())
        classes = sorted({label for _, label in rows})
        num_items = len(rows)
    else:
        split_dir = hf_split_dir(directory, files)
        info_path = split_dir / "dataset_info.json"
        if not info_path.is_file():
            raise DatasetFormatError("datasets directory without dataset_info.json")
        info = _read_json(info_path, files)
        features = (info.get("features") if isinstance(info, dict) else None) or {}
        if not isinstance(features, dict) or LABEL_COLUMN not in features:
            raise DatasetFormatError(f"datasets directory without a {LABEL_COLUMN!r} column")
        layers, _ = pair_layers(features.keys())
        label_feature = features[LABEL_COLUMN]
        names = label_feature.get("names") if isinstance(label_feature, dict) else None
        classes = [str(n) for n in names] if isinstance(names, list) else []
        num_items = -1  # the row count is in the arrow files; the worker counts them
    counts = {ls: len(select_layers(layers, ls)) for ls in LAYER_SETS}
    return DatasetSummary(format=fmt, num_items=num_items, classes=classes, layers=layers, num_layers=counts)


# The names of models.lora.representations.REPRESENTATIONS, listed here so the API can validate without torch.
REPRESENTATION_NAMES = (
    "simple_stats", "rank_based", "stats", "spectral", "matrix_norms", "distribution", "frequency",
    "info_theoretic", "ensemble", "flat_vec", "spectral_delta", "delta_norms",
)
