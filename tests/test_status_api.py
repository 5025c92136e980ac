"""System status over HTTP: a queued job says why it waits, models the demo still prepares are listed as
``preparing`` and a request naming one is a 503 with ``Retry-After``, ``GET /workers`` and the dashboard's workers
page list a live worker with its loaded model, the strip says when no worker runs, and the demo runs in order of
usefulness."""

from __future__ import annotations

import pytest

from core import demo_status, keys
from workers.demo import DemoStep, order_by_usefulness, plan

TRACIN = {"model": "conve-nations-demo", "test_triples": [["usa", "embassy", "uk"]]}


def _noop(*_a, **_k) -> None:
    return None


# ------------------------------------------------------------------------------------------------ ordering
def test_demo_order_puts_each_explanation_kind_first_then_new_kinds_then_the_rest_cheapest_first() -> None:
    steps = [
        DemoStep("big-news", _noop, models=("big-news",), kinds=("attributions",), explains=True, cost_s=200),
        DemoStep("small-news", _noop, models=("small-news",), kinds=("attributions",), explains=True, cost_s=40),
        DemoStep("kg", _noop, models=("kg",), kinds=("tracin", "train_conve"), explains=True, cost_s=15),
        DemoStep("digits", _noop, datasets=("digits",), kinds=("train_bdh",), cost_s=2),
        DemoStep("twin", _noop, models=("twin",), kinds=("attributions",), explains=True, cost_s=60),
        DemoStep("lora", _noop, datasets=("lora",), kinds=("ablations",), explains=True, cost_s=3),
    ]
    order = [s.name for s in order_by_usefulness(steps)]
    # tier 0: a first step for each explanation kind, cheapest first; tier 1: a new (training) kind; tier 2: the
    # remaining models of kinds already served, cheapest first
    assert order == ["lora", "kg", "small-news", "digits", "twin", "big-news"]
    assert order_by_usefulness(reversed(steps)) == order_by_usefulness(steps)  # independent of the input order


def test_the_demo_plan_serves_an_explainable_model_first_and_every_explanation_kind_before_seconds() -> None:
    steps = plan()
    first_model = next(s for s in steps if s.models)
    assert first_model.explains and first_model.cost_s <= 60, first_model
    served: set[str] = set()
    seconds_started = False
    for s in steps:
        new = set(s.kinds) - served
        if not new:
            seconds_started = True
        elif s.explains:
            assert not seconds_started, f"{s.name} makes a new explanation kind usable after a repeat"
        served |= set(s.kinds)
    assert {"attributions", "tracin", "ablations"} <= served


def _sdk(code: str, data: dict) -> str:
    """``code`` run with this checkout's SDK in a child process, ``data`` as JSON on its stdin; its stdout."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parent.parent / "clients" / "python" / "src"
    return subprocess.run([sys.executable, "-c", code], input=json.dumps(data), capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(src)}, check=True).stdout


def _sdk_preparing(listed: dict) -> set[str]:
    """The names the SDK reads as ``preparing`` from a GET /models answer."""
    import json

    return set(json.loads(_sdk("import json, sys\nfrom explainq_client.jobs import ModelList\n"
                               "print(json.dumps([m.name for m in ModelList.from_json(json.load(sys.stdin)).models "
                               "if m.status == 'preparing']))", listed)))


# ------------------------------------------------------------------------------------------------ the API
@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """The real app over a private Redis, no worker."""
    from tests.service import api_client

    with api_client(tmp_path_factory.mktemp("status-api")) as client:
        yield client


@pytest.fixture()
def redis(api):
    import redis as redis_lib

    r = redis_lib.Redis.from_url(api.app.state.settings.redis_url)
    yield r
    r.delete(keys.DEMO_PLAN, keys.DEMO_ALIVE, "rq:worker:fake.1", "rq:workers:explain", "rq:workers")


def _demo(redis, *states: str) -> demo_status.DemoProgress:
    """A live demo plan: a dataset step, then ``conve-nations-demo`` (then a news model)."""
    steps = [{"name": "lora-demo", "datasets": ["lora-demo"], "kinds": ["ablations"], "cost_s": 3},
             {"name": "conve-nations-demo", "models": ["conve-nations-demo"], "datasets": ["nations"],
              "kinds": ["tracin"], "cost_s": 15},
             {"name": "nrms-word-demo", "models": ["nrms-word-demo"], "kinds": ["attributions"], "cost_s": 40}]
    progress = demo_status.DemoProgress(redis, steps)
    for step, state in zip(steps, states, strict=False):
        progress.plan["steps"][[s["name"] for s in steps].index(step["name"])]["state"] = state
    return progress


def test_a_queued_job_with_no_worker_on_its_queue_says_why(api, redis) -> None:
    r = api.post("/test/sleep", json={"steps": 1})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    view = api.get(f"/jobs/{job_id}").json()
    assert view["status"] == "queued" and view["position"] == 0
    assert "no worker is listening on queue 'explain'" in view["waiting_reason"], view
    with _demo(redis, "ready", "preparing"):
        reason = api.get(f"/jobs/{job_id}").json()["waiting_reason"]
        assert "demo models are being prepared (1 of 3 steps ready)" in reason, reason
    # a live worker on the queue (RQ's registration): nothing to explain any more
    redis.hset("rq:worker:fake.1", mapping={"queues": "explain", "state": "idle"})
    redis.sadd("rq:workers:explain", "rq:worker:fake.1")
    assert api.get(f"/jobs/{job_id}").json()["waiting_reason"] is None
    redis.hset("rq:worker:fake.1", "death", "2026-01-01T00:00:00.000000Z")  # a dead one counts for nothing
    assert api.get(f"/jobs/{job_id}").json()["waiting_reason"] is not None
    # the SDK and its CLI's progress line say it too
    waiting = api.get(f"/jobs/{job_id}").json()
    line = _sdk("import io, json, sys\nfrom explainq_client.cli import ProgressBar\n"
                "from explainq_client.jobs import JobBase\nout = io.StringIO()\n"
                "job = JobBase(json.load(sys.stdin))\nProgressBar(out).update(job)\n"
                "print(job.waiting_reason)\nprint(out.getvalue().strip())", waiting).splitlines()
    assert line[0] == waiting["waiting_reason"] and line[1].startswith("queued") and waiting["waiting_reason"] in line[1]
    api.delete(f"/jobs/{job_id}")


def test_a_model_being_prepared_is_listed_preparing_and_a_request_naming_it_is_503_with_retry_after(api, redis):
    with _demo(redis, "ready", "preparing"):
        r = api.post("/tracin", json=TRACIN)
        assert r.status_code == 503, r.text
        detail = r.json()["detail"]
        assert detail["code"] == "preparing" and detail["loc"] == ["body", "model"]
        assert "model: model 'conve-nations-demo' is being prepared" in detail["message"]
        assert 5 <= int(r.headers["Retry-After"]) <= 300
        r = api.post("/attributions", json={"model": "nrms-word-demo", "samples": [
            {"id": "a", "history": ["x"], "candidate": "y"}]})
        assert r.status_code == 503 and r.json()["detail"]["loc"] == ["body", "model"], r.text
        listed = api.get("/models").json()
        preparing = {m["name"]: m for m in listed["models"] if m["status"] == "preparing"}
        assert set(preparing) == {"conve-nations-demo", "nrms-word-demo"}
        assert preparing["conve-nations-demo"]["preparation"]["state"] == "preparing"
        assert preparing["nrms-word-demo"]["preparation"]["state"] == "pending"
        assert {d["name"] for d in listed["datasets"] if d["status"] == "preparing"} == {"nations"}
        assert _sdk_preparing(listed) == set(preparing)
        one = api.get("/models/nrms-word-demo")
        assert one.status_code == 200 and one.json()["preparation"]["state"] == "pending", one.text
        status = api.get("/status").json()["demo"]
        assert status["active"] and [s["state"] for s in status["steps"]] == ["ready", "preparing", "pending"]
        page = api.get("/ui/models").text
        assert "Being prepared" in page and "conve-nations-demo" in page
        form = api.get("/ui/new/attributions").text  # the form's picker says what is coming, and when
        assert "Still being prepared: nrms-word-demo (ready in about" in form
    # the demo process is gone: nothing is coming, the name is unknown again (not a 503 for ever)
    r = api.post("/tracin", json=TRACIN)
    assert r.status_code == 422 and "unknown model 'conve-nations-demo'" in r.text, r.text
    assert all(m["status"] == "ready" for m in api.get("/models").json()["models"])
    r = api.get("/models/nrms-word-demo")
    assert r.status_code == 404 and r.json()["detail"]["loc"] == ["path", "name"], r.text
    assert [s["state"] for s in api.get("/status").json()["demo"]["steps"]] == ["ready", "interrupted", "interrupted"]
    with _demo(redis, "preparing"):  # a dataset still to come, as well
        r = api.post("/ablations", json={"dataset": "lora-demo"})
        assert r.status_code == 503 and r.json()["detail"]["loc"] == ["body", "dataset"], r.text
        assert "dataset: dataset 'lora-demo' is being prepared" in r.json()["detail"]["message"]
        assert int(r.headers["Retry-After"]) >= 5
    assert api.post("/ablations", json={"dataset": "lora-demo"}).status_code == 422


def test_the_strip_and_the_workers_page_say_when_no_worker_runs(api, redis) -> None:
    strip = api.get("/ui/status")
    assert strip.status_code == 200
    assert "No worker is running" in strip.text and 'href="/ui/workers"' in strip.text
    with _demo(redis, "ready", "preparing"):
        strip = api.get("/ui/status").text
        assert "1 of 3 ready" in strip and "preparing <span class=\"mono\">conve-nations-demo</span>" in strip
        page = api.get("/ui/workers").text
        assert 'id="no-workers"' in page and 'id="demo-steps"' in page
    assert 'href="/ui/workers"' in api.get("/ui/jobs").text  # the nav links the workers page


# ------------------------------------------------------------------------------------------------ a live worker
@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    from core import registry
    from tests.service import Service

    home = tmp_path_factory.mktemp("status-workers")
    s = Service(home, queues=("explain,bulk",), api_keys="alice:status-key-alice-012345,bob:status-key-bob-012345",
                heartbeat_ttl_s=10, start=False)
    path = home / "models" / "counter"
    path.mkdir(parents=True)
    registry.register_model(s.settings, "counter", kind="test", loader="tests.jobkinds:load_counter_model", path=path,
                            preload=True)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def test_workers_lists_a_live_worker_with_its_loaded_model_and_no_server_path(svc) -> None:
    import time

    alice = {"Authorization": "Bearer status-key-alice-012345"}
    bob = {"Authorization": "Bearer status-key-bob-012345"}
    # runs until canceled at the end, so the worker is busy with it whatever the machine's load
    r = svc.client.post("/test/sleep", json={"steps": 10_000, "step_s": 0.1}, headers=alice)
    job_id = r.json()["id"]
    deadline = time.monotonic() + 120
    while svc.client.get(f"/jobs/{job_id}", headers=alice).json()["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    r = svc.client.get("/workers", headers=alice)
    assert r.status_code == 200
    data = r.json()
    [worker] = data["workers"]
    assert worker["queues"] == ["explain", "bulk"] and worker["state"] == "busy"
    assert [m["name"] for m in worker["models"]] == ["counter"]
    assert worker["rss_bytes"] > 10_000_000 and worker["last_heartbeat"]
    assert worker["current_job"] == {"id": job_id, "kind": "test_sleep", "yours": True}
    queues = {q["name"]: q for q in data["queues"]}
    assert queues["explain"]["workers"] == 1 and queues["train"]["workers"] == 0
    assert str(svc.home) not in r.text and "password" not in r.text
    # another key sees that the worker is busy, not with what
    other = svc.client.get("/workers", headers=bob).json()["workers"][0]["current_job"]
    assert other == {"id": None, "kind": None, "yours": False}
    # the dashboard's page
    svc.client.cookies.clear()
    svc.client.post("/ui/login", data={"api_key": "status-key-alice-012345", "next": "/ui/workers"})
    page = svc.client.get("/ui/workers")
    assert page.status_code == 200 and worker["name"] in page.text and "counter" in page.text
    assert f'href="/ui/jobs/{job_id}"' in page.text and str(svc.home) not in page.text
    strip = svc.client.get("/ui/status").text
    assert "No worker is running" not in strip and "counter" in strip
    svc.client.cookies.clear()
    svc.client.delete(f"/jobs/{job_id}", headers=alice)


# ------------------------------------------------------------------------------------- another tenant's model
ALICE = {"Authorization": "Bearer status-key-alice-012345"}
BOB = {"Authorization": "Bearer status-key-bob-012345"}
PRIVATE = "alice-private-kg"
PRIVATE_JOB = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"  # the job id her training would record
PRIVATE_PATH = "alice-data/secret-graph-7731"
PRIVATE_PARAMS = ("embedding_dim_secret", "hidden_dropout_secret")
PRIVATE_SOURCE = "alice-data/import-source-5521"


def _alice_model(svc) -> None:
    """Alice's model as a training or import job registers it (its meta: job id, dataset, configuration, source)."""
    from core import registry

    if registry.get_model(svc.settings, PRIVATE) is not None:
        return
    path = svc.home / "models" / PRIVATE
    path.mkdir(parents=True, exist_ok=True)
    registry.register_model(
        svc.settings, PRIVATE, kind="test", loader="tests.jobkinds:load_counter_model", path=path, owner="alice",
        parameters=4321,
        meta={"job_id": PRIVATE_JOB, "dataset": PRIVATE_PATH, "source": PRIVATE_SOURCE,
              "training": {PRIVATE_PARAMS[0]: 200, PRIVATE_PARAMS[1]: 0.3},
              "checkpoints": [{"file": "checkpoints/epoch_0001.safetensors", "epoch": 1, "lr": 0.01}],
              "test_mrr": 0.4321, "metrics": {"test": {"mrr": 0.4321, "hits@1": 0.3}}})


def _hidden_in(text: str) -> list[str]:
    return [s for s in (PRIVATE_JOB, PRIVATE_PATH, PRIVATE_SOURCE, *PRIVATE_PARAMS) if s in text]


def test_another_tenants_model_shows_its_name_kind_owner_version_and_metrics_only(svc) -> None:
    _alice_model(svc)
    r = svc.client.get("/models", headers=BOB)
    assert r.status_code == 200
    assert _hidden_in(r.text) == [], r.text
    seen = {m["name"]: m for m in r.json()["models"]}[PRIVATE]
    assert seen["details"] == "summary" and seen["owner"] == "alice" and seen["kind"] == "test"
    assert seen["version"] and seen["created_at"]
    assert seen["meta"] == {"test_mrr": 0.4321, "metrics": {"test": {"mrr": 0.4321, "hits@1": 0.3}}}
    assert "parameters" not in seen and "loaded_on" not in seen
    one = svc.client.get(f"/models/{PRIVATE}", headers=BOB)
    assert one.status_code == 200 and one.json() == seen and _hidden_in(one.text) == []
    # the service's own model is shown in full to everyone
    counter = {m["name"]: m for m in r.json()["models"]}["counter"]
    assert counter["details"] == "full" and "loaded_on" in counter
    # its owner sees all of it
    mine = svc.client.get(f"/models/{PRIVATE}", headers=ALICE).json()
    assert mine["details"] == "full" and mine["parameters"] == 4321 and mine["version"] == seen["version"]
    assert mine["meta"]["job_id"] == PRIVATE_JOB and mine["meta"]["dataset"] == PRIVATE_PATH
    assert set(mine["meta"]["training"]) == set(PRIVATE_PARAMS) and mine["meta"]["source"] == PRIVATE_SOURCE
    listed = svc.client.get("/models", headers=ALICE)
    assert len(_hidden_in(listed.text)) == 5
    assert svc.client.get("/models/no-such-model", headers=BOB).status_code == 404
    # the dashboard's models page: bob sees the model and its metric, alice the link to her job
    svc.client.cookies.clear()
    svc.client.post("/ui/login", data={"api_key": "status-key-bob-012345", "next": "/ui/models"})
    page = svc.client.get("/ui/models")
    assert page.status_code == 200 and f'id="model-{PRIVATE}"' in page.text and "0.4321" in page.text
    assert _hidden_in(page.text) == []
    svc.client.cookies.clear()
    svc.client.post("/ui/login", data={"api_key": "status-key-alice-012345", "next": "/ui/models"})
    page = svc.client.get("/ui/models")
    assert f'href="/ui/jobs/{PRIVATE_JOB}"' in page.text and PRIVATE_PATH in page.text
    svc.client.cookies.clear()


def test_workers_and_status_name_only_the_callers_own_models_and_jobs(svc) -> None:
    import time

    _alice_model(svc)
    # alice's job loads her model and runs until canceled at the end, whatever the machine's load
    r = svc.client.post("/test/sleep", json={"steps": 10_000, "step_s": 0.1, "model": PRIVATE}, headers=ALICE)
    job_id = r.json()["id"]
    try:
        deadline = time.monotonic() + 120
        while True:  # until the worker publishes that it holds her model
            worker = svc.client.get("/workers", headers=ALICE).json()["workers"][0]
            if PRIVATE in [m["name"] for m in worker["models"]] and worker["current_job"]["id"] == job_id:
                break
            assert time.monotonic() < deadline, worker
            time.sleep(0.2)
        for route in ("/workers", "/status"):
            r = svc.client.get(route, headers=BOB)
            assert r.status_code == 200 and PRIVATE not in r.text and job_id not in r.text, r.text
            [seen] = r.json()["workers"]
            assert [m["name"] for m in seen["models"]] == ["counter"] and seen["other_models"] == 1
            assert seen["current_job"] == {"id": None, "kind": None, "yours": False}
            assert seen["state"] == "busy"
        assert worker["other_models"] == 0 and "counter" in [m["name"] for m in worker["models"]]
        mine = svc.client.get("/status", headers=ALICE).text
        assert PRIVATE in mine and job_id in mine
        svc.client.cookies.clear()
        svc.client.post("/ui/login", data={"api_key": "status-key-bob-012345", "next": "/ui/workers"})
        for page in ("/ui/workers", "/ui/status"):
            text = svc.client.get(page).text
            assert PRIVATE not in text and job_id not in text and "counter" in text
        assert "1 of other owners" in svc.client.get("/ui/workers").text
    finally:
        svc.client.cookies.clear()
        svc.client.delete(f"/jobs/{job_id}", headers=ALICE)


@pytest.mark.slow
def test_a_stopped_demo_says_at_once_that_it_no_longer_runs(redis_settings) -> None:
    """``explainq up`` stops the demo with SIGTERM: its record is closed then, not 30 s later when the key expires."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import redis as redis_lib

    r = redis_lib.Redis.from_url(redis_settings.redis_url)
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "EXPLAINQ_HOME": str(redis_settings.home), "REDIS_URL": redis_settings.redis_url,
           "PYTHONPATH": str(root)}
    proc = subprocess.Popen([sys.executable, "-m", "explainq.cli", "demo", "--only", "conve-nations-demo"], env=env,
                            cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while demo_status.read(r)["counts"]["preparing"] != 1:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    status = demo_status.read(r)
    assert not status["active"] and r.ttl(keys.DEMO_ALIVE) == -2
    assert [s["state"] for s in status["steps"]] == ["interrupted"]
