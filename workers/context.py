"""What a job function gets: progress, cancellation, models, artifacts (see docs/PLUGINS.md)."""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core import keys, registry
from core.artifacts import artifacts_key, record_owner
from core.filestore import get_store, media_type
from core.settings import Settings

if TYPE_CHECKING:
    import torch
    from rq.job import Job

    from workers.model_cache import ModelCache


class JobCanceled(Exception):
    """Raised at a progress step when the job's cancel flag is set."""


class WorkerShutdown(Exception):
    """Raised at a progress step when the worker was asked to stop: the job goes back on its queue."""


class JobLost(Exception):
    """The job is no longer ``started`` in Redis (failed as ``worker_lost`` or deleted): stop computing it."""


class JobError(Exception):
    """A failure a person can act on; ``code`` and ``message`` become the job's ``error``."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# Set by the worker's SIGTERM handler; checked at every progress step.
SHUTDOWN_REQUESTED = {"flag": False}

# Redis errors a worker rides out (Redis restarting, a network blip) instead of failing the job.
REDIS_DOWN_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)

log = logging.getLogger("explainq.jobs")

# Writes the job's meta only while the job is still ``started``: a job failed as ``worker_lost`` (or deleted) is
# never overwritten by the worker that lost it. Returns 1 when written, 0 otherwise.
_SAVE_META_IF_STARTED = """
if redis.call('HGET', KEYS[1], 'status') == ARGV[2] then
    redis.call('HSET', KEYS[1], 'meta', ARGV[1])
    return 1
end
return 0
"""


def user_dataset(ctx: JobContext, resolve: Callable[..., Path], value: str) -> Path:
    """The directory a job's dataset field names, resolved as at submission (``resolve(settings, value, owner)``
    from the kind) and, when it is a tenant's directory under the data roots, checked whole before any reader opens
    it (every entry a regular file or directory inside the roots). ``bad_dataset`` otherwise."""
    from core.contract.errors import FieldError
    from core.userfiles import UserFileError, UserFiles, check_tree, files_for

    try:
        root = resolve(ctx.settings, value, ctx.owner)
        if isinstance(files_for(ctx.settings, root), UserFiles):
            check_tree(ctx.settings, root)
    except FieldError as exc:
        raise JobError("bad_dataset", exc.message) from None
    except UserFileError as exc:
        raise JobError("bad_dataset", str(exc)) from None
    return root


def json_safe(obj: Any) -> Any:
    """A copy of ``obj`` that is valid JSON: non-finite floats (NaN, +-inf) become ``None``, tuples lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


class Backoff:
    """Exponential backoff between attempts at an unreachable Redis: ``initial`` s doubling up to ``cap`` s."""

    def __init__(self, initial: float = 0.5, cap: float = 10.0):
        self.initial = initial
        self.cap = cap
        self.delay = 0.0
        self.next_try = 0.0
        self.failures = 0

    def ready(self) -> bool:
        return time.monotonic() >= self.next_try

    def failed(self) -> float:
        """Record a failed attempt; returns the delay before the next one."""
        self.failures += 1
        self.delay = min(self.delay * 2, self.cap) if self.delay else self.initial
        self.next_try = time.monotonic() + self.delay
        return self.delay

    def succeeded(self) -> None:
        self.delay = 0.0
        self.next_try = 0.0
        self.failures = 0


def _utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ProgressTracker:
    """ETA from the measured rate since the first progress report, smoothed over the whole run."""

    def __init__(self) -> None:
        self.t0: float | None = None
        self.done0 = 0.0

    def eta(self, done: float, total: float | None) -> float | None:
        now = time.monotonic()
        if self.t0 is None:
            self.t0, self.done0 = now, done
            return None
        if not total or done <= self.done0:
            return None
        rate = (done - self.done0) / max(now - self.t0, 1e-9)
        return round(max(total - done, 0) / rate, 2) if rate > 0 else None


class JobContext:
    """Per-job services. ``job`` is the RQ job (None when a pipeline runs outside the service)."""

    def __init__(
        self,
        settings: Settings,
        job: Job | None = None,
        models: ModelCache | None = None,
        device: torch.device | None = None,
        min_report_interval_s: float = 0.25,
        progress_bar: bool = False,
    ):
        self.settings = settings
        self.job = job
        self.job_id = job.id if job is not None else f"local-{int(time.time() * 1000)}"
        self._models = models
        if device is None:
            from models.common import default_device

            device = default_device()
        self.device = device
        self._tracker = ProgressTracker()
        self._last_report = 0.0
        self._min_interval = min_report_interval_s
        self._artifacts_dir: Path | None = None
        self._uploaded: dict[str, tuple[int, int]] = {}  # store key -> (size, mtime) already published
        # Outside the service (a CLI or notebook run) the same progress calls drive a tqdm bar.
        self._show_bar = progress_bar and job is None
        self._bar: Any = None
        # Redis outages: meta not yet written (flushed at the next chance), and when to try Redis again.
        self._meta_dirty = False
        self._redis = Backoff(initial=0.5, cap=5.0)
        # the models this job registered, as its result's provenance names them
        self.registered_models: list[dict[str, Any]] = []

    @property
    def home(self) -> Path:
        return self.settings.home

    # ---- progress and cancellation
    def progress(
        self,
        done: float,
        total: float | None,
        unit: str,
        message: str | None = None,
        metrics: dict[str, Any] | None = None,
    ) -> None:
        """Record progress (rate-limited unless ``done == total`` or metrics change) and check for cancel."""
        eta = self._tracker.eta(done, total)
        now = time.monotonic()
        final = total is not None and done >= total
        if self.job is not None and (final or metrics is not None or now - self._last_report >= self._min_interval):
            self._last_report = now
            self.job.meta["progress"] = json_safe({
                "done": done, "total": total, "unit": unit, "message": message, "eta_s": eta,
                "updated_at": _utc_now(),
            })
            if metrics is not None:
                self.job.meta["metrics"] = json_safe(metrics)
            self._save_meta()
        elif self._meta_dirty:
            self._save_meta()
        if self._show_bar:
            self._update_bar(done, total, unit, message)
        self.check_canceled()

    def _update_bar(self, done: float, total: float | None, unit: str, message: str | None) -> None:
        from tqdm.auto import tqdm

        if self._bar is None or self._bar.unit != unit:
            if self._bar is not None:
                self._bar.close()
            self._bar = tqdm(total=total, unit=unit)
        self._bar.total = total
        self._bar.n = done
        if message:
            self._bar.set_description_str(message, refresh=False)
        self._bar.refresh()
        if total is not None and done >= total:
            self._bar.close()
            self._bar = None

    def check_canceled(self) -> None:
        """Raise JobCanceled when the cancel flag is set. Fails open: with Redis unreachable the job goes on."""
        if self.job is None:
            return
        if self._redis.ready():
            try:
                canceled = self.job.connection.exists(keys.cancel(self.job.id))
            except REDIS_DOWN_ERRORS as exc:
                self._redis_failed("cancel check", exc)
            else:
                self._redis.succeeded()
                if canceled:
                    raise JobCanceled("canceled on request")
        if SHUTDOWN_REQUESTED["flag"]:
            raise WorkerShutdown("worker is shutting down")

    def set_meta(self, key: str, value: Any) -> None:
        self.update_meta({key: value})

    def update_meta(self, values: dict[str, Any]) -> None:
        """Set several meta fields in one write (non-finite floats become null)."""
        if self.job is not None:
            self.job.meta.update(json_safe(values))
            self._save_meta()

    # ---- meta writes that survive Redis outages
    def _redis_failed(self, what: str, exc: BaseException) -> None:
        delay = self._redis.failed()
        level = logging.WARNING if self._redis.failures == 1 else logging.DEBUG
        log.log(level, "redis unreachable during %s (%s); the job goes on, next try in %.1f s", what, exc, delay)

    def _write_meta(self) -> None:
        """One attempt. Raises a REDIS_DOWN_ERRORS error when Redis is unreachable, JobLost when the job is gone."""
        job = self.job
        written = job.connection.eval(_SAVE_META_IF_STARTED, 1, job.key, job.serializer.dumps(job.meta),
                                      "started")
        self._meta_dirty = False
        self._redis.succeeded()
        if not written:
            raise JobLost(f"job {job.id} is no longer running on this worker (failed as worker_lost or deleted)")

    def _save_meta(self) -> None:
        """Write the job's meta now, or keep it for later while Redis is unreachable (never raises for that)."""
        self._meta_dirty = True
        if not self._redis.ready():
            return
        try:
            self._write_meta()
        except REDIS_DOWN_ERRORS as exc:
            self._redis_failed("progress write", exc)

    def flush(self, timeout_s: float) -> bool:
        """Write pending meta, retrying with backoff for up to ``timeout_s``; returns whether it was written."""
        if self.job is None or not self._meta_dirty:
            return True
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._write_meta()
                return True
            except REDIS_DOWN_ERRORS as exc:
                delay = self._redis.failed()
                if time.monotonic() + delay > deadline:
                    log.error("redis unreachable for %.0f s; the job's progress could not be saved: %s",
                              timeout_s, exc)
                    return False
                time.sleep(delay)

    # ---- models
    @property
    def owner(self) -> str:
        """The API key name that submitted this job (``system`` outside the service)."""
        if self.job is not None:
            return self.job.meta.get("owner") or registry.SYSTEM
        return registry.SYSTEM

    def use_shared(self, entries: Any) -> None:
        """Record that this job used or wrote shared store entries (gradient features, evaluation caches): their
        last use, for retention, and the owner's claim, which counts them in the owner's stored bytes until the
        job is deleted or expires (core/lastuse.py). Best effort: never fails the job."""
        from core import lastuse
        from core.filestore import get_store

        entries = list(entries)
        store = get_store(self.settings)
        lastuse.touch(store, entries)
        lastuse.claim(store, self.owner, self.job_id, entries)

    def model(self, name: str) -> Any:
        if self._models is None:
            from workers.model_cache import ModelCache

            self._models = ModelCache(self.settings, self.device)
        return self._models.get(name)

    def register_model(self, name: str, **entry: Any) -> dict[str, Any]:
        """Register a model for this job's owner (its files are uploaded into the store as a new version).
        Another owner's name fails the job with ``name_taken``. Its meta records this job (``job_id``): the
        dashboard links a model to the job that produced it."""
        if self.job is not None:
            entry["meta"] = {**(entry.get("meta") or {}), "job_id": self.job_id}
        try:
            result = registry.register_model(self.settings, name, owner=self.owner, **entry)
        except registry.OwnershipError as exc:
            raise JobError("name_taken", str(exc)) from None
        from workers.provenance import model_record

        self.registered_models.append(model_record(self.settings, result, None))
        if self._models is not None:
            self._models.evict(name)
        return result

    def register_dataset(self, name: str, **entry: Any) -> dict[str, Any]:
        try:
            return registry.register_dataset(self.settings, name, owner=self.owner, **entry)
        except registry.OwnershipError as exc:
            raise JobError("name_taken", str(exc)) from None

    # ---- artifacts
    @property
    def artifacts_dir(self) -> Path:
        """This job's local scratch directory; its files reach the store under ``artifacts/<job id>/``
        when the job ends (``publish_artifacts``), and are listed by ``GET /jobs/{id}/artifacts``."""
        if self._artifacts_dir is None:
            self._artifacts_dir = self.settings.work_dir / self.job_id
            self._artifacts_dir.mkdir(parents=True, exist_ok=True)
        return self._artifacts_dir

    def artifact_path(self, name: str) -> Path:
        path = (self.artifacts_dir / name).resolve()
        if not path.is_relative_to(self.artifacts_dir.resolve()):
            raise ValueError(f"artifact name {name!r} escapes the job's artifact directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def artifacts(self) -> list[dict[str, Any]]:
        """The job's files by relative name (never a server path), with size and media type."""
        if self._artifacts_dir is None or not self._artifacts_dir.exists():
            return []
        return [{"name": str(p.relative_to(self._artifacts_dir)), "size": p.stat().st_size,
                 "media_type": media_type(p.name)}
                for p in sorted(p for p in self._artifacts_dir.rglob("*") if p.is_file())]

    def publish_artifacts(self, subdir: str | None = None) -> None:
        """Copy the job's files (or one sub-directory of them) into the store, and record the owner."""
        if self._artifacts_dir is None or not self._artifacts_dir.exists():
            return
        local = self._artifacts_dir / subdir if subdir else self._artifacts_dir
        key = artifacts_key(self.job_id, subdir) if subdir else artifacts_key(self.job_id)
        get_store(self.settings).sync_dir(local, key, self._uploaded)

    def record_owner(self) -> None:
        """Record who owns this job's files (checked by the artifact routes and resume_from even after the job's
        record expired). Done at start, while Redis is known to be reachable; best effort."""
        if self.job is None:
            return
        try:
            record_owner(self.settings, self.job_id, self.owner, self.job.meta.get("kind"))
        except Exception:
            log.warning("could not record the owner of job %s's files", self.job_id, exc_info=True)

    def cleanup(self) -> None:
        """Remove the local scratch copy (after the files reached the store)."""
        if self._artifacts_dir is not None:
            shutil.rmtree(self._artifacts_dir, ignore_errors=True)

