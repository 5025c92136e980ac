"""The one function RQ runs for every job: build the context, call the kind's job function, record failures."""

from __future__ import annotations

import logging
import traceback
from datetime import UTC, datetime
from typing import Any

from rq import get_current_job
from rq.timeouts import JobTimeoutException

from app.settings import Settings
from workers.context import JobCanceled, JobContext, JobError, WorkerShutdown
from workers.model_cache import ModelCache, UnknownModel, import_object

log = logging.getLogger("explainq.jobs")

# Set by the worker at start: the settings, the device and the preloaded models shared by all jobs.
STATE: dict[str, Any] = {"settings": None, "models": None, "device": None}
# Jobs that ended through cancellation or shutdown; the worker maps their failure onto canceled / requeued.
OUTCOMES: dict[str, str] = {}


def _state() -> tuple[Settings, ModelCache]:
    if STATE["settings"] is None:
        from models.common import default_device

        settings = Settings()
        device = default_device()
        STATE.update(settings=settings, device=device, models=ModelCache(settings, device))
    return STATE["settings"], STATE["models"]


def execute(func_path: str, kind: str, payload: dict[str, Any]) -> Any:
    job = get_current_job()
    settings, models = _state()
    ctx = JobContext(settings, job, models, STATE["device"])

    def fail(code: str, message: str) -> None:
        if job is not None:
            job.meta["error"] = {"code": code, "message": message}
            job.save_meta()

    published = False
    try:
        ctx.check_canceled()
        func = import_object(func_path)
        result = func(payload, ctx)
        try:
            ctx.publish_artifacts()
        except Exception as exc:
            raise JobError("store_unavailable", f"the job finished but its files could not be written to the "
                           f"store: {type(exc).__name__}: {exc}") from exc
        published = True
        return result
    except JobCanceled:
        if job is not None:
            OUTCOMES[job.id] = "canceled"
            job.meta["canceled"] = True
            job.meta["canceled_at"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            job.save_meta()
        raise
    except WorkerShutdown:
        if job is not None:
            OUTCOMES[job.id] = "requeue"
        raise
    except JobError as exc:
        fail(exc.code, exc.message)
        raise
    except UnknownModel as exc:
        fail("unknown_model", f"model {exc.args[0]!r} is not registered on this server")
        raise
    except JobTimeoutException:
        fail("timeout", f"the {kind} job exceeded its time limit of {job.timeout if job else '?'} s")
        raise
    except MemoryError:
        fail("out_of_memory", "the job ran out of memory; use smaller batches or fewer samples")
        raise
    except Exception as exc:
        name = type(exc).__name__
        if name == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError, matched without importing torch here
            fail("out_of_memory", f"the device ran out of memory: {exc}; use smaller batch sizes")
        else:
            fail("internal", f"{name}: {exc}")
        log.error("job %s (%s) failed:\n%s", job.id if job else "-", kind, traceback.format_exc())
        raise
    finally:
        _finish_artifacts(ctx, published)


def _finish_artifacts(ctx: JobContext, published: bool) -> None:
    """Keep what a failed or canceled job wrote (a checkpoint to resume from, say), then drop the scratch copy."""
    try:
        if not published:
            ctx.publish_artifacts()
        ctx.cleanup()
    except Exception:  # the job's own outcome stands; the scratch copy stays for the next gc pass
        log.exception("could not publish the artifacts of job %s", ctx.job_id)
