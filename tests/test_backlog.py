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
