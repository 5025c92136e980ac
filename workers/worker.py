"""The explainq worker: an ``rq.SimpleWorker`` (no fork, so CUDA works) that keeps models loaded.

- Models listed in the registry are loaded once at start and shared by every job.
- A heartbeat thread runs for the whole of every job (model loads included). It refreshes the job's registration
  and the worker's liveness key ``explainq:alive:<name>`` (value: the running job's id, TTL
  ``EXPLAINQ_HEARTBEAT_TTL_S``); ``core.reaper`` fails a running job as ``worker_lost`` only once that key is gone.
- Redis outages: the job keeps computing (progress is kept and written later, cancel checks fail open), the
  heartbeat thread keeps trying, and the job's end (result or failure) is written with retries for up to
  ``EXPLAINQ_REDIS_RETRY_S``. A job failed as ``worker_lost`` meanwhile is left failed.
- Only ``workers.runner.execute`` jobs run: any other RQ job is failed with ``unknown_kind`` before anything of it
  is imported.
- SIGTERM: the running job stops at its next progress step and goes back on its queue (a job that reports no
  progress runs to completion); a second SIGTERM stops at once.
- A job canceled through the API ends ``canceled``, not ``failed``.
- A shard that ends here (succeeded, failed for good, canceled) releases its owner's next pending shard, and its
  parent's reduce step after the last one (``core/fanout.py``); maintenance sweeps up after a worker that died in
  between, and tears down the fan-outs whose parent failed.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from rq import Queue, SimpleWorker, worker_registration
from rq.job import Job, JobStatus
from rq.registry import DeferredJobRegistry, FailedJobRegistry, FinishedJobRegistry, ReadyJobRegistry
from rq.serializers import JSONSerializer
from rq.timeouts import JobTimeoutException
from rq.utils import now

from core import backlog, fanout, keys, placement
from core.keys import QUEUE_PREFIX
from core.logs import set_process_fields, setup_logging
from core.reaper import reap_queue
from core.redis_server import redact_url, redis_client
from core.settings import Settings
from workers import runner
from workers.context import REDIS_DOWN_ERRORS, SHUTDOWN_REQUESTED, Backoff, JobCanceled
from workers.model_cache import ModelCache

log = logging.getLogger("explainq.worker")

T = TypeVar("T")
# Where a job's end is final; anything else (still "started") means its end was not written yet.
_ENDED = {s.value for s in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.QUEUED,
                            JobStatus.CANCELED)}
# Where a job is over for good (a job put back on its queue for a retry or at shutdown is not).
_FINAL = {s.value for s in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED)}


class ForeignJob(Exception):
    """An RQ job whose function is not ``workers.runner.execute``: refused without importing anything."""


class NoCapableWorker(Exception):
    """A job this worker cannot run, taken from the only queue that could hold it: failed without running."""


class ExplainqWorker(SimpleWorker):
    models: ModelCache | None = None
    settings: Settings | None = None
    offer: placement.Offer | None = None  # this worker's class and what it has (core/placement.py)
    _refusal: str | None = None  # why the job being performed is failed unrun (no worker class can run it)
    _current_job_id: str | None = None
    _redis_down_logged = False

    @property
    def _ttl(self) -> int:
        return int(self.settings.heartbeat_ttl_s if self.settings else 60)

    @property
    def _retry_s(self) -> float:
        return self.settings.redis_retry_s if self.settings else 120.0

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        return self._ttl

    # ---- Redis outages
    def _redis_down(self, what: str, exc: BaseException) -> None:
        if not self._redis_down_logged:
            log.warning("redis unreachable (%s): %s; retrying", what, exc)
            self._redis_down_logged = True

    def _redis_up(self) -> None:
        if self._redis_down_logged:
            log.info("redis reachable again")
            self._redis_down_logged = False

    def _persist(self, action: Callable[[], T], what: str) -> T:
        """Run ``action`` (Redis writes), retrying with backoff while Redis is unreachable, up to the retry budget."""
        backoff = Backoff(initial=0.5, cap=10.0)
        deadline = time.monotonic() + self._retry_s
        while True:
            try:
                result = action()
                self._redis_up()
                return result
            except REDIS_DOWN_ERRORS as exc:
                self._redis_down(what, exc)
                delay = backoff.failed()
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)

    def _quietly(self, action: Callable[[], Any], what: str) -> None:
        """Run ``action``; while Redis is unreachable log once and go on (the work loop retries on its own)."""
        try:
            action()
            self._redis_up()
        except REDIS_DOWN_ERRORS as exc:
            self._redis_down(what, exc)

    # ---- the job
    def execute_job(self, job: Job, queue: Queue) -> None:
        if self._hand_on(job, queue):
            return
        self._current_job_id = job.id
        execution = self._persist(lambda: self.prepare_execution(job), "start the job")
        stop = threading.Event()
        beat = threading.Thread(target=self._beat, args=(job, execution, stop), daemon=True, name="heartbeat")
        beat.start()
        try:
            self.perform_job(job, queue, execution)
        finally:
            self._current_job_id = None
            stop.set()
            beat.join(timeout=5)
            self._quietly(self._publish_models, "publish models")
        self._quietly(lambda: self.set_state("idle"), "set state")

    # ---- placement: a job this worker cannot run is handed on unrun, or failed when nowhere can run it
    def _hand_on(self, job: Job, queue: Queue) -> bool:
        """Whether ``job`` (just taken from ``queue``) went on to the queue of a class that can run it: at that
        queue's front, its status still queued, without this worker starting it. A job that no class can run
        (the place it came from is the only one) is failed as ``no_capable_worker`` when it is performed."""
        self._refusal = None
        if self.offer is None or self.settings is None:
            return False
        why = placement.fits(self.offer, job.meta.get("placement"))
        if why is None:
            return False
        target = placement.hand_on_queue(self.settings, queue.name, job.meta.get("placement"))
        if target is None:
            self._refusal = why
            return False

        def move() -> None:
            with self.connection.pipeline() as pipe:
                pipe.lrem(queue.intermediate_queue_key, 1, job.id)
                pipe.hset(job.key, mapping={"origin": target})
                pipe.lpush(QUEUE_PREFIX + target, job.id)
                pipe.sadd(Queue.redis_queues_keys, QUEUE_PREFIX + target)
                pipe.execute()

        self._persist(move, "hand the job on")
        log.info("job %s handed on from %s to %s: %s", job.id, queue.name, target, why)
        return True

    def perform_job(self, job: Job, queue: Queue, execution: Any) -> bool:
        """RQ's ``perform_job`` with the job's function checked first and its end written through Redis outages."""
        try:
            func_name = job.func_name
        except Exception:  # call data this worker cannot read (e.g. pickled): not one of ours, never unpickled
            func_name = None
            job._func_name, job._instance, job._args, job._kwargs = "<unreadable>", None, (), {}
        self._persist(lambda: self.prepare_job_execution(job, len(self.queues) == 1), "start the job")
        job.started_at = now()
        if fanout.is_shard(job.meta):  # its parent's counters count it as running (else maintenance's sweep does)
            self._quietly(lambda: fanout.shard_sync(self.connection, job.id, job.meta["parent"]),
                          "count the shard as running")
        try:
            if func_name != runner.RUNNER:
                raise ForeignJob(f"job function {func_name!r} is not {runner.RUNNER}")
            if self._refusal is not None:
                raise NoCapableWorker(self._refusal)
            timeout = job.timeout or self.queue_class.DEFAULT_TIMEOUT
            with self.death_penalty_class(timeout, JobTimeoutException, job_id=job.id):
                return_value = job.perform()
        except:  # noqa: E722  (as RQ: every exception, SystemExit included, fails the job)
            exc_info = sys.exc_info()
            if isinstance(exc_info[1], ForeignJob):
                log.error("refused job %s: %s", job.id, exc_info[1])
                job.meta["error"] = {"code": "unknown_kind",
                                     "message": "this job does not name a registered kind; it was not run"}
                self._persist(job.save_meta, "record the refusal")
            elif isinstance(exc_info[1], NoCapableWorker):
                log.error("refused job %s: %s, and no worker class that can run it serves its queue", job.id,
                          exc_info[1])
                job.meta["error"] = {"code": "no_capable_worker",
                                     "message": f"this worker cannot run it ({exc_info[1]}) and no worker class "
                                     "that can serves its queue (EXPLAINQ_WORKER_CLASSES); it was not run"}
                self._persist(job.save_meta, "record the refusal")
            self._end(job, lambda: self._finalize_failure(job, queue, execution, exc_info), execution)
            return False
        self._end(job, lambda: self._finalize_success(job, queue, execution, return_value), execution)
        return True

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        """RQ's log line for a job that raised. A cancel is the owner's request, not an error: one INFO line. A
        failure the runner classified (its code in the job's error: a bad request, a missing model, a timeout, an
        internal error the runner has already logged with its traceback and incident id) is one WARNING line with
        the code. Anything else (an interrupt, a refused job) is RQ's ERROR with the traceback."""
        exc = exc_info[1] if len(exc_info) > 1 else None
        if isinstance(exc, JobCanceled):
            log.info("job %s canceled on its owner's request", job.id)
            return
        error = (job.meta or {}).get("error")
        if isinstance(exc, Exception) and isinstance(error, dict) and error.get("code") \
                and not isinstance(exc, ForeignJob | NoCapableWorker):
            log.warning("job %s failed: %s", job.id, error["code"])
            return
        super().handle_exception(job, *exc_info)

    def _end(self, job: Job, finalize: Callable[[], None], execution: Any) -> None:
        """Write the job's end with retries; a job that is no longer ``started`` (failed as lost) is left alone."""
        retries_left = job.retries_left
        attempted = False
        backoff = Backoff(initial=0.5, cap=10.0)
        deadline = time.monotonic() + self._retry_s
        try:
            while True:
                try:
                    status = self.connection.hget(job.key, "status")
                    status = status.decode() if status is not None else None
                    if status != JobStatus.STARTED.value:
                        if not attempted or status not in _ENDED:
                            log.warning("job %s is %s, no longer running here (failed as worker_lost?); its "
                                        "outcome on this worker is dropped", job.id, status or "gone")
                            self._quietly(lambda: self._drop_execution(job, execution), "clean up")
                        return
                    attempted = True
                    job.retries_left = retries_left
                    finalize()
                    self._redis_up()
                except REDIS_DOWN_ERRORS as exc:
                    self._redis_down(f"write the end of job {job.id}", exc)
                    delay = backoff.failed()
                    if time.monotonic() + delay > deadline:
                        log.error("redis unreachable for %.0f s: the end of job %s was not written; it will be "
                                  "failed as worker_lost", self._retry_s, job.id)
                        return
                    time.sleep(delay)
        finally:
            runner.OUTCOMES.pop(job.id, None)

    def _drop_execution(self, job: Job, execution: Any) -> None:
        with self.connection.pipeline() as pipe:
            self.cleanup_execution(job, pipeline=pipe, execution=execution)
            pipe.execute()

    # ---- heartbeats
    def _beat(self, job: Job, execution: Any, stop: threading.Event) -> None:
        interval = max(self._ttl / 4, 0.25)
        while not stop.wait(interval):
            try:
                self.maintain_heartbeats(job, execution)
                self._publish_models()
                self._redis_up()
            except REDIS_DOWN_ERRORS as exc:  # retried at the next interval; the job itself goes on
                self._redis_down("heartbeat", exc)
            except Exception:
                log.exception("heartbeat failed")

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        if pipeline is not None:
            super().heartbeat(timeout, pipeline=pipeline)
            pipeline.set(keys.alive(self.name), self._current_job_id or "", ex=self._ttl)
            return

        def beat() -> None:
            with self.connection.pipeline() as pipe:
                super(ExplainqWorker, self).heartbeat(timeout, pipeline=pipe)
                pipe.set(keys.alive(self.name), self._current_job_id or "", ex=self._ttl)
                pipe.execute()
            self._publish_models()

        self._quietly(beat, "heartbeat")

    def set_state(self, state: str, pipeline: Any = None) -> None:
        if pipeline is not None:
            return super().set_state(state, pipeline=pipeline)
        self._quietly(lambda: super(ExplainqWorker, self).set_state(state), "set state")

    def check_for_suspension(self, burst: bool) -> None:
        self._quietly(lambda: super(ExplainqWorker, self).check_for_suspension(burst), "suspension check")

    def run_maintenance_tasks(self) -> None:
        try:
            super().run_maintenance_tasks()
        except REDIS_DOWN_ERRORS as exc:
            self._redis_down("maintenance", exc)
            self.last_cleaned_at = now()  # next try at the next maintenance interval

    def clean_registries(self) -> None:
        """RQ's registry maintenance, with started jobs reaped by ``core.reaper``'s rule instead of RQ's."""
        for queue in self.queues:
            if not queue.acquire_maintenance_lock():
                continue
            try:
                reaped = reap_queue(self.connection, queue.name, self._ttl)
                if reaped:
                    log.warning("queue %s: failed %d job(s) whose worker is gone: %s", queue.name, len(reaped),
                                ", ".join(reaped))
                for registry_class in (FinishedJobRegistry, FailedJobRegistry, DeferredJobRegistry,
                                       ReadyJobRegistry):
                    registry_class(queue.name, connection=self.connection, serializer=self.serializer).cleanup()
                worker_registration.clean_worker_registry(queue)
                queue.intermediate_queue.cleanup(self, queue)
            finally:
                queue.release_maintenance_lock()
        self._sweep_fanouts()
        self._publish_backlog()
        self.last_cleaned_at = now()

    def _publish_backlog(self) -> None:
        """``explainq:backlog:seconds`` kept current while no API process is scraped (``core/backlog.py``)."""
        if self.settings is None:
            return
        try:
            backlog.publish(self.connection, backlog.read(self.connection, placement.all_queues(self.settings),
                                                          self.settings.backlog_unknown_cost_s))
        except REDIS_DOWN_ERRORS:
            raise
        except Exception:  # advice for autoscalers: the next pass tries again
            log.exception("backlog cost not published")

    def _sweep_fanouts(self) -> None:
        """``core.fanout.sweep``: fan-outs whose parent failed are torn down, shards that ended without their end
        being counted (their worker died in between) are counted, every owner's window is refilled."""
        if self.settings is None:
            return
        try:
            done = fanout.sweep(self.connection, self.settings)
        except REDIS_DOWN_ERRORS:
            raise
        except Exception:  # housekeeping: the next pass tries again
            log.exception("fan-out sweep failed")
            return
        if any(done.values()):
            log.warning("fan-out sweep: %d fan-out(s) of failed parents torn down, %d ended shard(s) counted",
                        done["torn_down"], done["ended"])

    def _fanout_end(self, job: Job) -> None:
        """A shard that ended here releases its owner's next pending shard, and its parent's reduce step when it
        was the last; one put back on its queue has not ended. With Redis unreachable now, maintenance does it."""
        if not fanout.is_shard(job.meta):
            return
        try:
            status = self.connection.hget(job.key, "status")
            if status is not None and status.decode() not in _FINAL:
                fanout.shard_sync(self.connection, job.id, job.meta["parent"])  # retried: queued again
                return
            fanout.shard_ended(self.connection, job.id, job.meta["parent"], job.meta.get("owner") or "",
                               self.settings.shard_window if self.settings else 0)
        except REDIS_DOWN_ERRORS as exc:
            log.warning("the end of shard %s is left to maintenance (redis unreachable: %s)", job.id, exc)

    def _publish_models(self) -> None:
        if self.models is None:
            return
        info = {"worker": self.name, "queues": self.queue_names(), "pid": os.getpid(),
                "models": self.models.describe(), "device": str(self.models.device), "rss_bytes": rss_bytes(),
                "offer": self.offer.describe() if self.offer is not None else None}
        ttl = int(self.worker_ttl) + 30
        with self.connection.pipeline() as pipe:
            pipe.set(keys.worker_models(self.name), json.dumps(info), ex=ttl)
            pipe.sadd(keys.WORKER_MODELS, self.name)
            pipe.execute()

    def handle_job_failure(self, job: Job, queue: Queue, started_job_registry=None, exc_string="",
                           execution=None):
        outcome = runner.OUTCOMES.get(job.id)
        if outcome == "canceled":
            self._stopped_job_id = job.id  # RQ marks it STOPPED (shown as canceled) and never retries it
        elif outcome == "requeue":
            job.retries_left = (job.retries_left or 0) + 1
            job.retry_intervals = None
            job.enqueue_at_front_on_retry = True
        result = super().handle_job_failure(job, queue, started_job_registry=started_job_registry,
                                            exc_string=exc_string, execution=execution)
        from core.metrics import record_job_end

        record_job_end(self.connection, job)
        self._fanout_end(job)
        return result

    def handle_job_success(self, job: Job, queue: Queue, started_job_registry, execution=None):
        super().handle_job_success(job, queue, started_job_registry, execution)
        from core.metrics import record_job_end

        record_job_end(self.connection, job)
        self._fanout_end(job)

    def request_stop(self, signum, frame):
        SHUTDOWN_REQUESTED["flag"] = True
        return super().request_stop(signum, frame)

    def register_death(self):
        try:
            with self.connection.pipeline() as pipe:
                pipe.delete(keys.worker_models(self.name), keys.alive(self.name))
                pipe.srem(keys.WORKER_MODELS, self.name)
                pipe.execute()
        except REDIS_DOWN_ERRORS as exc:
            log.warning("could not unregister (redis unreachable): %s", exc)
            return
        super().register_death()


def rss_bytes() -> int | None:
    """This process's resident memory now (Linux ``/proc``), else its peak (``getrusage``), else None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak) * (1 if sys.platform == "darwin" else 1024)
    except (ImportError, OSError):
        return None


def apply_thread_budget(threads: int | None) -> None:
    """Cap this process's CPU threads (torch intra-op, OpenMP, MKL); call before torch is imported."""
    if threads is None:
        return
    if threads < 1:
        raise ValueError("--threads must be at least 1")
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)


def detect_gpu(device: Any) -> dict[str, Any]:
    """What this process's device is: a CUDA device's name and total memory, or no GPU."""
    if getattr(device, "type", "cpu") != "cuda":
        return {"gpu": False}
    import torch

    props = torch.cuda.get_device_properties(device)
    return {"gpu": True, "gpu_memory_bytes": int(props.total_memory), "gpu_name": props.name}


def run_worker(settings: Settings, queues: list[str] | None, burst: bool = False, preload: bool = True,
               threads: int | None = None, worker_class: str | None = None) -> None:
    """Serve ``queues`` (default: ``worker_class``'s, else every queue), as a worker of ``worker_class`` when
    given: its own queues first (core/placement.py). Exits with a message naming the setting when the class is
    unknown or this host has less than it promises."""
    apply_thread_budget(threads)
    from models.common import default_device

    name = f"{socket.gethostname()}.{os.getpid()}"
    setup_logging(settings.log_format)
    set_process_fields(worker=name)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
        log.info("cpu threads: %d", threads)
    url = settings.redis_url or "redis://127.0.0.1:6379/0"
    connection = redis_client(url, settings.redis_timeout_s)
    log.info("redis: %s", redact_url(url))
    device = default_device()
    try:
        offer = placement.worker_offer(settings, worker_class, detect_gpu(device))
    except ValueError as exc:
        raise SystemExit(f"explainq worker: {exc}") from None
    wc = offer.worker_class
    if queues is None:
        queues = list(wc.queues) if wc is not None else ["explain", "bulk", "train"]
    elif wc is not None and set(queues) - set(wc.queues):
        raise SystemExit(f"explainq worker: queues {sorted(set(queues) - set(wc.queues))} are not served by "
                         f"class {wc.name!r} (EXPLAINQ_WORKER_CLASSES gives it {list(wc.queues)})")
    queues = placement.serving_queues(wc, queues)
    log.info("class %s, queues %s, offer %s", wc.name if wc else "-", ",".join(queues), offer.describe())
    models = ModelCache(settings, device)
    if preload:
        names = models.preload()
        log.info("preloaded %d model(s) on %s: %s", len(names), device, ", ".join(names) or "-")
    runner.STATE.update(settings=settings, device=device, models=models)
    runner.kind_table(settings)  # the kinds this worker runs are fixed at start
    ExplainqWorker.models = models
    ExplainqWorker.settings = settings
    ExplainqWorker.offer = offer
    placement.set_worker_budget(offer.memory_bytes)  # what a job's re-check (JobKind.recheck) compares with
    worker = ExplainqWorker(
        [Queue(q, connection=connection, serializer=JSONSerializer) for q in queues],
        connection=connection,
        serializer=JSONSerializer,
        name=name,
        worker_ttl=max(settings.heartbeat_ttl_s, 20),
        maintenance_interval=max(settings.heartbeat_ttl_s, 10),
    )
    worker._publish_models()
    worker.work(burst=burst, with_scheduler=False, logging_level="INFO")
