"""Demo preparation, in order of usefulness, with its plan and progress in Redis (``core/demo_status.py``).

Every ``workers.jobs`` module contributes steps: ``demo_steps()`` returning :class:`DemoStep` (one per model or
dataset, with what it makes usable and what it costs), or a plain ``prepare_demo(settings, progress)``, which is one
step of unknown cost. :func:`order_by_usefulness` puts them in the order they run; ``explainq up`` starts the
workers as soon as the first step that registers a model is ready and lets the rest run in the background.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from core.settings import Settings

log = logging.getLogger("explainq.demo")

UNKNOWN_COST_S = 600.0  # a plugin's prepare_demo, which says nothing of its cost, runs after every known step


@dataclass(frozen=True)
class DemoStep:
    """One unit of demo preparation: idempotent (a second start costs only its checks)."""

    name: str
    run: Callable[..., None]  # run(settings, progress=...)
    models: tuple[str, ...] = ()  # registered by this step
    datasets: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()  # the job kinds this step makes usable
    explains: bool = False  # those kinds explain a model (rather than train one)
    cost_s: float = UNKNOWN_COST_S  # estimated seconds on 2 free cores
    module: str = ""


def usefulness_key(step: DemoStep, served: set[str]) -> tuple[int, float, str]:
    """The sort key of ``step`` once the kinds in ``served`` are usable: first what makes an explanation kind usable
    that was not (tier 0), then what makes any new kind usable (1), then the rest (2); cheapest first in a tier."""
    new = set(step.kinds) - served
    tier = 0 if new and step.explains else 1 if new else 2
    return tier, step.cost_s, step.name


def order_by_usefulness(steps: Iterable[DemoStep]) -> list[DemoStep]:
    """The steps in the order they run: greedily, the most useful next step given what the steps before it make
    usable (:func:`usefulness_key`), so every explanation kind gets its first model before any kind gets a second
    one, and a cheap step is never stuck behind an expensive one of the same tier."""
    left = list(steps)
    served: set[str] = set()
    out: list[DemoStep] = []
    while left:
        best = min(left, key=lambda s: usefulness_key(s, served))
        left.remove(best)
        out.append(best)
        served.update(best.kinds)
    return out


def demo_steps() -> list[DemoStep]:
    """Every job module's steps, unordered (module order)."""
    import workers.jobs as jobs_pkg

    steps: list[DemoStep] = []
    for info in sorted(pkgutil.iter_modules(jobs_pkg.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"workers.jobs.{info.name}")
        described = getattr(module, "demo_steps", None)
        if callable(described):
            steps.extend(DemoStep(**{**s.__dict__, "module": info.name}) for s in described())
            continue
        fn = getattr(module, "prepare_demo", None)
        if callable(fn):
            steps.append(DemoStep(info.name, fn, module=info.name))
    return steps


def plan(only: str | None = None) -> list[DemoStep]:
    """The steps ``explainq demo`` runs, in order; ``only``: comma-separated job modules or step names."""
    wanted = {s.strip() for s in only.split(",")} if only else None
    steps = [s for s in demo_steps() if wanted is None or s.module in wanted or s.name in wanted]
    return order_by_usefulness(steps)


def prepare_all(settings: Settings, progress: bool = True, only: str | None = None) -> None:
    """Run the plan, recording it and each step's start and end in Redis for the API and ``explainq up``."""
    from core import demo_status, registry

    steps = plan(only)
    record = [{"name": s.name, "models": s.models, "datasets": s.datasets, "kinds": s.kinds, "cost_s": s.cost_s}
              for s in steps]
    failures = []
    with demo_status.DemoProgress(registry.connection(settings), record) as recorder:
        for step in steps:
            recorder.start(step.name)
            t0 = time.perf_counter()
            try:
                step.run(settings, progress=progress)
            except Exception:
                log.exception("demo step %s failed", step.name)
                failures.append(step.name)
                recorder.end(step.name, ok=False)
                continue
            recorder.end(step.name, ok=True)
            log.info("demo step %s ready in %.1fs", step.name, time.perf_counter() - t0)
    if failures:
        raise SystemExit(f"demo steps failed: {', '.join(failures)}")
