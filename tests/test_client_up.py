"""The command line and the SDK against ``explainq up`` as a user runs it (embedded Redis, supervised workers,
the API), with an API key: a Vision-BDH run followed to the end, its result, the model it registered."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from explainq_client import Client, TrainingResult
from explainq_client.errors import APIConnectionError

from core.redis_server import free_port
from tests.service import ROOT

KEY = "up-key"
BDH = {"dataset": "digits", "epochs": 2, "batch_size": 32, "lr": 3e-3, "warmup_steps": 2, "max_train_samples": 64,
       "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "mlp_multiplier": 2, "dropout": 0.0},
       "precision": "fp32", "seed": 1}


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    home = tmp_path_factory.mktemp("up-home")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "EXPLAINQ_URL", "EXPLAINQ_API_KEY")}
    env.update(EXPLAINQ_HOME=str(home), EXPLAINQ_API_KEYS=f"team:{KEY}", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    log = open(home / "up.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "explainq.cli", "up", "--no-demo", "--port", str(port)], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        with Client(url, KEY, max_retries=0) as c:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if c.ready()["status"] == "ready":
                        break
                except APIConnectionError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("explainq up never became ready:\n" + (home / "up.log").read_text())
                time.sleep(0.5)
        yield url, {**env, "EXPLAINQ_URL": url, "EXPLAINQ_API_KEY": KEY}, home
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cli(env: dict[str, str], *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "explainq_client", *argv], env=env, input=stdin,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_follows_a_training_run_on_explainq_up(up):
    url, env, _ = up
    run = cli(env, "submit", "train_bdh", "-", "--follow", stdin=json.dumps(BDH))
    assert run.returncode == 0, run.stderr
    job = json.loads(run.stdout)
    assert job["status"] == "succeeded" and job["kind"] == "train_bdh"
    assert "batches" in run.stderr or "epochs" in run.stderr  # the progress lines

    result = json.loads(cli(env, "result", job["id"]).stdout)
    assert len(result["history"]) == 2 and result["model_name"] == f"bdh-digits-{job['id'][:8]}"
    models = cli(env, "models")
    assert models.returncode == 0 and f"bdh-digits-{job['id'][:8]}" in models.stdout

    refused = cli(env, "submit", "train_bdh", "-", stdin=json.dumps({**BDH, "epochs": 0}))
    assert refused.returncode == 2 and "epochs:" in refused.stderr
    unauthorized = cli({**env, "EXPLAINQ_API_KEY": "wrong"}, "jobs")
    assert unauthorized.returncode == 4 and "401 unauthorized" in unauthorized.stderr

    with Client(url, KEY) as c:
        trained = c.jobs.get(job["id"]).result()
        assert isinstance(trained, TrainingResult) and "<polyline" in trained._repr_html_()
