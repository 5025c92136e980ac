"""How readers of user files open them (no torch).

Every reader of a file a user brings (triples, MIND, CSV, LoRA labels and safetensors headers, pickled state
dicts, configs) takes a ``files`` argument and opens through it, never with ``open`` directly. Used as a library,
:data:`LOCAL` opens any path as given. The service passes :class:`core.userfiles.UserFiles`, which opens only
regular files inside the data roots (symlinks resolved at every level), with a size cap per format and reads bounded
in bytes and time, and names files relative to the data roots in messages.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import BinaryIO, Protocol, TextIO


class FileAccess(Protocol):
    def open(self, path: Path, fmt: str) -> BinaryIO:
        """A binary file object for reading ``path``, checked as a file of format ``fmt`` (its size cap)."""

    def display(self, path: Path) -> str:
        """``path`` as messages may show it."""


class LocalFiles:
    """Plain access for library use: any path, no caps, named as given."""

    def open(self, path: Path, fmt: str) -> BinaryIO:
        return open(path, "rb")

    def display(self, path: Path) -> str:
        return str(path)


LOCAL = LocalFiles()


def open_text(files: FileAccess, path: Path, fmt: str, encoding: str = "utf-8-sig") -> TextIO:
    """``path`` as text through ``files``: UTF-8 (a leading byte-order mark is dropped), newlines kept as read
    (``newline=""``, as the csv module needs)."""
    return io.TextIOWrapper(files.open(Path(path), fmt), encoding=encoding, newline="")


def read_bytes(files: FileAccess, path: Path, fmt: str) -> bytes:
    with files.open(Path(path), fmt) as fh:
        return fh.read()
