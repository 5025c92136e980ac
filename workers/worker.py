"""The explainq worker: an ``rq.SimpleWorker`` (no fork, so CUDA works) that keeps models loaded.

- Models listed in the registry are loaded once at start and shared by every job.
- A heartbeat thread keeps a running job's registration fresh, so a live job is never reaped while a dead
  worker's job is found abandoned within ``EXPLAINQ_HEARTBEAT_TTL_S`` and moved to failed.
- SIGTERM: the running job stops at its next progress step and goes back on its queue (a job that reports no
  progress runs to completion); a second SIGTERM stops at once.
- A job canceled through the API ends ``canceled``, not ``failed``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from typing import Any

from redis import Redis
from rq import Queue, SimpleWorker
from rq.job import Job
from rq.serializers import JSONSerializer

from app.routers.models import LOADED_SET, loaded_key
from app.settings import Settings
from workers import runner
from workers.context import SHUTDOWN_REQUESTED
from workers.model_cache import ModelCache

log = logging.getLogger("explainq.worker")


class ExplainqWorker(SimpleWorker):
    models: ModelCache | None = None
    settings: Settings | None = None

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        return int(self.settings.heartbeat_ttl_s if self.settings else 60)

    def execute_job(self, job: Job, queue: Queue) -> None:
        execution = self.prepare_execution(job)
        stop = threading.Event()
        beat = threading.Thread(target=self._beat, args=(job, execution, stop), daemon=True, name="heartbeat")
        beat.start()
        try:
            self.perform_job(job, queue, execution)
        finally:
            stop.set()
            beat.join(timeout=5)
            self._publish_models()
        self.set_state("idle")

    def _beat(self, job: Job, execution: Any, stop: threading.Event) -> None:
        interval = max(self.get_heartbeat_ttl(job) / 4, 0.5)
        while not stop.wait(interval):
            try:
                self.maintain_heartbeats(job, execution)
                self._publish_models()
            except Exception:  # a missed beat is retried at the next interval; the job itself goes on
                log.exception("heartbeat failed")

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        super().heartbeat(timeout, pipeline=pipeline)
        if pipeline is None:
            self._publish_models()

    def _publish_models(self) -> None:
        if self.models is None:
            return
        info = {"worker": self.name, "queues": self.queue_names(), "pid": os.getpid(),
                "models": self.models.describe()}
        ttl = int(self.worker_ttl) + 30
        with self.connection.pipeline() as pipe:
            pipe.set(loaded_key(self.name), json.dumps(info), ex=ttl)
            pipe.sadd(LOADED_SET, self.name)
            pipe.execute()

    def handle_job_failure(self, job: Job, queue: Queue, started_job_registry=None, exc_string="",
                           execution=None):
        outcome = runner.OUTCOMES.pop(job.id, None)
        if outcome == "canceled":
            self._stopped_job_id = job.id  # RQ marks it STOPPED (shown as canceled) and never retries it
        elif outcome == "requeue":
            job.retries_left = (job.retries_left or 0) + 1
            job.retry_intervals = None
            job.enqueue_at_front_on_retry = True
        result = super().handle_job_failure(job, queue, started_job_registry=started_job_registry,
                                            exc_string=exc_string, execution=execution)
        from app.metrics import record_job_end

        record_job_end(self.connection, job)
        return result

    def handle_job_success(self, job: Job, queue: Queue, started_job_registry, execution=None):
        super().handle_job_success(job, queue, started_job_registry, execution)
        from app.metrics import record_job_end

        record_job_end(self.connection, job)

    def request_stop(self, signum, frame):
        SHUTDOWN_REQUESTED["flag"] = True
        return super().request_stop(signum, frame)

    def register_death(self):
        try:
            self.connection.delete(loaded_key(self.name))
            self.connection.srem(LOADED_SET, self.name)
        finally:
            super().register_death()


def run_worker(settings: Settings, queues: list[str], burst: bool = False, preload: bool = True) -> None:
    from models.common import default_device

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    url = settings.redis_url or "redis://127.0.0.1:6379/0"
    connection = Redis.from_url(url, socket_connect_timeout=settings.redis_timeout_s, health_check_interval=30)
    device = default_device()
    models = ModelCache(settings, device)
    if preload:
        names = models.preload()
        log.info("preloaded %d model(s) on %s: %s", len(names), device, ", ".join(names) or "-")
    runner.STATE.update(settings=settings, device=device, models=models)
    ExplainqWorker.models = models
    ExplainqWorker.settings = settings
    worker = ExplainqWorker(
        [Queue(q, connection=connection, serializer=JSONSerializer) for q in queues],
        connection=connection,
        serializer=JSONSerializer,
        name=f"{socket.gethostname()}.{os.getpid()}",
        worker_ttl=max(settings.heartbeat_ttl_s, 20),
        maintenance_interval=max(settings.heartbeat_ttl_s, 10),
    )
    worker._publish_models()
    worker.work(burst=burst, with_scheduler=False, logging_level="INFO")
