"""Live training metrics for the job page and the SDK: the per-epoch history and the per-step running-loss curve
in ``job.meta["metrics"]``, written at most every ``interval_s`` (and at every epoch's end)."""

from __future__ import annotations

import time
from typing import Any

from workers.context import JobContext

METRICS_INTERVAL_S = 2.0


class LiveMetrics:
    """Rate-limited ``metrics`` for a training job's progress reports.

    ``metrics(history, curve, **latest)`` is the dict to send now (``force`` at an epoch's end), or None when
    the last one was sent less than ``interval_s`` ago: the meta write (a Redis round trip with the whole curve,
    at most a few hundred points) then happens at most every ``interval_s`` whatever the step rate."""

    def __init__(self, ctx: JobContext, interval_s: float = METRICS_INTERVAL_S):
        self.ctx = ctx
        self.interval_s = interval_s
        self._last = float("-inf")

    def metrics(self, history: list[dict[str, Any]], curve: Any, force: bool = False,
                **latest: Any) -> dict[str, Any] | None:
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return None
        self._last = now
        return {**latest, "history": list(history), "steps": curve.rows() if curve is not None else []}
