"""Reading ``head<TAB>relation<TAB>tail`` files without torch (the API validates datasets with it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from models.files import LOCAL, FileAccess, open_text


class TriplesFormatError(ValueError):
    """A triples or dictionary file that cannot be parsed; the message names the file and line."""


def iter_tsv(path: Path, files: FileAccess = LOCAL, fmt: str = "triples") -> Iterator[tuple[int, list[str]]]:
    """``(line number, tab-separated fields)`` of every non-blank line (line ends dropped). A file that is not
    UTF-8 text (a compressed or binary file, say) is a TriplesFormatError naming it."""
    with open_text(files, Path(path), fmt) as fh:
        lineno = 0
        try:
            for lineno, line in enumerate(fh, 1):
                line = line.rstrip("\n").rstrip("\r")
                if line.strip():
                    yield lineno, line.split("\t")
        except UnicodeDecodeError:
            raise TriplesFormatError(f"{files.display(Path(path))}: not UTF-8 text after line {lineno} (a "
                                     "compressed or binary file?)") from None


def read_triples(path: Path, files: FileAccess = LOCAL, fmt: str = "triples",
                 max_rows: int | None = None) -> list[tuple[str, str, str]]:
    """Read ``head<TAB>relation<TAB>tail`` lines (blank lines skipped). A malformed line is named by file and
    number, never quoted (the file may not be the caller's). More than ``max_rows`` triples is an error."""
    out: list[tuple[str, str, str]] = []
    shown = files.display(Path(path))
    for lineno, parts in iter_tsv(path, files, fmt):
        if len(parts) != 3:
            raise TriplesFormatError(f"{shown}:{lineno}: expected 3 tab-separated fields, got {len(parts)}")
        if not all(p.strip() for p in parts):
            raise TriplesFormatError(f"{shown}:{lineno}: a field is empty")
        if max_rows is not None and len(out) >= max_rows:
            raise TriplesFormatError(f"{shown}: more than {max_rows} triples")
        h, r, t = (p.strip() for p in parts)
        out.append((h, r, t))
    return out
