"""The plugin example (``examples/plugin``) end to end, as an operator would run it: the API and a worker as
separate processes with the plugin package on ``PYTHONPATH`` and its hook in ``EXPLAINQ_KIND_PLUGINS``. The API
serves the plugin's route (loaded by the same function as the workers' kinds), a worker runs its job, and its
result renders in the SDK and on the dashboard like any training run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from core.redis_server import EmbeddedRedis, free_port

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_DIR = ROOT / "examples" / "plugin"
HOOK = "explainq_digits.kind:register"


def _env(home: Path, redis_url: str, plugins: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"EXPLAINQ_HOME": str(home), "REDIS_URL": redis_url, "EXPLAINQ_API_KEYS": "",
                "PYTHONPATH": os.pathsep.join([str(ROOT), str(PLUGIN_DIR)]), "OMP_NUM_THREADS": "1",
                "EXPLAINQ_KIND_PLUGINS": plugins})
    return env


def _start_api(home: Path, redis_url: str, plugins: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(home / f"api-{port}.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "explainq.cli", "api", "--port", str(port)], cwd=ROOT,
                            env=_env(home, redis_url, plugins), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError((home / f"api-{port}.log").read_text())


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    home = tmp_path_factory.mktemp("plugin")
    redis = EmbeddedRedis(home / "redis", appendonly=False).start()
    procs = []
    try:
        api, url = _start_api(home, redis.url, HOOK)
        procs.append(api)
        log = open(home / "worker.log", "ab")
        procs.append(subprocess.Popen([sys.executable, "-m", "explainq.cli", "worker", "--queues", "train"],
                                      cwd=ROOT, env=_env(home, redis.url, HOOK), stdout=log,
                                      stderr=subprocess.STDOUT))
        yield home, redis, url
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        redis.stop()


def _wait(url: str, job_id: str, home: Path, timeout_s: float = 180) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = httpx.get(f"{url}/jobs/{job_id}", timeout=10).json()
        if job["status"] in ("succeeded", "failed", "canceled"):
            return job
        time.sleep(0.3)
    raise TimeoutError((home / "worker.log").read_text()[-4000:])


def test_the_plugins_route_is_served_by_the_api_process(service) -> None:
    _, _, url = service
    assert "/plugins/digits-mlp" in httpx.get(f"{url}/openapi.json").json()["paths"]
    described = {k["name"]: k for k in httpx.get(f"{url}/kinds").json()["kinds"]}
    assert described["digits_mlp"]["route"] == "/plugins/digits-mlp"
    assert described["digits_mlp"]["renderer"] == "training" and described["digits_mlp"]["result"] == "DigitsMLPResult"
    bad = httpx.post(f"{url}/plugins/digits-mlp", json={"epochs": 0})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "epochs"]


def test_without_the_hook_the_api_has_no_such_route(service) -> None:
    home, redis, _ = service
    api, url = _start_api(home, redis.url, "")
    try:
        assert httpx.post(f"{url}/plugins/digits-mlp", json={}).status_code in (404, 405)
    finally:
        api.terminate()
        api.wait(20)


def test_a_worker_runs_the_plugin_job_and_its_result_renders(service) -> None:
    from explainq_client import Client, TrainingResult
    from explainq_client.render import training_text

    home, _, url = service
    r = httpx.post(f"{url}/plugins/digits-mlp", json={"epochs": 4, "hidden": 32, "label": "plugin run"})
    assert r.status_code == 202, r.text
    job = _wait(url, r.json()["id"], home)
    assert job["status"] == "succeeded", ((home / "worker.log").read_text()[-4000:], job)
    res = httpx.get(f"{url}/jobs/{job['id']}/result")
    assert res.headers["x-explainq-result-schema"] == "DigitsMLPResult"
    result = res.json()
    assert [row["epoch"] for row in result["history"]] == [1, 2, 3, 4]
    assert result["test_accuracy"] > 0.8  # an MLP on digits learns in a few epochs
    assert sum(map(sum, result["confusion"])) == 359
    names = [a["name"] for a in result["artifacts"]]
    assert "test_predictions.csv" in names

    with Client(url) as client:  # the SDK knows the kind from GET /kinds only
        got = client.jobs.get(job["id"]).result()
    assert isinstance(got, TrainingResult) and got.kind == "digits_mlp"
    assert "<svg" in got._repr_html_() and "val_accuracy" in got._repr_html_()
    assert "epoch" in training_text(result)

    page = httpx.get(f"{url}/ui/jobs/{job['id']}", follow_redirects=True)
    assert page.status_code == 200 and "digits_mlp" in page.text
    assert "<h2>Curves</h2>" in page.text and "test accuracy" in page.text  # the kind's charts, by its description
