"""``explainq-client`` against a real server: every command, and its exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from explainq_client import Client
from explainq_client.cli import (
    EXIT_API,
    EXIT_CANCELED,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PIPE,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    run,
)

from tests.http_server import KEYS, keyed_service


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from keyed_service(tmp_path_factory.mktemp("cli-home"))


@pytest.fixture()
def cli(server, capsys, monkeypatch):
    """Run the command line in this process against the server as alice; returns (exit code, stdout, stderr)."""
    monkeypatch.setenv("EXPLAINQ_URL", server[1].url)
    monkeypatch.setenv("EXPLAINQ_API_KEY", KEYS["alice"])

    def call(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = run(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return call


def request(tmp_path: Path, body: dict) -> str:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(body))
    return str(path)


def test_submit_follow_shows_progress_and_exits_0(cli, tmp_path):
    code, out, err = cli("submit", "/test/sleep", request(tmp_path, {"steps": 8, "step_s": 0.25}), "--follow")
    assert code == EXIT_OK, err
    job = json.loads(out)
    assert job["status"] == "succeeded" and job["kind"] == "test_sleep"
    assert f"submitted test_sleep job {job['id']}" in err
    assert "8/8 steps" in err and "\nrunning " in err  # one progress line per change (stderr is not a tty)


def test_submit_without_wait_prints_the_queued_job(cli, tmp_path):
    code, out, _ = cli("submit", "/test/sleep", request(tmp_path, {"steps": 1, "step_s": 0}))
    assert code == EXIT_OK and json.loads(out)["status"] in ("queued", "running", "succeeded")


def test_failed_job_exits_1_with_its_error_code(cli, tmp_path):
    code, out, err = cli("submit", "/test/sleep", request(tmp_path, {"steps": 3, "step_s": 0, "fail_at": 1}),
                         "--wait")
    assert code == EXIT_FAILED
    assert "failed: bad_step: step 1 failed on purpose" in err
    assert json.loads(out)["error"]["code"] == "bad_step"


def test_bad_input_exits_2_naming_the_field(cli, tmp_path):
    code, _, err = cli("submit", "train_bdh", request(tmp_path, {"epochs": 0}))
    assert code == EXIT_USAGE and "epochs:" in err
    code, _, err = cli("submit", "attributions", request(tmp_path, {"model": "nope", "samples": [
        {"id": "a", "history": ["x"], "candidate": "y"}]}))
    assert code == EXIT_USAGE and "model: unknown model 'nope'" in err
    code, _, err = cli("submit", "no_such_kind", request(tmp_path, {}))
    assert code == EXIT_USAGE and "unknown job kind" in err
    (tmp_path / "broken.json").write_text("{not json")
    code, _, err = cli("submit", "tracin", str(tmp_path / "broken.json"))
    assert code == EXIT_USAGE and "is not JSON" in err
    code, _, err = cli("submit", "tracin", str(tmp_path / "missing.json"))
    assert code == EXIT_USAGE and "cannot read" in err


def test_status_result_jobs_cancel(cli, server, tmp_path):
    with Client(server[1].url, KEYS["alice"]) as c:
        done = c.submit("/test/sleep", {"steps": 2, "step_s": 0}).wait(timeout=60)
        running = c.submit("/test/sleep", {"steps": 400, "step_s": 0.05})
    code, out, _ = cli("status", done.id)
    assert code == EXIT_OK and json.loads(out)["status"] == "succeeded"
    code, out, _ = cli("result", done.id)
    assert code == EXIT_OK and json.loads(out)["steps"] == 2
    code, out, _ = cli("jobs", "--kind", "test_sleep", "--limit", "50")
    assert code == EXIT_OK and done.id in out and out.splitlines()[0].split()[:3] == ["id", "kind", "status"]
    code, out, _ = cli("jobs", "--json", "--status", "succeeded")
    assert code == EXIT_OK and all(j["status"] == "succeeded" for j in json.loads(out)["items"])
    code, out, _ = cli("cancel", running.id)
    assert code == EXIT_OK and json.loads(out)["id"] == running.id
    code, out, err = cli("status", running.id, "--wait")
    assert code == EXIT_CANCELED and "canceled: canceled" in err
    code, _, err = cli("cancel", running.id)
    assert code == EXIT_API and "409 already_finished" in err
    code, _, err = cli("result", running.id)
    assert code == EXIT_API and "409 canceled" in err


def test_wait_timeout_exits_5(cli, server):
    with Client(server[1].url, KEYS["alice"]) as c:
        job = c.submit("/test/sleep", {"steps": 200, "step_s": 0.05})
    code, _, err = cli("status", job.id, "--wait", "--timeout", "0.3")
    assert code == EXIT_TIMEOUT and "after 0.3s" in err
    assert "keeps running on the server" in err and f"explainq-client status {job.id} --follow" in err
    code, _, err = cli("status", job.id, "--follow", "--timeout", "0.5")
    assert code == EXIT_TIMEOUT and "after 0.5s" in err and "steps" in err
    assert cli("cancel", job.id)[0] == EXIT_OK


def test_models(cli):
    code, out, _ = cli("models")
    assert code == EXIT_OK and any(line.split()[:2] == ["counter", "test"] for line in out.splitlines())
    code, out, _ = cli("models", "--json")
    assert code == EXIT_OK and [m["name"] for m in json.loads(out)["models"]] == ["counter"]


def test_artifacts_list_and_download(cli, server, tmp_path):
    with Client(server[1].url, KEYS["alice"]) as c:
        job = c.submit("/test/sleep", {"steps": 1, "step_s": 0}).wait(timeout=60)
    code, out, err = cli("artifacts", job.id)
    assert code == EXIT_OK, err
    assert out.splitlines()[1].split()[:2] == ["out.txt", "4"]
    code, out, err = cli("artifacts", job.id, "--download", str(tmp_path / "dl"))
    assert code == EXIT_OK, err
    assert (tmp_path / "dl" / "out.txt").read_text() == "done" and out.strip().endswith("out.txt")


def test_unknown_job_and_bad_key_exit_4(cli, server, monkeypatch):
    code, _, err = cli("status", "no-such-job")
    assert code == EXIT_API and "404 not_found" in err
    monkeypatch.setenv("EXPLAINQ_API_KEY", "wrong")
    code, _, err = cli("jobs")
    assert code == EXIT_API and "401 unauthorized" in err


def test_console_script_and_module_entry_points(server, tmp_path):
    """The installed ``explainq-client`` script and ``python -m explainq_client`` run as separate processes."""
    script = Path(sys.executable).with_name("explainq-client")
    body = request(tmp_path, {"steps": 2, "step_s": 0, "fail_at": 1})
    for argv in ([str(script)], [sys.executable, "-m", "explainq_client"]):
        out = subprocess.run([*argv, "--url", server[1].url, "--api-key", KEYS["alice"], "submit", "/test/sleep",
                              body, "--wait"], capture_output=True, text=True, timeout=120)
        assert out.returncode == EXIT_FAILED, out.stderr
        assert "bad_step" in out.stderr and json.loads(out.stdout)["status"] == "failed"


def test_submit_train_news_resolves_its_route_from_kinds(cli, tmp_path):
    """``train_news`` (and ``train-news``) reach ``POST /train/news``: the server's own check names the field."""
    for kind in ("train_news", "train-news"):
        code, _, err = cli("submit", kind, request(tmp_path, {"name": "news1", "dataset": "no-such-dataset"}))
        assert code == EXIT_USAGE, err
        assert "unknown job kind" not in err and "dataset:" in err


def test_jobs_with_an_unknown_kind_is_a_usage_error_naming_the_kinds(cli):
    code, out, err = cli("jobs", "--kind", "bogus")
    assert code == EXIT_USAGE and out == ""
    assert "unknown job kind 'bogus'" in err and "test_sleep" in err and "train_news" in err
    assert cli("jobs", "--kind", "test-sleep")[0] == EXIT_OK


def test_result_table_follows_the_kinds_renderer(cli, server):
    """``test_described`` says its results draw as training runs: ``--table`` prints the epoch table."""
    with Client(server[1].url, KEYS["alice"]) as c:
        described = c.submit("test_described", {"steps": 1, "step_s": 0}).wait(timeout=60)
        plain = c.submit("/test/sleep", {"steps": 2, "step_s": 0}).wait(timeout=60)
    code, out, err = cli("result", described.id, "--table")
    assert code == EXIT_OK, err
    assert out.startswith("training") and "no epochs finished" in out
    code, out, _ = cli("result", plain.id, "--table")  # no renderer: the JSON
    assert code == EXIT_OK and json.loads(out)["steps"] == 2


def test_a_closed_stdout_exits_quietly(server):
    """``explainq-client result <id> | head``: the reader goes away; no traceback, exit code 141."""
    with Client(server[1].url, KEYS["alice"]) as c:
        job = c.submit("/test/sleep", {"steps": 2, "step_s": 0}).wait(timeout=60)
    proc = subprocess.Popen([sys.executable, "-m", "explainq_client", "--url", server[1].url, "--api-key",
                             KEYS["alice"], "result", job.id], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command has its answer to print
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == EXIT_PIPE, err
    assert err == ""


def test_keep_and_delete_a_finished_job(cli, tmp_path):
    code, out, err = cli("submit", "/test/sleep", request(tmp_path, {"steps": 1, "step_s": 0}), "--wait")
    job_id = json.loads(out)["id"]
    code, out, _ = cli("keep", job_id)
    assert code == EXIT_OK and json.loads(out)["kept"] is True
    code, _, err = cli("delete", job_id)
    assert code == EXIT_API and "409 kept" in err
    code, out, _ = cli("keep", job_id, "--undo")
    assert code == EXIT_OK and json.loads(out)["kept"] is False
    code, out, _ = cli("delete", job_id)
    assert code == EXIT_OK and json.loads(out)["deleted"] is True
    code, _, err = cli("status", job_id)
    assert code == EXIT_API and "404" in err
