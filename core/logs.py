"""Logging for every explainq process: one JSON object per line (or plain text for humans), no torch.

``setup_logging()`` installs the formatter on the root logger. While a job runs, ``job_logging(...)`` binds
``job_id``, ``kind``, ``owner`` and ``worker`` in a context variable; a filter copies them onto every record
logged in that context (the job thread and anything it calls), so each line says which job it belongs to.

``EXPLAINQ_LOG_FORMAT=text`` switches to the plain ``time name level message`` format.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from pythonjsonlogger.json import JsonEncoder, JsonFormatter

CONTEXT_FIELDS = ("job_id", "kind", "owner", "worker")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("explainq_log_context",
                                                                                  default=None)
# The worker's name, set once per process; added to every record of a worker process.
_process_fields: dict[str, Any] = {}


class ContextFilter(logging.Filter):
    """Adds the bound job fields (and the process's worker name) to each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.__dict__.pop("color_message", None)  # uvicorn's ANSI-coloured duplicate of the message
        for key, value in _process_fields.items():
            if not hasattr(record, key):
                setattr(record, key, value)
        for key, value in (_context.get() or {}).items():
            setattr(record, key, value)
        return True


def set_process_fields(**fields: Any) -> None:
    """Fields every record of this process carries (e.g. ``worker=<name>`` in a worker process)."""
    _process_fields.update({k: v for k, v in fields.items() if v is not None})


@contextlib.contextmanager
def job_logging(**fields: Any) -> Iterator[None]:
    """Bind job fields (``job_id``, ``kind``, ``owner``, ``worker``) to every record logged inside the block."""
    merged = {**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}}
    token = _context.set(merged)
    try:
        yield
    finally:
        _context.reset(token)


class JsonLineFormatter(JsonFormatter):
    """``{"level", "logger", "message", <extra fields>..., "time"}``, one object per line.

    The line is exactly python-json-logger's for the same record; an ordinary record (a string message, no
    exception or stack) is built directly instead of through its generic field machinery, which costs several
    times more. That matters on the API's access log: one record per request.
    """

    _encoder = JsonEncoder()  # python-json-logger's encoding of datetimes, bytes, exceptions, anything else

    def __init__(self) -> None:
        super().__init__(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger"},
            timestamp="time",  # ISO 8601, UTC
        )

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.exc_text or record.stack_info or isinstance(record.msg, dict):
            return super().format(record)
        record.message = record.getMessage()
        data: dict[str, Any] = {"level": record.levelname, "logger": record.name, "message": record.message}
        skip = self._skip_fields
        for key, value in record.__dict__.items():
            if key not in skip and not (hasattr(key, "startswith") and key.startswith("_")):
                data[key] = value
        data["time"] = datetime.fromtimestamp(record.created, tz=UTC).isoformat()
        return self._encoder.encode(data)


def make_formatter(fmt: str) -> logging.Formatter:
    if fmt == "text":
        return logging.Formatter(TEXT_FORMAT)
    if fmt != "json":
        raise ValueError(f"EXPLAINQ_LOG_FORMAT must be 'json' or 'text', got {fmt!r}")
    return JsonLineFormatter()


def setup_logging(fmt: str | None = None, level: int | str = logging.INFO) -> None:
    """Route the root logger (and uvicorn's and RQ's loggers) through one formatter on stderr.

    ``fmt`` defaults to ``EXPLAINQ_LOG_FORMAT`` (``json`` unless set to ``text``). Idempotent.
    """
    fmt = (fmt or os.environ.get("EXPLAINQ_LOG_FORMAT") or "json").strip().lower()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(make_formatter(fmt))
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # Libraries that install their own handlers would print a second, differently formatted line.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "rq.worker"):
        lib = logging.getLogger(name)
        lib.handlers.clear()
        lib.propagate = True
