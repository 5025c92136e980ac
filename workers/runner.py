"""The one function RQ runs for every job: look the kind up, build the context, call the job function.

Nothing read from Redis decides what code runs: the job names a kind, and the function comes from this worker's own
kind table (``core.contract.kind.load_kinds``: the product's kinds and the ``EXPLAINQ_KIND_PLUGINS`` hooks, as the
API loads them). The payload is validated again against the kind's request schema, and the job function receives
that validated request object (a shard or reduce step's request with the fields it reads from its parent filled
in). What it returns is its kind's result model (or a fan-out plan); the job's meta records ``result_schema``, the
model the result was validated against, so the API serves it as that model. Results, progress and metrics never
carry NaN or infinity.
"""

from __future__ import annotations

import logging
import time
import traceback
import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ValidationError
from rq import get_current_job
from rq.timeouts import JobTimeoutException

from core import results
from core.contract.kind import JobKind, ReduceRequest, ShardRequest, load_kinds
from core.filestore import StoreUnavailable
from core.logs import job_logging
from core.settings import Settings
from workers.context import JobCanceled, JobContext, JobError, JobLost, WorkerShutdown, json_safe
from workers.model_cache import ModelCache, UnknownModel, import_object

log = logging.getLogger("explainq.jobs")

# The only function a worker runs; any other RQ job is refused (see workers/worker.py).
RUNNER = "workers.runner.execute"

# Set by the worker at start: the settings, the device and the preloaded models shared by all jobs.
STATE: dict[str, Any] = {"settings": None, "models": None, "device": None}
# Jobs that ended through cancellation, shutdown or loss; the worker maps their failure onto canceled / requeued.
OUTCOMES: dict[str, str] = {}


def _state() -> tuple[Settings, ModelCache]:
    if STATE["settings"] is None:
        from models.common import default_device

        settings = Settings()
        device = default_device()
        STATE.update(settings=settings, device=device, models=ModelCache(settings, device))
    return STATE["settings"], STATE["models"]


def kind_table(settings: Settings) -> dict[str, JobKind]:
    """This worker's kinds: the product's, plus those the ``EXPLAINQ_KIND_PLUGINS`` hooks register (once each)."""
    return load_kinds(settings)


def unpack_args(args: tuple[Any, ...]) -> tuple[str, dict[str, Any]]:
    """``(kind, payload)``; the older ``(func_path, kind, payload)`` is accepted and its function path ignored."""
    if len(args) == 3:
        args = args[1:]
    if len(args) != 2 or not isinstance(args[0], str) or not isinstance(args[1], dict):
        raise JobError("unknown_kind", "the job's arguments are not (kind, payload)")
    return args[0], args[1]


def _invalid(kind_name: str, exc: ValidationError) -> JobError:
    fields = ", ".join(".".join(str(p) for p in e["loc"]) or "<body>" for e in exc.errors()[:5])
    return JobError("invalid_payload", f"the {kind_name} payload does not match its schema ({fields})")


def resolve(settings: Settings, kind_name: str, payload: dict[str, Any]) -> tuple[JobKind, BaseModel]:
    """The registered kind ``kind_name`` and ``payload`` validated against its request schema."""
    spec = kind_table(settings).get(kind_name)
    if spec is None:
        raise JobError("unknown_kind", f"kind {kind_name!r} is not registered on this worker")
    try:
        return spec, spec.request.model_validate(payload)
    except ValidationError as exc:
        raise _invalid(kind_name, exc) from exc


def with_parent_fields(spec: JobKind, request: BaseModel, payload: dict[str, Any], job: Any) -> BaseModel:
    """A shard's or reduce step's request with the fields it reads from its parent job (``from_parent``) filled
    in from the parent's payload, validated again."""
    if not isinstance(request, ShardRequest | ReduceRequest) or not request.from_parent:
        return request
    from workers.fanout import parent_payload

    parent = parent_payload(job, request.parent)
    inner = {**request.request.model_dump(mode="json"), **{f: parent.get(f) for f in request.from_parent}}
    try:
        return spec.request.model_validate({**payload, "request": inner, "from_parent": []})
    except ValidationError as exc:
        raise _invalid(spec.name, exc) from exc


def _result_json(spec: JobKind, result: Any, ctx: JobContext) -> Any:
    """The job function's return value as JSON, and ``result_schema`` in the meta when it is (or validates as)
    the kind's result model. A result that does not validate is kept as it is (never lost for a schema slip),
    the mismatch logged, and the API serves it marked as unvalidated."""
    from workers.fanout import Planned

    if isinstance(result, Planned):  # a fanned-out parent: its result is its reduce step's
        return result.model_dump(mode="json")
    if isinstance(result, BaseModel):
        ctx.update_meta({"result_schema": type(result).__name__})
        return result.model_dump(mode="json")
    if spec.result is not None and isinstance(result, dict):
        try:
            validated = spec.result.model_validate(result)
        except ValidationError as exc:
            log.error("the %s result does not match %s: %s", spec.name, spec.result.__name__,
                      "; ".join(".".join(map(str, e["loc"])) + ": " + e["msg"] for e in exc.errors()[:10]))
            return result
        ctx.update_meta({"result_schema": spec.result.__name__})
        return validated.model_dump(mode="json")
    return result


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _provenance_start(settings: Settings, spec: JobKind, request: BaseModel, ctx: JobContext) -> dict | None:
    """The job's provenance as it starts, and the digests of the models it reads in its meta (what
    ``GET /jobs?model_digest=`` looks for). Never fails the job: a registry hiccup leaves the block out."""
    from workers import provenance

    try:
        block = provenance.start(settings, spec, request, ctx.owner, ctx.job_id, _now())
    except Exception:
        log.warning("could not record the job's provenance", exc_info=True)
        return None
    if not spec.internal:
        ctx.update_meta({"model_digests": provenance.digests(block)})
    return block


def _with_provenance(spec: JobKind, returned: Any, result: Any, block: dict | None, ctx: JobContext) -> Any:
    """``result`` (JSON) with the provenance block, when its result model has the field."""
    from workers import provenance

    model = type(returned) if isinstance(returned, BaseModel) else spec.result
    if block is None or not isinstance(result, dict) or model is None or "provenance" not in model.model_fields:
        return result
    from core.contract.results.provenance import Provenance

    done = provenance.finish(block, result, STATE["device"], ctx.registered_models, _now())
    if ctx.registered_models and not spec.internal:
        ctx.update_meta({"model_digests": provenance.digests(done)})
    # stored as its model writes it (every field present), so a stored result equals its model's dump
    return {**result, "provenance": Provenance.model_validate(done).model_dump(mode="json")}


def _recheck(spec: JobKind, request: Any, settings: Settings, ctx: JobContext) -> None:
    """A kind with ``recheck``: its submission checks again, here, before the job allocates (see JobKind)."""
    if not spec.recheck or spec.validate is None or isinstance(request, ShardRequest | ReduceRequest):
        return
    from core.contract.errors import FieldError

    try:
        spec.validate(request, settings, ctx.owner)
    except FieldError as exc:
        where = ".".join(str(p) for p in exc.loc if p != "body")
        raise JobError("refused_on_worker", f"checked again on the worker before it allocated anything: "
                       f"{where + ': ' if where and not exc.message.startswith(where) else ''}{exc.message}") from None


def execute(*args: Any) -> Any:
    job = get_current_job()
    settings, models = _state()
    ctx = JobContext(settings, job, models, STATE["device"])
    kind = args[1] if len(args) == 3 else (args[0] if args else None)
    owner = job.meta.get("owner") if job is not None else None
    with job_logging(job_id=ctx.job_id, kind=kind if isinstance(kind, str) else None, owner=owner):
        return _run(job, ctx, settings, args)


def _run(job: Any, ctx: JobContext, settings: Settings, args: tuple[Any, ...]) -> Any:
    kind = "?"

    def fail(code: str, message: str) -> None:
        _save(job, ctx, settings, {"error": {"code": code, "message": message}})

    published = store_down = False
    try:
        kind, payload = unpack_args(args)
        spec, request = resolve(settings, kind, payload)
        ctx.check_canceled()
        ctx.record_owner()
        request = with_parent_fields(spec, request, payload, job)
        _recheck(spec, request, settings, ctx)
        func = import_object(spec.func)
        block = _provenance_start(settings, spec, request, ctx)
        log.info("job started")
        t0 = time.monotonic()
        returned = func(request, ctx)
        result = json_safe(_with_provenance(spec, returned, _result_json(spec, returned, ctx), block, ctx))
        try:
            from workers.fanout import Planned

            if not isinstance(returned, Planned):  # a fan-out's plan stays in Redis: its result is its reduce step's
                result = results.keep(settings, ctx.job_id, result)
            ctx.publish_artifacts()
        except Exception as exc:
            store_down = True
            _record_store_unavailable(settings, "write")
            raise JobError("store_unavailable", f"the job finished but its files could not be written to the "
                           f"store ({type(exc).__name__}); its scratch copy is kept") from exc
        published = True
        ctx.flush(settings.redis_retry_s)
        log.info("job finished in %.2f s", time.monotonic() - t0)
        return result
    except JobLost:
        if job is not None:
            OUTCOMES[job.id] = "lost"
        log.warning("job stopped: it was failed as worker_lost while this worker ran it")
        raise
    except JobCanceled:
        if job is not None:
            OUTCOMES[job.id] = "canceled"
            _save(job, ctx, settings, {"canceled": True,
                                       "canceled_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")})
        raise
    except WorkerShutdown:
        if job is not None:
            OUTCOMES[job.id] = "requeue"
        raise
    except StoreUnavailable as exc:
        store_down = True
        _record_store_unavailable(settings, exc.operation)
        fail("store_unavailable", f"{exc}; submit the job again once the store answers")
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
            log.error("job failed:\n%s", traceback.format_exc())
        else:
            # the exception's text may hold server paths or another tenant's data: it goes to the log only, and
            # the job's error names the log line by a correlation id
            incident = uuid.uuid4().hex[:12]
            fail("internal", f"an internal error stopped the job ({name}); the server log has the details under "
                 f"incident {incident}")
            log.error("job failed, incident %s:\n%s", incident, traceback.format_exc(), extra={"incident": incident})
        raise
    finally:
        _finish_artifacts(ctx, published, store_down)


def _record_store_unavailable(settings: Settings, operation: str) -> None:
    from core import registry
    from core.metrics import record_store_unavailable

    try:
        record_store_unavailable(registry.connection(settings), operation)
    except Exception:  # a metric never changes a job's outcome
        log.warning("could not count the store's outage", exc_info=True)


def _finish_artifacts(ctx: JobContext, published: bool, store_down: bool = False) -> None:
    """Keep what a failed or canceled job wrote (a checkpoint to resume from, say), then drop the scratch copy.
    With the store down the scratch copy stays as it is (the next gc pass removes it): another upload would only
    keep the job running for another round of retries."""
    if store_down:
        return
    try:
        if not published:
            ctx.publish_artifacts()
        ctx.cleanup()
    except Exception:  # the job's own outcome stands; the scratch copy stays for the next gc pass
        log.exception("could not publish the artifacts of job %s", ctx.job_id)


def _save(job: Any, ctx: JobContext, settings: Settings, values: dict[str, Any]) -> None:
    """Record ``values`` in the job's meta, riding out a Redis outage; a lost job keeps its worker_lost error."""
    if job is None:
        return
    try:
        ctx.update_meta(values)
        ctx.flush(settings.redis_retry_s)
    except JobLost:
        OUTCOMES[job.id] = "lost"
