"""Text classification datasets, read as data without torch (the API detects them, the worker trains on them).

A directory holds one file per split, ``{train,valid,test}.csv`` (a header naming ``text`` and ``label``; other
columns are ignored) or ``{train,valid,test}.jsonl`` (one JSON object per line with ``text`` and ``label``). A label
is a class name (``"positive"``) or a class index (``2``, or ``"2"`` in a CSV); :func:`label_indices` maps them onto
a model's classes. Every file is streamed through a :class:`models.files.FileAccess` (in the service: inside the data
roots, under its size cap, bounded in time), each text at most :data:`MAX_TEXT_CHARS` characters, at most
:data:`MAX_CLASSES` distinct labels; a malformed row is a :class:`TextDataError` naming the file and line.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.files import LOCAL, FileAccess, open_text

SPLITS = ("train", "valid", "test")
FORMATS = {"csv": "text_csv", "jsonl": "text_jsonl"}
FILE_FORMAT = "text"  # the user-file cap the splits are read under (core.userfiles.SIZE_CAPS)
MAX_TEXT_CHARS = 100_000
MAX_LABEL_CHARS = 200
MAX_CLASSES = 10_000
MAX_ROWS = 10_000_000


class TextDataError(ValueError):
    """A text dataset file that is malformed (the message names the file and line)."""


@dataclass
class TextSplit:
    texts: list[str]
    labels: list[str]  # as the file has them: class names or indices written as text


def split_files(path: Path) -> dict[str, Path]:
    """``{split: file}`` of the directory: the CSV files, or else the JSONL files (never a mixture)."""
    path = Path(path)
    for suffix in FORMATS:
        found = {s: path / f"{s}.{suffix}" for s in SPLITS if (path / f"{s}.{suffix}").is_file()}
        if "train" in found:
            return found
    return {}


def _label(value: Any, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TextDataError(f"{where}: label must be a class name or a class index")
    text = str(value).strip()
    if not text or len(text) > MAX_LABEL_CHARS:
        raise TextDataError(f"{where}: label must be 1 to {MAX_LABEL_CHARS} characters")
    return text


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise TextDataError(f"{where}: text must be a string")
    if len(value) > MAX_TEXT_CHARS:
        raise TextDataError(f"{where}: text has {len(value)} characters, more than {MAX_TEXT_CHARS}")
    if not value.strip():
        raise TextDataError(f"{where}: text is empty")
    return value


def rows(path: Path, files: FileAccess = LOCAL) -> Iterator[tuple[str, str]]:
    """``(text, label)`` of every row of one split file, streamed."""
    path = Path(path)
    name = files.display(path)
    n = 0
    csv.field_size_limit(MAX_TEXT_CHARS + 1)
    with open_text(files, path, FILE_FORMAT) as fh:
        if path.suffix == ".csv":
            reader = csv.reader(fh)
            try:
                header = [h.strip() for h in next(reader, None) or []]
                missing = [c for c in ("text", "label") if c not in header]
                if missing:
                    raise TextDataError(f"{name}: the header must name the columns text and label (missing "
                                        f"{', '.join(missing)})")
                ti, li = header.index("text"), header.index("label")
                for row in reader:
                    if not row:
                        continue
                    where = f"{name}:{reader.line_num}"
                    if len(row) != len(header):
                        raise TextDataError(f"{where}: {len(row)} columns, the header has {len(header)}")
                    n += 1
                    if n > MAX_ROWS:
                        raise TextDataError(f"{name}: more than {MAX_ROWS:,} rows")
                    yield _text(row[ti], where), _label(row[li], where)
            except csv.Error as exc:
                raise TextDataError(f"{name}:{reader.line_num}: {str(exc)[:200]}") from None
        else:
            for i, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                where = f"{name}:{i}"
                if len(line) > 4 * MAX_TEXT_CHARS:
                    raise TextDataError(f"{where}: a line of {len(line)} characters")
                try:
                    obj = json.loads(line)
                except ValueError:
                    raise TextDataError(f"{where}: not a JSON object") from None
                if not isinstance(obj, dict) or "text" not in obj or "label" not in obj:
                    raise TextDataError(f"{where}: each line must be a JSON object with text and label")
                n += 1
                if n > MAX_ROWS:
                    raise TextDataError(f"{name}: more than {MAX_ROWS:,} rows")
                yield _text(obj["text"], where), _label(obj["label"], where)


def read_split(path: Path, files: FileAccess = LOCAL) -> TextSplit:
    texts, labels = [], []
    for text, label in rows(path, files):
        texts.append(text)
        labels.append(label)
    if not texts:
        raise TextDataError(f"{files.display(Path(path))} has no rows")
    return TextSplit(texts, labels)


def summarize(path: Path, files: FileAccess = LOCAL) -> dict[str, Any]:
    """The registry's counts of a text dataset: rows per split, the distinct labels (sorted, at most
    :data:`MAX_CLASSES`), the longest text in characters, and the format; :class:`TextDataError` when none."""
    found = split_files(path)
    if "train" not in found:
        raise TextDataError("a text dataset needs train.csv or train.jsonl")
    labels: set[str] = set()
    counts: dict[str, Any] = {}
    longest = 0
    for split, f in found.items():
        n = 0
        for text, label in rows(f, files):
            n += 1
            longest = max(longest, len(text))
            if label not in labels:
                labels.add(label)
                if len(labels) > MAX_CLASSES:
                    raise TextDataError(f"{files.display(f)}: more than {MAX_CLASSES} distinct labels")
        if n == 0:
            raise TextDataError(f"{files.display(f)} has no rows")
        counts[split] = n
    counts["labels"] = sorted(labels, key=lambda v: (not v.isdigit(), int(v) if v.isdigit() else 0, v))
    counts["longest_text"] = longest
    counts["file_format"] = next(iter(found.values())).suffix[1:]
    return counts


def label_indices(labels: list[str], classes: list[str]) -> tuple[list[int] | None, list[str]]:
    """The class index of each label, against a model's ``classes``: a label is a class name, or else a class index
    ``0..n-1``; returns (indices, []) or (None, the labels that are neither, at most 8)."""
    by_name = {c: i for i, c in enumerate(classes)}
    out: list[int] = []
    bad: list[str] = []
    for label in labels:
        if label in by_name:
            out.append(by_name[label])
        elif label.isdigit() and int(label) < len(classes):
            out.append(int(label))
        elif label not in bad:
            bad.append(label)
            if len(bad) >= 8:
                break
    return (None, bad) if bad else (out, [])
