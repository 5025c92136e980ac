"""Log lines: one JSON object each, carrying the job's fields inside a job; plain text on request."""

from __future__ import annotations

import json
import logging

import pytest

from app import logs
from app.logs import job_logging, set_process_fields, setup_logging


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
