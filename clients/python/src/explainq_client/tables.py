"""Artifacts as tables (pandas): a CSV, TSV or JSONL artifact read in full, and a table written as Parquet, CSV or
JSONL. Shared by :class:`explainq_client.Job`, :class:`explainq_client.AsyncJob` and the result classes."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["EXPORT_FORMATS", "TABLE_FORMATS", "export_frame", "table_frame"]


def _entry(line: str) -> Any:
    line = line.strip()
    return json.loads(line) if line else None


TABLE_FORMATS = (".csv", ".tsv", ".jsonl")  # artifacts :meth:`Job.table` reads
EXPORT_FORMATS = ("parquet", "csv", "jsonl")  # what :meth:`Job.export` writes


def table_frame(name: str, data: bytes) -> Any:
    """The artifact ``name`` (its bytes ``data``) as a ``pandas.DataFrame``: a CSV or TSV export with its header
    (a text cell the server wrote with a leading ``'``, because it began with ``= + - @``, a tab or a CR, keeps it:
    the quote cannot be told from one that was there), or a JSONL list, an entry per row (nested records and lists
    stay one column each)."""
    import io

    import pandas as pd

    lower = name.lower()
    if lower.endswith((".csv", ".tsv")):
        if not data.strip():
            return pd.DataFrame()
        return pd.read_csv(io.BytesIO(data), sep="\t" if lower.endswith(".tsv") else ",", keep_default_na=False,
                           na_values=[""])
    if lower.endswith(".jsonl"):
        return pd.DataFrame([e for e in (_entry(x) for x in data.decode("utf-8").splitlines()) if e is not None])
    raise ValueError(f"{name!r} is not a table: Job.table reads {', '.join(TABLE_FORMATS)} artifacts")


def export_frame(frame: Any, dest: Any, fmt: str | None = None) -> Any:
    """Write ``frame`` to ``dest`` as ``fmt`` (``parquet``, ``csv`` or ``jsonl``; by default from ``dest``'s
    suffix); returns ``dest`` as a ``Path``. Parquet needs pyarrow (or fastparquet) installed."""
    from pathlib import Path

    dest = Path(dest)
    fmt = (fmt or dest.suffix.lstrip(".")).lower()
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format {fmt!r}: choose one of {', '.join(EXPORT_FORMATS)} (or give dest that suffix)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    if fmt == "parquet":
        try:
            frame.to_parquet(part, index=False)
        except ImportError as exc:
            raise ImportError("Parquet export needs pyarrow: pip install pyarrow") from exc
    elif fmt == "csv":
        frame.to_csv(part, index=False)
    else:
        frame.to_json(part, orient="records", lines=True)
    part.replace(dest)
    return dest


