"""The demo preparation's plan and progress, shared through Redis (no torch, no FastAPI).

``explainq demo`` (run by ``explainq up`` on first start) writes its plan to ``explainq:demo:plan`` before it
prepares anything: every step in the order it will run, with the models and datasets the step registers and its
state (``pending``, ``preparing``, ``ready``, ``failed``). While it runs, ``explainq:demo:alive`` is refreshed with
a short TTL. Readers (``GET /models``, ``GET /status``, submissions naming a model) see a step as still coming only
while that key lives: a demo process that died leaves no model ``preparing`` for ever.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any

from core import keys

PENDING, PREPARING, READY, FAILED = "pending", "preparing", "ready", "failed"
STATES = (PENDING, PREPARING, READY, FAILED)
ALIVE_TTL_S = 30
BEAT_S = 5.0
MIN_RETRY_S, MAX_RETRY_S = 5, 3600


def _now() -> float:
    return round(time.time(), 3)


class DemoProgress:
    """The writer: ``explainq demo``'s plan and each step's start and end; a thread keeps the alive key."""

    def __init__(self, redis: Any, steps: Sequence[dict[str, Any]]):
        self.redis = redis
        self.plan = {
            "started_at": _now(),
            "steps": [{"name": s["name"], "models": list(s.get("models", ())),
                       "datasets": list(s.get("datasets", ())), "kinds": list(s.get("kinds", ())),
                       "cost_s": float(s.get("cost_s", 0.0)), "state": PENDING, "started_at": None,
                       "ended_at": None} for s in steps],
        }
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _write(self) -> None:
        with self.redis.pipeline() as pipe:
            pipe.set(keys.DEMO_PLAN, json.dumps(self.plan))
            pipe.set(keys.DEMO_ALIVE, "1", ex=ALIVE_TTL_S)
            pipe.execute()

    def __enter__(self) -> DemoProgress:
        self._write()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="demo-alive")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.plan["ended_at"] = _now()
        with self.redis.pipeline() as pipe:
            pipe.set(keys.DEMO_PLAN, json.dumps(self.plan))
            pipe.delete(keys.DEMO_ALIVE)
            pipe.execute()

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                self.redis.set(keys.DEMO_ALIVE, "1", ex=ALIVE_TTL_S)
            except Exception:  # Redis briefly away: the next beat tries again
                pass

    def _step(self, name: str) -> dict[str, Any]:
        return next(s for s in self.plan["steps"] if s["name"] == name)

    def start(self, name: str) -> None:
        self._step(name).update(state=PREPARING, started_at=_now())
        self._write()

    def end(self, name: str, ok: bool) -> None:
        self._step(name).update(state=READY if ok else FAILED, ended_at=_now())
        self._write()


def read(redis: Any, now: float | None = None) -> dict[str, Any]:
    """The demo's plan as readers see it: ``{"active", "steps", "counts", "started_at", "ended_at"}``.

    ``active`` is whether the preparing process is alive; when it is not, steps it left ``pending`` or
    ``preparing`` read ``interrupted``. ``steps`` is ``[]`` when no demo was ever prepared here."""
    with redis.pipeline(transaction=False) as pipe:
        pipe.get(keys.DEMO_PLAN)
        pipe.exists(keys.DEMO_ALIVE)
        raw, alive = pipe.execute()
    return interpret(raw, bool(alive), now)


async def aread(aredis: Any, now: float | None = None) -> dict[str, Any]:
    """``read`` on an async Redis client."""
    async with aredis.pipeline(transaction=False) as pipe:
        pipe.get(keys.DEMO_PLAN)
        pipe.exists(keys.DEMO_ALIVE)
        raw, alive = await pipe.execute()
    return interpret(raw, bool(alive), now)


def interpret(raw: bytes | str | None, alive: bool, now: float | None = None) -> dict[str, Any]:
    """The plan's JSON (``explainq:demo:plan``) and whether the preparing process is alive, as ``read`` says."""
    plan = _parse(raw)
    active = bool(alive) and plan is not None
    steps = []
    for step in (plan or {}).get("steps", []):
        state = step.get("state")
        if state not in STATES:
            continue
        if not active and state in (PENDING, PREPARING):
            state = "interrupted"
        steps.append({**step, "state": state})
    counts = {s: sum(1 for st in steps if st["state"] == s) for s in (*STATES, "interrupted")}
    out = {"active": active, "steps": steps, "counts": counts,
           "started_at": (plan or {}).get("started_at"), "ended_at": (plan or {}).get("ended_at")}
    out["eta_s"] = _eta(steps, now or time.time()) if active else None
    return out


def _parse(raw: bytes | str | None) -> dict[str, Any] | None:
    if not raw:
        return None
    try:
        plan = json.loads(raw)
    except ValueError:
        return None
    return plan if isinstance(plan, dict) and isinstance(plan.get("steps"), list) else None


# The estimate. Each step has a planned cost (seconds on 2 free cores, ``DemoStep.cost_s``). The machine's pace is
# measured as the demo goes: the seconds the ended steps took (and the running one, once past its plan) over the
# seconds planned for them, so the estimate of the steps still to come is updated whenever a step ends, and is not
# stuck at "about 7 minutes" on a machine twice as slow. A running step past its paced cost is given a quarter of
# the time it has run so far to go: an overdue step never reads as done.
MIN_PACE, MAX_PACE = 0.2, 20.0
OVERDUE_SHARE = 0.25


def _pace(steps: list[dict[str, Any]], now: float) -> float:
    """Measured seconds per planned second over the ended steps and an overrunning running step; 1 before any."""
    spent = planned = 0.0
    for step in steps:
        cost = float(step.get("cost_s") or 0.0)
        started, ended = step.get("started_at"), step.get("ended_at")
        if cost <= 0 or not started:
            continue
        if step["state"] in (READY, FAILED) and ended:
            spent, planned = spent + max(float(ended) - float(started), 0.0), planned + cost
        elif step["state"] == PREPARING and now - float(started) > cost:
            spent, planned = spent + (now - float(started)), planned + cost
    if planned <= 0:
        return 1.0
    return min(max(spent / planned, MIN_PACE), MAX_PACE)


def _remaining(step: dict[str, Any], now: float, pace: float = 1.0) -> float:
    """Seconds the estimate leaves to ``step``: its paced cost, less the time it has run when running."""
    cost = float(step.get("cost_s") or 0.0) * pace
    if step["state"] == PREPARING and step.get("started_at"):
        elapsed = max(now - float(step["started_at"]), 0.0)
        return max(cost - elapsed, OVERDUE_SHARE * elapsed)
    return cost if step["state"] == PENDING else 0.0


def _eta(steps: list[dict[str, Any]], now: float) -> float:
    pace = _pace(steps, now)
    return round(sum(_remaining(s, now, pace) for s in steps), 1)


def coming(status: dict[str, Any], section: str, now: float | None = None) -> dict[str, dict[str, Any]]:
    """``name -> {"state", "step", "kinds", "retry_after_s"}`` for the ``models`` or ``datasets`` the live demo has
    not registered yet; ``kinds`` are the job kinds the step prepares them for; ``retry_after_s`` is the estimate
    of when that step ends (all steps before it included, at the measured pace), bounded to
    [``MIN_RETRY_S``, ``MAX_RETRY_S``]."""
    if not status.get("active"):
        return {}
    now = now or time.time()
    pace = _pace(status["steps"], now)
    out: dict[str, dict[str, Any]] = {}
    waited = 0.0
    for step in status["steps"]:
        waited += _remaining(step, now, pace)
        if step["state"] not in (PENDING, PREPARING):
            continue
        retry = int(min(max(waited, MIN_RETRY_S), MAX_RETRY_S))
        for name in step.get(section, []):
            out.setdefault(name, {"state": step["state"], "step": step["name"], "kinds": list(step.get("kinds") or []),
                                  "retry_after_s": retry})
    return out


def preparing(redis: Any, section: str, name: str) -> dict[str, Any] | None:
    """The live demo's record of model or dataset ``name`` when it is still to be registered, else None."""
    return coming(read(redis), section).get(name)
