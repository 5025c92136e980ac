"""Demo preparation: every ``workers.jobs`` module with a ``prepare_demo(settings, progress)`` contributes."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import time

from core.settings import Settings

log = logging.getLogger("explainq.demo")


def demo_steps() -> list[tuple[str, object]]:
    import workers.jobs as jobs_pkg

    steps = []
    for info in sorted(pkgutil.iter_modules(jobs_pkg.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"workers.jobs.{info.name}")
        fn = getattr(module, "prepare_demo", None)
        if callable(fn):
            steps.append((info.name, fn))
    return steps


def prepare_all(settings: Settings, progress: bool = True, only: str | None = None) -> None:
    """Run every demo step; each is idempotent, so a second start costs only the checks."""
    wanted = {s.strip() for s in only.split(",")} if only else None
    failures = []
    for name, fn in demo_steps():
        if wanted is not None and name not in wanted:
            continue
        t0 = time.perf_counter()
        try:
            fn(settings, progress=progress)
        except Exception:
            log.exception("demo step %s failed", name)
            failures.append(name)
            continue
        log.info("demo step %s ready in %.1fs", name, time.perf_counter() - t0)
    if failures:
        raise SystemExit(f"demo steps failed: {', '.join(failures)}")
