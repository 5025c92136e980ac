"""The one writer of every CSV and TSV export (``influence.csv``, ``candidates.tsv``, ``words.csv``,
``lds_per_test.csv``, ``corrupted.tsv``, ``suspects.csv``, ``metrics.csv``): no cell opens as a formula in a spreadsheet.

A cell is typed by where it comes from, not by how it looks. A number the service computed (``int``, ``float`` or a
numpy scalar) is written as that number, ``-0.5`` included. Any string is text, and text may come from a user (an
entity or relation name, a label, a word, a sample id): a string that starts with ``=``, ``+``, ``-``, ``@``, a tab or
a carriage return gets a leading ``'``, as OWASP recommends for CSV injection, so an entity named
``=HYPERLINK(...)`` or ``-1+2`` is shown as the text it is. ``None`` is an empty cell. Quoting is the ``csv``
module's (a cell holding the delimiter, a quote or a line break is quoted), for TSV as for CSV.

Files that are datasets (triples, id maps, ``labels.csv``, pairwise CSV written by the synthetic generators) are
data the service reads back, not exports, and are written verbatim.
"""

from __future__ import annotations

import csv
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value: Any) -> Any:
    """``value`` as the writer puts it in a cell: numbers as numbers, ``None`` empty, text neutralised."""
    if value is None:
        return ""
    if isinstance(value, numbers.Number):
        return str(value)  # a Python float's shortest exact form, as ``repr``
    text = str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


class TableWriter:
    """Rows of cells (a sequence, or a mapping by ``columns``) into ``fh``, a header first when ``columns`` is
    given; ``delimiter="\\t"`` for TSV. ``fh`` is opened by the caller with ``newline=""``."""

    def __init__(self, fh: TextIO, columns: Sequence[str] | None = None, *, delimiter: str = ",",
                 lineterminator: str = "\r\n") -> None:
        self.columns = list(columns) if columns is not None else None
        self._w = csv.writer(fh, delimiter=delimiter, lineterminator=lineterminator)
        if self.columns is not None:
            self._w.writerow([safe_cell(c) for c in self.columns])

    def row(self, cells: Sequence[Any] | Mapping[str, Any]) -> None:
        if isinstance(cells, Mapping):
            if self.columns is None:
                raise ValueError("a row given by column needs the writer's columns")
            unknown = set(cells) - set(self.columns)
            if unknown:
                raise ValueError(f"cells of unknown columns: {sorted(unknown)}")
            cells = [cells.get(c) for c in self.columns]
        self._w.writerow([safe_cell(c) for c in cells])

    def rows(self, rows: Iterable[Sequence[Any] | Mapping[str, Any]]) -> None:
        for r in rows:
            self.row(r)
