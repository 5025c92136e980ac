"""Log lines: one JSON object each, carrying the job's fields inside a job; plain text on request."""

from __future__ import annotations

import json
import logging

import pytest

from core import logs
from core.logs import job_logging, set_process_fields, setup_logging


@pytest.fixture
def restore_root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logs._process_fields.clear()


def test_json_lines_carry_job_fields_only_inside_the_job(capsys, restore_root_logger):
    setup_logging("json")
    set_process_fields(worker="host.1")
    log = logging.getLogger("explainq.test")
    with job_logging(job_id="j1", kind="tracin", owner="alice"):
        log.info("step %d", 3)
        with job_logging(kind="inner"):
            log.warning("nested")
    log.error("after")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [r["message"] for r in lines] == ["step 3", "nested", "after"]
    assert lines[0]["job_id"] == "j1" and lines[0]["kind"] == "tracin" and lines[0]["owner"] == "alice"
    assert lines[1]["kind"] == "inner" and lines[1]["job_id"] == "j1"
    assert "job_id" not in lines[2] and lines[2]["level"] == "ERROR" and lines[2]["logger"] == "explainq.test"
    assert all(r["worker"] == "host.1" and r["time"].endswith("+00:00") for r in lines)


def test_text_format_for_humans(capsys, restore_root_logger):
    setup_logging("text")
    logging.getLogger("explainq.test").info("plain %s", "words")
    err = capsys.readouterr().err
    assert err.rstrip().endswith("explainq.test INFO plain words") and not err.startswith("{")
    with pytest.raises(ValueError, match="EXPLAINQ_LOG_FORMAT"):
        setup_logging("xml")


def test_json_lines_are_python_json_loggers_lines(restore_root_logger):
    """The formatter's direct path writes exactly the line python-json-logger's generic one writes."""
    import datetime
    import sys

    from pythonjsonlogger.json import JsonFormatter

    fast = logs.make_formatter("json")
    slow = JsonFormatter("%(levelname)s %(name)s %(message)s", rename_fields={"levelname": "level", "name": "logger"},
                         timestamp="time")

    def record(msg, args=(), **extra):
        rec = logging.LogRecord("uvicorn.access", logging.INFO, "x.py", 1, msg, args, None)
        rec.__dict__.update(extra)
        logs.ContextFilter().filter(rec)
        return rec

    try:
        raise ZeroDivisionError("boom")
    except ZeroDivisionError:
        exc_info = sys.exc_info()
    cases = [
        record('%s - "%s %s HTTP/%s" %d', ("127.0.0.1:5", "GET", "/jobs/x", "1.1", 200)),
        record("caf\u00e9 %s", ("\u2603",), job_id="j1", owner="alice", n=3, ratio=0.5, flag=None),
        record("when", when=datetime.datetime(2026, 1, 2, 3, 4, 5), data=b"\x00\xff", obj=object(), _private=1),
        record({"structured": True, "n": 1}),
        record("failed", exc_info=exc_info),
        record("stack", stack_info="Stack (most recent call last):\n  here"),
    ]
    for rec in cases:
        line = fast.format(rec)
        assert line == slow.format(rec)
        assert json.loads(line)["level"] == "INFO"
    assert json.loads(fast.format(cases[1]))["job_id"] == "j1"
