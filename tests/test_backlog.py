"""The backlog autoscalers read: a fan-out's shards that wait for their owner's window outside RQ's queue count,
in Redis (``core/backlog.py``'s keys, what KEDA's redis scaler reads) and in ``GET /metrics``
(``explainq_backlog``), exactly as they are planned, released, run and torn down."""

from __future__ import annotations

import time

from core import keys
from core.backlog import PENDING, QUEUED, RUNNING, scaler_keys
from tests.fanjobs import PLUGINS
from tests.fanjobs import register as register_fan_kinds
from tests.test_metrics import scrape, value

register_fan_kinds()  # the API process must know the route before the app is created


def _read(r, parents: list[str]) -> tuple[int, set[bytes], set[bytes], int]:
    """In one transaction: the bulk queue's length, the pending set, the union of the parents' pending lists and
    the running count."""
    k = scaler_keys("bulk")
    with r.pipeline(transaction=True) as pipe:
        pipe.llen(k[QUEUED])
        pipe.smembers(k[PENDING])
        for p in parents:
            pipe.lrange(keys.fanout_pending(p), 0, -1)
        pipe.zcard(k[RUNNING])
        queued, pending, *lists, running = pipe.execute()
    return queued, pending, {m for lst in lists for m in lst}, running


def test_the_backlog_counts_pending_shards_that_the_queue_does_not(tmp_path):
    from tests.service import Service

    env = {"EXPLAINQ_KIND_PLUGINS": PLUGINS, "EXPLAINQ_SHARD_WINDOW": "2"}
    with Service(tmp_path, queues=("explain,bulk",), env=env) as svc:
        c, r = svc.client, svc.redis()
        first = c.post("/test/fan", json={"n": 12, "step_s": 0.4}).json()["id"]
        second = c.post("/test/fan", json={"n": 12, "step_s": 0.4}).json()["id"]
        parents = [first, second]
        widest = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            queued, pending, lists, running = _read(r, parents)
            assert pending == lists  # the set is exactly the shards in the parents' pending lists
            assert queued <= 2 and running <= 1  # the window holds RQ's queue down to two shards
            samples = scrape(c)
            depth = value(samples, "explainq_queue_depth", queue="bulk")
            backlog = value(samples, "explainq_backlog", queue="bulk")
            assert backlog >= depth
            widest = max(widest, backlog - depth)
            if r.hget(f"rq:job:{first}", "status") == b"finished" and backlog >= 16:
                break  # both planned: 24 shards, at most 2 on the queue and 1 running
            time.sleep(0.05)
        assert widest >= 16, widest
        assert value(samples, "explainq_jobs_running", queue="bulk") <= 1

        # Canceling one parent takes its pending shards out of the backlog at once; the other runs to the end.
        assert c.delete(f"/jobs/{first}").status_code == 202
        assert svc.wait(first)["status"] == "canceled"
        _, pending, _, _ = _read(r, parents)
        assert not any(m.decode().startswith(first) for m in pending)
        while True:
            queued, pending, lists, _ = _read(r, parents)
            assert pending == lists
            if not pending:
                break
            time.sleep(0.05)
        assert svc.wait(second, timeout_s=120)["status"] == "succeeded"
        samples = scrape(c)
        assert value(samples, "explainq_backlog", queue="bulk") == 0
        assert r.scard(scaler_keys("bulk")[PENDING]) == 0


def test_a_32_shard_job_with_no_bulk_worker_is_backlog_with_its_estimated_cost(tmp_path):
    """Only an explain worker: the parent plans its 32 shards, the window lets one onto ``bulk`` and 31 wait in the
    pending set; nothing runs them. The backlog counts all 32, at the default cost until a shard of the kind has
    ended, then at that kind's mean run time, in ``GET /metrics`` and in Redis."""
    from core.metrics import record_finished
    from tests.service import Service

    env = {"EXPLAINQ_KIND_PLUGINS": PLUGINS, "EXPLAINQ_BACKLOG_UNKNOWN_COST_S": "7"}
    with Service(tmp_path, queues=("explain",), env=env) as svc:
        c, r = svc.client, svc.redis()
        parent = c.post("/test/fan", json={"n": 32}).json()["id"]
        deadline = time.monotonic() + 60
        while r.hget(f"rq:job:{parent}", "status") != b"finished" and time.monotonic() < deadline:
            time.sleep(0.1)
        queued, pending, _, running = _read(r, [parent])
        assert (queued, len(pending), running) == (1, 31, 0)
        assert value(scrape(c), "explainq_queue_depth", queue="bulk") == 1
        samples = scrape(c)
        assert value(samples, "explainq_backlog", queue="bulk") == 32
        assert value(samples, "explainq_backlog_seconds", queue="bulk") == 32 * 7.0
        assert value(samples, "explainq_backlog_unestimated", queue="bulk") == 32
        assert float(r.hget(keys.BACKLOG_SECONDS, "bulk")) == 32 * 7.0

        # shards of the kind ended elsewhere at 2 s and 3 s: each waiting shard costs their mean
        record_finished(r, "test_fan_shard", "succeeded", 2.0)
        record_finished(r, "test_fan_shard", "succeeded", 3.0)
        train = c.post("/test/train-sleep", json={"steps": 1}).json()["id"]  # no train worker: it waits
        record_finished(r, "test_train_sleep", "failed", 40.0)
        samples = scrape(c)
        assert value(samples, "explainq_backlog_seconds", queue="bulk") == 32 * 2.5
        assert value(samples, "explainq_backlog_unestimated", queue="bulk") == 0
        assert value(samples, "explainq_backlog_seconds", queue="train") == 40.0
        assert value(samples, "explainq_backlog_seconds", queue="explain") == 0
        assert float(r.hget(keys.BACKLOG_SECONDS, "bulk")) == 80.0
        assert float(r.hget(keys.BACKLOG_SECONDS, "train")) == 40.0
        assert abs(float(r.hget(keys.BACKLOG_SECONDS, "at")) - time.time()) < 60
        assert c.delete(f"/jobs/{train}").status_code in (200, 202)
        assert c.delete(f"/jobs/{parent}").status_code == 202
        assert svc.wait(parent)["status"] == "canceled"
        samples = scrape(c)
        assert value(samples, "explainq_backlog_seconds", queue="bulk") == 0
