"""What a job function gets: progress, cancellation, models, artifacts (see docs/PLUGINS.md)."""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app import registry
from app.artifacts import artifacts_key, record_owner
from app.jobstore import cancel_key
from app.settings import Settings
from app.store import get_store, media_type

if TYPE_CHECKING:
    import torch
    from rq.job import Job

    from workers.model_cache import ModelCache


class JobCanceled(Exception):
    """Raised at a progress step when the job's cancel flag is set."""


class WorkerShutdown(Exception):
    """Raised at a progress step when the worker was asked to stop: the job goes back on its queue."""


class JobError(Exception):
    """A failure a person can act on; ``code`` and ``message`` become the job's ``error``."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# Set by the worker's SIGTERM handler; checked at every progress step.
SHUTDOWN_REQUESTED = {"flag": False}


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
        # Outside the service (a CLI or notebook run) the same progress calls drive a tqdm bar.
        self._show_bar = progress_bar and job is None
        self._bar: Any = None

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
            self.job.meta["progress"] = {
                "done": done, "total": total, "unit": unit, "message": message, "eta_s": eta,
                "updated_at": _utc_now(),
            }
            if metrics is not None:
                self.job.meta["metrics"] = metrics
            self.job.save_meta()
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
        if self.job is None:
            return
        if self.job.connection.exists(cancel_key(self.job.id)):
            raise JobCanceled("canceled on request")
        if SHUTDOWN_REQUESTED["flag"]:
            raise WorkerShutdown("worker is shutting down")

    def set_meta(self, key: str, value: Any) -> None:
        if self.job is not None:
            self.job.meta[key] = value
            self.job.save_meta()

    # ---- models
    @property
    def owner(self) -> str:
        """The API key name that submitted this job (``system`` outside the service)."""
        if self.job is not None:
            return self.job.meta.get("owner") or registry.SYSTEM
        return registry.SYSTEM

    def model(self, name: str) -> Any:
        if self._models is None:
            from workers.model_cache import ModelCache

            self._models = ModelCache(self.settings, self.device)
        return self._models.get(name)

    def register_model(self, name: str, **entry: Any) -> dict[str, Any]:
        """Register a model for this job's owner (its files are uploaded into the store as a new version).
        Another owner's name fails the job with ``name_taken``."""
        try:
            result = registry.register_model(self.settings, name, owner=self.owner, **entry)
        except registry.OwnershipError as exc:
            raise JobError("name_taken", str(exc)) from None
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
        record_owner(self.settings, self.job_id, self.owner, self.job.meta.get("kind") if self.job else None)
        local = self._artifacts_dir / subdir if subdir else self._artifacts_dir
        key = artifacts_key(self.job_id, subdir) if subdir else artifacts_key(self.job_id)
        get_store(self.settings).sync_dir(local, key)

    def cleanup(self) -> None:
        """Remove the local scratch copy (after the files reached the store)."""
        if self._artifacts_dir is not None:
            shutil.rmtree(self._artifacts_dir, ignore_errors=True)

