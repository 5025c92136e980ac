"""Reading ``head<TAB>relation<TAB>tail`` files without torch (the API validates datasets with it)."""

from __future__ import annotations

from pathlib import Path


class TriplesFormatError(ValueError):
    """A triples or dictionary file that cannot be parsed; the message names the file and line."""


def read_triples(path: Path) -> list[tuple[str, str, str]]:
    """Read ``head<TAB>relation<TAB>tail`` lines (blank lines skipped)."""
    out: list[tuple[str, str, str]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.rstrip("\n").rstrip("\r")
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 3 or not all(p.strip() for p in parts):
                raise TriplesFormatError(f"{path}:{lineno}: expected 3 tab-separated fields, got {line!r}")
            h, r, t = (p.strip() for p in parts)
            out.append((h, r, t))
    return out
