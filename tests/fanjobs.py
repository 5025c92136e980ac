"""A cheap fan-out kind for tests and benchmarks (the product registers none of these).

``POST /test/fan`` plans ``n`` items into shards of ``shard_size`` through the product's own fan-out
(``workers.fanout.fan_out``): each shard sleeps ``step_s`` in four progress steps (so a cancel stops it) and writes
its ``done.json`` like a real shard; the reduce step counts the items of the shards that finished. ``plan_delay_s``
slows the planning down per shard, to cancel a parent while it plans; ``fail`` names shards that fail.

Workers load it with ``EXPLAINQ_KIND_PLUGINS=tests.jobkinds:register_test_kinds,tests.fanjobs:register``.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from core.contract.kind import FanOut, JobKind, ReduceRequest, ShardRequest
from core.contract.kind import register as register_kind

PLUGINS = "tests.jobkinds:register_test_kinds,tests.fanjobs:register"


class FanRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = Field(8, ge=1, le=1_000_000)
    shard_size: int = Field(1, ge=1)
    step_s: float = Field(0.05, ge=0, le=60)
    plan_delay_s: float = Field(0.0, ge=0, le=1)
    fail: list[int] = Field(default_factory=list)
    shard_retries: int = Field(0, ge=0, le=5)
    max_failed_fraction: float = Field(0.01, ge=0, le=1)


def run(request: FanRequest, ctx: Any) -> Any:
    from workers.fanout import fan_out

    if request.n <= request.shard_size:
        return {"n": request.n, "shards": 0}

    def slowly(carried: dict[str, Any], start: int, end: int) -> tuple[dict[str, Any], int, int]:
        if request.plan_delay_s:
            time.sleep(request.plan_delay_s)
        return carried, start, end

    return fan_out(ctx, "test_fan", request, request.n, request.shard_size, retries=request.shard_retries,
                   max_failed_fraction=request.max_failed_fraction, shard_items=slowly)


def run_shard(shard: ShardRequest[FanRequest], ctx: Any) -> dict[str, Any]:
    from workers.context import JobError
    from workers.fanout import run_shard as run_once

    def work() -> dict[str, Any]:
        t0 = time.time()
        for k in range(4):
            time.sleep(shard.request.step_s / 4)
            ctx.progress(k + 1, 4, "steps")
        if shard.index in shard.request.fail:
            raise JobError("bad_shard", f"shard {shard.index} fails on purpose")
        return {"n": shard.end - shard.start, "index": shard.index, "started": t0}

    return run_once(ctx, work)


def run_reduce(reduce: ReduceRequest[FanRequest], ctx: Any) -> dict[str, Any]:
    from workers.context import JobError
    from workers.fanout import shard_done

    n_done, failed = 0, []
    for i in range(reduce.shards):
        done = shard_done(ctx, reduce.parent, i)
        if done is None:
            failed.append(i)
        else:
            n_done += done["n"]
    n = reduce.request.n
    if n and (n - n_done) / n > reduce.request.max_failed_fraction:
        raise JobError("too_many_failures", f"{n - n_done} of {n} items failed")
    return {"n": n_done, "failed": failed}


def register() -> None:
    register_kind(JobKind(name="test_fan", route="/test/fan", request=FanRequest, queue="explain",
                          func="tests.fanjobs:run", timeout_s=600, summary="test only",
                          fanout=FanOut(unit="items", shard="tests.fanjobs:run_shard",
                                        reduce="tests.fanjobs:run_reduce", timeout_s=600)))


def die_after_first_shard_end() -> None:
    """A worker plugin that injects a fault: the first time a shard ends on this worker, right after RQ recorded
    its end and before anything else runs, the process exits. Once per ``EXPLAINQ_HOME`` (a marker file says it
    happened), so workers started later run normally."""
    import os
    from pathlib import Path

    from rq import SimpleWorker

    if "EXPLAINQ_HOME" not in os.environ:  # the API process of a test (its hooks are called there too): no worker
        return
    marker = Path(os.environ["EXPLAINQ_HOME"]) / "fault-fired"
    if marker.exists():
        return
    original = SimpleWorker.handle_job_success

    def handle_job_success(self, job, queue, started_job_registry, execution=None):
        original(self, job, queue, started_job_registry, execution)
        if "shard" in (job.meta or {}) and not marker.exists():
            marker.write_text("1")
            os._exit(1)

    SimpleWorker.handle_job_success = handle_job_success
