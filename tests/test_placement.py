"""Placement (core/placement.py): a job goes only to a worker class that can run it.

The classes are the operators' table (``EXPLAINQ_WORKER_CLASSES``); a job's needs are its ``requirements`` and the
memory its kind estimates. The service tests run two workers of different classes on this CPU-only machine: a CPU
class and a GPU class whose worker declares a GPU it does not have (``EXPLAINQ_WORKER_RESOURCES``), which is
enough for placement (it only reads what workers offer; the jobs themselves run on the CPU).
"""

from __future__ import annotations

import json
import time

import pytest

from core import placement
from core.contract.errors import FieldError
from core.contract.fields import Requirements
from core.placement import GIB, Offer, fits, hand_on_queue, parse_classes, place, worker_offer
from core.settings import Settings

TWO = {"cpu": {"queues": ["explain", "bulk", "train"], "memory_gib": 1},
       "gpu": {"queues": ["explain", "bulk", "train"], "gpu": True, "gpu_memory_gib": 40, "memory_gib": 32}}
SIMULATED_GPU = json.dumps({"gpu": True, "gpu_memory_gib": 40, "gpu_name": "simulated"})


def settings(classes=TWO, **extra) -> Settings:
    return Settings(EXPLAINQ_WORKER_CLASSES=json.dumps(classes) if classes is not None else "", **extra)


# ---------------------------------------------------------------------------------------------- the table
@pytest.mark.parametrize(("raw", "says"), [
    ("{not json", "not JSON"),
    ("[]", "must be a JSON object"),
    (json.dumps({"cpu": {"queues": ["nope"]}}), "queues ['nope']"),
    (json.dumps({"cpu": {"queues": []}}), "queues"),
    (json.dumps({"gpu": {"queues": ["train"], "gpu": True}}), "gpu_memory_gib"),
    (json.dumps({"cpu": {"queues": ["train"], "gpu_memory_gib": 8}}), "needs gpu: true"),
    (json.dumps({"Big GPU": {"queues": ["train"]}}), "class name"),
    (json.dumps({"cpu": {"queues": ["train"], "cores": 4}}), "cores"),
])
def test_a_bad_class_table_is_refused_naming_the_variable(raw, says):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="EXPLAINQ_WORKER_CLASSES") as caught:
        Settings(EXPLAINQ_WORKER_CLASSES=raw)
    assert says in str(caught.value)


def test_every_class_queue_is_a_queue_of_the_service():
    s = settings()
    assert placement.all_queues(s) == ("explain", "bulk", "train", "explain@cpu", "bulk@cpu", "train@cpu",
                                       "explain@gpu", "bulk@gpu", "train@gpu")
    wc = parse_classes(s.worker_classes_raw)["gpu"]
    assert placement.serving_queues(wc, ["explain", "bulk"]) == ["explain@gpu", "explain", "bulk@gpu", "bulk"]
    assert placement.serving_queues(None, ["train"]) == ["train"]


# ---------------------------------------------------------------------------------------------- placing
def test_a_job_every_class_can_run_goes_to_the_plain_queue_any_worker_takes():
    s = settings()
    assert place(s, "train", None) == placement.Placement("train")
    assert place(s, "train", Requirements(), 512 * 2**20).queue == "train"  # fits both


@pytest.mark.parametrize(("requirements", "memory", "queue"), [
    ({"gpu": True}, 0, "train@gpu"),
    ({"gpu": False}, 0, "train@cpu"),
    ({"gpu_memory_gib": 24}, 0, "train@gpu"),
    ({"device_class": "cpu"}, 0, "train@cpu"),  # a named class: its own queue, even where both could run it
    ({}, 4 * GIB, "train@gpu"),  # over the CPU class's 1 GiB: only the GPU class's 40 GiB hold it
])
def test_a_job_only_some_classes_can_run_goes_to_the_smallest_of_them(requirements, memory, queue):
    placed = place(settings(), "train", Requirements(**requirements), memory)
    assert placed.queue == queue and placed.worker_class == queue.split("@")[1]
    assert placed.needs == {**requirements, **({"memory_bytes": memory} if memory else {})}


def test_the_smallest_able_class_wins():
    three = {**TWO, "gpu-big": {"queues": ["train"], "gpu": True, "gpu_memory_gib": 80}}
    assert place(settings(three), "train", Requirements(gpu=True)).queue == "train@gpu"
    assert place(settings(three), "train", Requirements(gpu_memory_gib=48)).queue == "train@gpu-big"
    assert place(settings(three), "train", Requirements(), 50 * GIB).queue == "train@gpu-big"


@pytest.mark.parametrize(("requirements", "memory", "loc", "says"), [
    ({"gpu_memory_gib": 80}, 0, ("body", "requirements", "gpu_memory_gib"), "gpu (GPU with 40 GiB)"),
    ({"device_class": "tpu"}, 0, ("body", "requirements", "device_class"), "cpu (no GPU, 1 GiB)"),
    ({"gpu": False}, 4 * GIB, ("body", "requirements"), "4.0 GiB"),
])
def test_needs_no_class_meets_are_a_422_naming_the_requirement_and_what_the_classes_offer(requirements, memory,
                                                                                          loc, says):
    with pytest.raises(FieldError) as caught:
        place(settings(), "train", Requirements(**requirements), memory)
    assert caught.value.loc == loc and says in caught.value.message


def test_without_classes_no_requirement_can_be_stated_and_memory_is_the_global_budget():
    s = settings(None, EXPLAINQ_WORKER_MEMORY_BYTES=str(3 * GIB))
    assert place(s, "train", None, 10 * GIB) == placement.Placement("train")
    with pytest.raises(FieldError, match="no worker classes") as caught:
        place(s, "train", Requirements(gpu=True))
    assert caught.value.loc == ("body", "requirements", "gpu")
    with placement.admitting(s, "train", None) as admission:
        assert placement.memory_budget(s, 2 * GIB) == 3 * GIB
    assert admission.memory_bytes == 2 * GIB


def test_the_memory_budget_is_the_largest_of_the_classes_that_could_take_the_request():
    s = settings()
    with placement.admitting(s, "train", None) as admission:
        assert placement.memory_budget(s, GIB) == 40 * GIB  # the GPU class's memory
        placement.memory_budget(s, 3 * GIB)
    assert admission.memory_bytes == 3 * GIB  # the most any check needed
    with placement.admitting(s, "train", Requirements(gpu=False)):
        assert placement.memory_budget(s, GIB) == 1 * GIB  # only the CPU class may take it
    assert placement.memory_budget(s, GIB) == s.worker_memory_bytes  # outside an admission: the global budget


# ---------------------------------------------------------------------------------------------- pick-up
def _offer(s: Settings, name: str | None, **detected) -> Offer:
    return worker_offer(s, name, detected or {"gpu": False})


def test_a_worker_checks_what_it_is_handed_and_says_why_not():
    s = settings()
    cpu, gpu = _offer(s, "cpu"), _offer(s, "gpu", gpu=True, gpu_memory_bytes=40 * GIB, gpu_name="x")
    on_gpu = place(s, "train", Requirements(gpu=True)).meta()
    assert fits(gpu, on_gpu) is None and fits(cpu, on_gpu) == "it was placed on class 'gpu'"
    anywhere_with_memory = {"queue": "train", "class": None, "needs": {"memory_bytes": 4 * GIB}}
    assert fits(gpu, anywhere_with_memory) is None
    assert "more than this worker's 1.0" in fits(cpu, anywhere_with_memory)
    assert fits(cpu, None) is None and fits(cpu, {}) is None  # a job placed before placement existed
    unclassed = worker_offer(s, None, {"gpu": False})
    assert fits(unclassed, {"queue": "train", "class": None, "needs": {"gpu": True}}) == "it needs a GPU"


def test_a_job_is_handed_on_to_the_class_that_can_run_it_and_never_back():
    s = settings()
    needs_gpu = {"queue": "train", "class": None, "needs": {"gpu": True}}
    assert hand_on_queue(s, "train", needs_gpu) == "train@gpu"
    assert hand_on_queue(s, "train@gpu", needs_gpu) is None  # it is where it belongs: no round trip
    assert hand_on_queue(s, "train", {"needs": {"gpu_memory_gib": 80}}) is None  # nowhere


def test_a_worker_with_less_than_its_class_promises_does_not_start():
    s = settings()
    with pytest.raises(ValueError, match="promises a GPU and this worker has none"):
        worker_offer(s, "gpu", {"gpu": False})
    with pytest.raises(ValueError, match="promises 40 GiB of GPU memory"):
        worker_offer(s, "gpu", {"gpu": True, "gpu_memory_bytes": 16 * GIB})
    with pytest.raises(ValueError, match="not in EXPLAINQ_WORKER_CLASSES"):
        worker_offer(s, "tpu", {"gpu": False})
    declared = worker_offer(settings(EXPLAINQ_WORKER_RESOURCES=SIMULATED_GPU), "gpu", {"gpu": False})
    assert declared.gpu and declared.declared and declared.memory_bytes == 40 * GIB
    assert declared.describe()["gpu_name"] == "simulated"
    with pytest.raises(ValueError, match="EXPLAINQ_WORKER_RESOURCES"):
        worker_offer(settings(EXPLAINQ_WORKER_RESOURCES='{"gpu": "many"}'), "gpu", {})


# ---------------------------------------------------------------------------------------------- the API
TINY_CONVE = {"epochs": 1, "batch_size": 128, "embedding_dim": 200, "num_filters": 32}
BIG_CONVE = {"epochs": 1, "batch_size": 1024, "embedding_dim": 1000, "num_filters": 64}  # about 10 GiB


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    from tests.service import api_client

    home = tmp_path_factory.mktemp("placement-api")
    with api_client(home, EXPLAINQ_WORKER_CLASSES=json.dumps(TWO)) as client:
        yield client


def test_the_api_places_a_job_by_its_memory_estimate_and_its_requirements(api):
    small = api.post("/train/conve", json={"name": "small-model", **TINY_CONVE})
    assert small.status_code == 202, small.text
    assert small.json()["queue"] == "train" and small.json()["position"] == 0
    big = api.post("/train/conve", json={"name": "big-model", **BIG_CONVE})
    assert big.status_code == 202, big.text
    assert big.json()["queue"] == "train@gpu" and big.json()["position"] == 0  # only the 40 GiB class holds it
    on_cpu = api.post("/train/conve", json={"name": "cpu-model", **TINY_CONVE, "requirements": {"gpu": False}})
    assert on_cpu.json()["queue"] == "train@cpu", on_cpu.text


@pytest.mark.parametrize(("body", "loc", "says"), [
    # the memory checks name the request's own fields, compared with the classes that could take it
    ({**BIG_CONVE, "requirements": {"gpu": False}}, None, "more than the 1.0 GiB the worker classes that can take it"),
    ({**TINY_CONVE, "embedding_dim": 4096, "num_filters": 1024, "batch_size": 4096}, None,
     "more than the 40.0 GiB the worker classes that can take it (EXPLAINQ_WORKER_CLASSES)"),
    ({**TINY_CONVE, "requirements": {"gpu_memory_gib": 80}}, ["body", "requirements", "gpu_memory_gib"],
     "they offer: cpu (no GPU, 1 GiB), gpu (GPU with 40 GiB)"),
    ({**TINY_CONVE, "requirements": {"device_class": "tpu"}}, ["body", "requirements", "device_class"],
     "no worker class that serves queue 'train' can run it"),
    ({**TINY_CONVE, "requirements": {"device_class": "Not A Class"}}, ["body", "requirements", "device_class"],
     "pattern"),
    ({**TINY_CONVE, "requirements": {"gpu_memory_gib": -1}}, ["body", "requirements", "gpu_memory_gib"], "greater"),
    ({**TINY_CONVE, "requirements": {"cores": 4}}, ["body", "requirements", "cores"], "Extra inputs"),
])
def test_a_job_no_class_can_run_is_a_422_naming_the_field(api, body, loc, says):
    r = api.post("/train/conve", json={"name": "refused-model", **body})
    assert r.status_code == 422, r.text
    found = [d for d in r.json()["detail"] if loc is None or d["loc"] == loc]
    assert found and says in found[0]["msg"], r.text
    assert found[0]["loc"][0] == "body"


def test_requirements_travel_with_the_job(api):
    r = api.post("/train/conve", json={"name": "kept-model", **TINY_CONVE, "requirements": {"gpu": True}})
    assert r.status_code == 202, r.text
    store = api.app.state.store
    assert store.request_of(r.json()["id"])["requirements"] == {"gpu": True, "gpu_memory_gib": None,
                                                                "device_class": None}
    meta = json.loads(store.redis.hget(f"rq:job:{r.json()['id']}", "meta"))
    assert meta["placement"]["queue"] == "train@gpu" and meta["placement"]["class"] == "gpu"
    assert meta["placement"]["needs"]["gpu"] is True and meta["placement"]["needs"]["memory_bytes"] > 0
    plain = api.post("/train/conve", json={"name": "plain-model", **TINY_CONVE}).json()["id"]
    assert "requirements" not in store.request_of(plain)  # a job that states none is stored as before


# ---------------------------------------------------------------------------------------------- two workers
def _ran_on(svc, job_id: str) -> str:
    return svc.redis().hget(f"rq:job:{job_id}", "worker_name").decode()


def _names(svc) -> dict[str, str]:
    """Worker name (host.pid) -> the class it advertises (GET /workers)."""
    workers = svc.client.get("/workers").json()["workers"]
    return {w["name"]: (w.get("offer") or {}).get("class") for w in workers}


@pytest.mark.slow
def test_two_workers_of_different_classes_take_only_the_jobs_they_can_run(tmp_path):
    from tests.fanjobs import PLUGINS
    from tests.service import Service

    env = {"EXPLAINQ_WORKER_CLASSES": json.dumps(TWO), "EXPLAINQ_KIND_PLUGINS": PLUGINS}
    svc = Service(tmp_path, queues=(), env=env, start=False)
    svc.start()
    svc.start_worker("explain,bulk,train", ("--class", "cpu"))
    svc.start_worker("explain,bulk,train", ("--class", "gpu"), env={"EXPLAINQ_WORKER_RESOURCES": SIMULATED_GPU})
    try:
        svc.wait_for_workers(2)
        deadline = time.monotonic() + 30
        while len(_names(svc)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        by_class = {c: n for n, c in _names(svc).items()}
        assert set(by_class) == {"cpu", "gpu"}, _names(svc)
        offers = {w["offer"]["class"]: w["offer"] for w in svc.client.get("/workers").json()["workers"]}
        assert offers["gpu"]["gpu"] and offers["gpu"]["gpu_memory_bytes"] == 40 * GIB and offers["gpu"]["declared"]
        assert not offers["cpu"]["gpu"] and offers["cpu"]["memory_budget_bytes"] == GIB
        c = svc.client

        wanted = {"gpu": {"gpu": True}, "cpu": {"gpu": False}}
        jobs = {}
        for cls, req in wanted.items():
            for _ in range(3):
                r = c.post("/test/train-sleep", json={"steps": 1, "step_s": 0.05, "requirements": req})
                assert r.status_code == 202 and r.json()["queue"] == f"train@{cls}", r.text
                jobs[r.json()["id"]] = cls
        for job_id, cls in jobs.items():
            assert svc.wait(job_id)["status"] == "succeeded", svc.worker_logs()[-3000:]
            assert _ran_on(svc, job_id) == by_class[cls], (job_id, cls)

        # A fan-out that needs a GPU: planned on the GPU class, its shards and reduce step on bulk@gpu only.
        r = c.post("/test/fan", json={"n": 6, "step_s": 0.02, "requirements": {"gpu": True}})
        assert r.status_code == 202 and r.json()["queue"] == "explain@gpu", r.text
        parent = r.json()["id"]
        assert svc.wait(parent)["status"] == "succeeded", svc.worker_logs()[-3000:]
        children = [j["id"] for j in c.get(f"/jobs?parent={parent}&limit=50").json()["items"]]
        assert len(children) == 7, children  # six shards and the reduce step
        for child in children:
            assert svc.redis().hget(f"rq:job:{child}", "origin") == b"bulk@gpu"
            assert _ran_on(svc, child) == by_class["gpu"], child
        assert svc.redis().scard("explainq:backlog:pending:bulk@gpu") == 0
    finally:
        svc.stop()


@pytest.mark.slow
def test_a_job_a_worker_cannot_run_is_handed_on_once_or_failed_never_spun(tmp_path):
    """Jobs queued on the plain queue with needs only the GPU class meets (as a job queued before the classes
    changed would be): the CPU worker hands the first on to train@gpu unrun, where it waits until a GPU worker
    starts; the second needs more than any class has, and fails as no_capable_worker at its first pick-up."""
    from core.jobstore import JobStore
    from core.placement import Placement
    from tests.service import Service

    env = {"EXPLAINQ_WORKER_CLASSES": json.dumps(TWO)}
    svc = Service(tmp_path, queues=(), env=env, start=False)
    svc.start()
    svc.start_worker("train", ("--class", "cpu"))
    try:
        svc.wait_for_workers(1)
        from core.contract.kind import KINDS

        kind = KINDS["test_train_sleep"]
        store = JobStore(svc.redis(), svc.settings)
        body = {"steps": 1, "step_s": 0.05}
        handed, _ = store.submit_with_view(kind, body, "anonymous", None, Placement("train", None, {"gpu": True}))[:2]
        nowhere = store.submit_with_view(kind, body, "anonymous", None,
                                         Placement("train", None, {"gpu_memory_gib": 80}))[0]
        assert svc.wait(nowhere)["error"]["code"] == "no_capable_worker", svc.worker_logs()[-3000:]
        r = svc.redis()
        deadline = time.monotonic() + 30
        while r.lrange("rq:queue:train@gpu", 0, -1) != [handed.encode()] and time.monotonic() < deadline:
            time.sleep(0.1)
        view = svc.client.get(f"/jobs/{handed}").json()
        assert view["status"] == "queued" and view["queue"] == "train@gpu" and view["position"] == 0, view
        assert r.hget(f"rq:job:{handed}", "started_at") in (None, b"")  # never started on the CPU worker
        svc.start_worker("train", ("--class", "gpu"), env={"EXPLAINQ_WORKER_RESOURCES": SIMULATED_GPU})
        assert svc.wait(handed)["status"] == "succeeded", svc.worker_logs()[-3000:]
        assert svc.worker_logs().count(f"job {handed} handed on") == 1
    finally:
        svc.stop()
