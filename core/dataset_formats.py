"""Dataset formats, detected and validated without torch (the API side of ``POST /datasets``).

``detect(path)`` looks at a directory under the data roots and answers which format it holds, the registry kind
the jobs use for it, and its counts:

- ``mind`` (kind ``news``): ``{train,valid,test}/news.tsv`` + ``behaviors.tsv``, or one split directory;
- ``pairwise_csv`` (kind ``news``): ``pairs_{train,valid,test}.csv`` with the pairwise columns;
- ``triples`` (kind ``triples``): ``train.txt`` (+ ``valid.txt``, ``test.txt``), ``head<TAB>relation<TAB>tail``;
- ``lora_safetensors`` / ``hf_save_to_disk`` (kind ``lora``): ``*.safetensors`` + ``labels.csv``, or a
  ``datasets`` ``save_to_disk`` directory;
- ``cifar10`` / ``cifar100`` (kind ``image_classification``): the official python batches;
- ``tensors`` (kind ``tensor_classification``): ``train.safetensors`` (+ ``valid.safetensors``,
  ``test.safetensors``), each with ``inputs`` (``[N, ...]``, floating point) and ``labels`` (``[N]``, integer class
  indices): the training data of an exported classifier (``POST /train/classifier``); only the headers are read;
- ``text_csv`` / ``text_jsonl`` (kind ``text_classification``): ``train.csv`` (+ ``valid``, ``test``) with the
  columns ``text`` and ``label``, or the same as JSON lines (``models.textdata``): the training data of a Hugging
  Face classifier (``POST /train/classifier``).

Files are streamed line by line (a MIND-large ``behaviors.tsv`` is about 2 GB), never loaded whole.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.userfiles import UserFileError, UserFiles, check_tree
from models.files import LOCAL, FileAccess, open_text
from models.kg.tsv import TriplesFormatError, read_triples
from models.textdata import FORMATS as TEXT_FORMATS
from models.textdata import TextDataError
from models.textdata import split_files as text_split_files
from models.textdata import summarize as summarize_text

if TYPE_CHECKING:
    from core.settings import Settings

SPLITS = ("train", "valid", "test")
PAIR_REQUIRED = ("user_id", "history_titles", "candidate_id", "candidate_title")
_LABELLED_TOKEN = re.compile(r"^.+-[01]$")


class FormatError(ValueError):
    """The directory holds no known dataset format, or a file in it is malformed (the message says which)."""


def _count_lines(files: FileAccess, path: Path, fmt: str) -> int:
    n = 0
    last = b"\n"
    with files.open(path, fmt) as fh:
        while chunk := fh.read(1 << 22):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def _first_lines(files: FileAccess, path: Path, fmt: str, n: int = 5) -> list[str]:
    out = []
    with open_text(files, path, fmt) as fh:
        for line in fh:
            if line.strip():
                out.append(line.rstrip("\r\n"))
            if len(out) >= n:
                break
    return out


def _mind_split(files: FileAccess, split_dir: Path) -> dict[str, Any]:
    news, behaviors = split_dir / "news.tsv", split_dir / "behaviors.tsv"
    for i, line in enumerate(_first_lines(files, news, "mind"), 1):
        if len(line.split("\t")) < 4:
            raise FormatError(f"{files.display(news)}:{i}: expected at least 4 tab-separated columns "
                              "(news_id, category, subcategory, title, ...)")
    lines = _first_lines(files, behaviors, "mind")
    clicks_labelled = None
    for i, line in enumerate(lines, 1):
        parts = line.split("\t")
        if len(parts) != 5:
            raise FormatError(f"{files.display(behaviors)}:{i}: expected 5 tab-separated columns "
                              f"(impression_id, user_id, time, history, impressions), got {len(parts)}")
        tokens = parts[4].split()
        if tokens:
            clicks_labelled = all(_LABELLED_TOKEN.match(t) for t in tokens)
    return {"news": _count_lines(files, news, "mind"), "impressions": _count_lines(files, behaviors, "mind"),
            "labelled": (split_dir / "labels.tsv").is_file(), "clicks_labelled": clicks_labelled}


def _csv_split(files: FileAccess, path: Path) -> dict[str, Any]:
    with open_text(files, path, "csv") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader, None) or []
            missing = [c for c in PAIR_REQUIRED if c not in header]
            if missing:
                raise FormatError(f"{files.display(path)}: missing columns {missing}")
            rows = sum(1 for _ in reader)
        except csv.Error as exc:
            raise FormatError(f"{files.display(path)}:{reader.line_num}: {exc}") from None
    return {"rows": rows, "labelled": "candidate_is_fake" in header,
            "history_bodies": "history_bodies" in header}


def _triples_split(files: FileAccess, path: Path, entities: set[str], relations: set[str]) -> int:
    try:
        rows = read_triples(path, files)
    except TriplesFormatError as exc:
        raise FormatError(str(exc)) from None
    for h, r, t in rows:
        entities.update((h, t))
        relations.add(r)
    return len(rows)


def detect(path: Path, files: FileAccess = LOCAL) -> dict[str, Any]:
    """``{"format", "kind", "counts"}`` of the dataset directory ``path``; FormatError when none fits.

    With :class:`core.userfiles.UserFiles` as ``files``, the whole directory is checked first (every entry a regular
    file or directory inside the data roots) and every file is read through it (size caps, bounded reads)."""
    path = Path(path)
    if not path.is_dir():
        raise FormatError(f"{files.display(path)} is not a directory")
    try:
        if isinstance(files, UserFiles):
            check_tree(files.settings, path)
        return _detect(path, files)
    except UserFileError as exc:
        raise FormatError(str(exc)) from None
    except UnicodeDecodeError:
        raise FormatError("a text file is not UTF-8") from None


def _detect(path: Path, files: FileAccess) -> dict[str, Any]:
    mind_splits = [s for s in SPLITS if (path / s / "behaviors.tsv").is_file() and (path / s / "news.tsv").is_file()]
    if mind_splits:
        return {"format": "mind", "kind": "news", "counts": {s: _mind_split(files, path / s) for s in mind_splits}}
    if (path / "behaviors.tsv").is_file() and (path / "news.tsv").is_file():
        return {"format": "mind", "kind": "news", "counts": {"split": _mind_split(files, path)}}
    csvs = [s for s in SPLITS if (path / f"pairs_{s}.csv").is_file()]
    if csvs:
        return {"format": "pairwise_csv", "kind": "news",
                "counts": {s: _csv_split(files, path / f"pairs_{s}.csv") for s in csvs}}
    if (path / "train.txt").is_file():
        entities: set[str] = set()
        relations: set[str] = set()
        counts: dict[str, Any] = {f"{s}_triples": _triples_split(files, path / f"{s}.txt", entities, relations)
                                  for s in SPLITS if (path / f"{s}.txt").is_file()}
        counts.update(entities=len(entities), relations=len(relations))
        return {"format": "triples", "kind": "triples", "counts": counts}
    for name, marker in (("cifar10", "data_batch_1"), ("cifar100", "train")):
        if (path / marker).is_file() and (path / "test" if name == "cifar100" else path / "test_batch").is_file():
            batches = sorted(p.name for p in path.iterdir() if p.is_file() and not p.name.endswith(".html"))
            return {"format": name, "kind": "image_classification", "counts": {"files": batches}}
    if (path / "train.safetensors").is_file():
        return {"format": "tensors", "kind": "tensor_classification", "counts": tensor_splits(path, files)}
    if text_split_files(path):
        try:
            counts = summarize_text(path, files)
        except TextDataError as exc:
            raise FormatError(str(exc)) from None
        return {"format": TEXT_FORMATS[counts["file_format"]], "kind": "text_classification", "counts": counts}
    if any((path / f).is_file() for f in ("labels.csv", "dataset_info.json", "dataset_dict.json")):
        from models.lora.keys import DatasetFormatError, summarize_dataset

        try:
            summary = summarize_dataset(path, files)
        except (DatasetFormatError, OSError, ValueError) as exc:
            raise FormatError(str(exc)) from None
        fmt = "lora_safetensors" if summary.format == "safetensors_dir" else "hf_save_to_disk"
        counts = {"adapters": summary.num_items if summary.num_items >= 0 else None,
                  "classes": list(summary.classes), "layers": len(summary.layers)}
        return {"format": fmt, "kind": "lora", "counts": counts}
    raise FormatError("no known dataset format: expected a MIND directory ({train,valid,test}/news.tsv + "
                      "behaviors.tsv), pairs_{split}.csv, a triples directory (train.txt), LoRA safetensors + "
                      "labels.csv, a datasets save_to_disk directory, CIFAR python batches, tensors "
                      "(train.safetensors with inputs and labels), or texts (train.csv or train.jsonl with text and "
                      "label)")


TENSOR_FLOATS = ("F16", "BF16", "F32", "F64")
TENSOR_INTS = ("I8", "I16", "I32", "I64", "U8")


def tensor_splits(path: Path, files: FileAccess) -> dict[str, Any]:
    """A ``tensors`` dataset's splits read from their safetensors headers: ``{split: N}`` and the one per-example
    ``input_shape`` they share; FormatError naming the file and what is wrong."""
    from models.lora.keys import DatasetFormatError, read_safetensors_header

    counts: dict[str, Any] = {}
    shape: list[int] | None = None
    for split in SPLITS:
        f = path / f"{split}.safetensors"
        if not f.is_file():
            continue
        try:
            table = read_safetensors_header(f, files)
        except (DatasetFormatError, OSError) as exc:
            raise FormatError(str(exc)) from None
        x, y = table.get("inputs"), table.get("labels")
        name = f"{split}.safetensors"
        if x is None or y is None:
            raise FormatError(f"{name} must hold the tensors 'inputs' and 'labels' (it has "
                              f"{sorted(k for k in table if k != '__metadata__')[:8]})")
        if x["dtype"] not in TENSOR_FLOATS or len(x["shape"]) < 2:
            raise FormatError(f"{name}: inputs must be floating point [N, ...] (got {x['dtype']} {x['shape']})")
        if y["dtype"] not in TENSOR_INTS or len(y["shape"]) != 1 or y["shape"][0] != x["shape"][0]:
            raise FormatError(f"{name}: labels must be integer class indices [N] with N = {x['shape'][0]} (got "
                              f"{y['dtype']} {y['shape']})")
        if shape is not None and list(x["shape"][1:]) != shape:
            raise FormatError(f"{name}: inputs are {x['shape'][1:]} per example; train has {shape}")
        shape = list(x["shape"][1:])
        counts[split] = int(x["shape"][0])
    counts["input_shape"] = shape
    return counts


# ------------------------------------------------------------------------------------------- label checks
def _header(fh: Any) -> list[str]:
    return next(csv.reader(io.TextIOWrapper(fh, encoding="utf-8", newline="")), None) or []


def news_labelled(settings: Settings, entry: dict[str, Any], split: str) -> bool | None:
    """Whether a registered news dataset's ``split`` carries real/fake labels; None when it cannot tell cheaply.

    Reads only a sidecar's existence or a CSV header, from the dataset's directory or the store."""
    from core import registry
    from core.filestore import StoreError, clean_key

    meta_counts = (entry.get("meta") or {}).get("counts") or {}
    if isinstance(meta_counts.get(split), dict) and "labelled" in meta_counts[split]:
        return bool(meta_counts[split]["labelled"])
    try:
        if entry.get("location"):
            store = registry.store(settings)
            loc = entry["location"]
            if store.exists(clean_key(loc, split, "behaviors.tsv")):
                return store.exists(clean_key(loc, split, "labels.tsv"))
            if store.exists(clean_key(loc, f"pairs_{split}.csv")):
                with store.open(clean_key(loc, f"pairs_{split}.csv")) as fh:
                    return "candidate_is_fake" in _header(fh)
            return None
        if entry.get("path"):
            root = Path(entry["path"])
            if (root / split / "behaviors.tsv").is_file():
                return (root / split / "labels.tsv").is_file()
            if (root / f"pairs_{split}.csv").is_file():
                with open(root / f"pairs_{split}.csv", "rb") as fh:
                    return "candidate_is_fake" in _header(fh)
    except (OSError, StoreError):
        return None
    return None
