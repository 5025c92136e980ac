"""Placement: which workers may run a job (no torch).

Operators describe their **worker classes** once, in ``EXPLAINQ_WORKER_CLASSES`` (the same value for the API and
every worker), as a JSON object: class name -> what one worker of the class offers and which queues it serves::

    {"cpu": {"queues": ["explain", "bulk"], "memory_gib": 8},
     "gpu-h100": {"queues": ["train"], "gpu": true, "gpu_memory_gib": 80, "memory_gib": 32}}

A worker joins a class with ``explainq worker --class NAME`` (or ``EXPLAINQ_WORKER_CLASS``): it serves the class's
queues, each as ``<queue>@<class>`` first and then the plain ``<queue>``, and refuses to start when its hardware
falls short of what its class promises (a GPU, the GPU's memory). It advertises its class and what it has
(``GET /workers``). ``EXPLAINQ_WORKER_RESOURCES`` declares what a worker has instead of what it detects (for a
device it cannot see, and to simulate a GPU class in tests).

A job states what it needs in its request's ``requirements`` (``gpu``, ``gpu_memory_gib``, ``device_class``); the
memory its kind's estimate says it needs (``core/memory.py`` and the kinds' own checks, through
:func:`memory_budget`) is one more need. At submission :func:`place` picks the job's queue among the classes that
serve the kind's queue:

- every such class can run it: the plain queue (any of their workers takes it, whichever is free first);
- only some can: ``<queue>@<class>`` of the smallest of those (by memory budget, then GPU memory, then name), which
  only that class's workers serve: a job goes to the cheapest class that can run it, and only there;
- none can: a 422 naming the requirement (or the fields that drive the memory estimate) and what the classes offer.

A class's **memory budget** is what one job may use on one of its workers: its GPU's memory for a GPU class, its
``memory_gib`` otherwise (unstated: not checked). Without classes, ``EXPLAINQ_WORKER_MEMORY_BYTES`` is every
worker's budget, as before, and a request that states requirements is refused (no worker says what it has).

At pick-up a worker checks the job's placement (``meta["placement"]``) against what it offers
(:func:`fits`); a job it cannot run (queued before the classes changed, or taken from a plain queue by a worker of
no class) is handed on to the queue :func:`place` names, at its front, without running; when that is the queue it
came from, it fails as ``no_capable_worker`` rather than going round (``workers/worker.py``).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from core.contract.errors import FieldError
from core.contract.fields import CLASS_PATTERN, Requirements

# The kinds' queues (core.contract.kind re-exports them). Workers list theirs in priority order: "explain,bulk"
# serves an interactive request before the next shard of a dataset-scale run; "train" runs long training jobs on
# workers of its own.
QUEUES = ("explain", "bulk", "train")
GIB = 1024**3
SEPARATOR = "@"  # a class's own queue: <queue>@<class>
MAX_CLASSES = 64


class ClassSpec(BaseModel):
    """One entry of ``EXPLAINQ_WORKER_CLASSES``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    queues: list[str] = Field(..., min_length=1, max_length=len(QUEUES))
    gpu: bool = False
    gpu_memory_gib: float | None = Field(None, gt=0, le=4096)
    memory_gib: float | None = Field(None, gt=0, le=65536)

    @model_validator(mode="after")
    def _consistent(self) -> ClassSpec:
        unknown = [q for q in self.queues if q not in QUEUES]
        if unknown:
            raise ValueError(f"queues {unknown} are not among {list(QUEUES)}")
        if self.gpu_memory_gib is not None and not self.gpu:
            raise ValueError("gpu_memory_gib needs gpu: true")
        if self.gpu and self.gpu_memory_gib is None:
            raise ValueError("a GPU class states its GPU's memory (gpu_memory_gib)")
        return self


@dataclass(frozen=True)
class WorkerClass:
    name: str
    queues: tuple[str, ...]
    gpu: bool = False
    gpu_memory_bytes: int = 0
    memory_bytes: int = 0  # host memory one job may use; 0: not stated

    @property
    def budget_bytes(self) -> int:
        """What one job may use on one of this class's workers: the GPU's memory, or host memory (0: unchecked)."""
        return self.gpu_memory_bytes if self.gpu else self.memory_bytes

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "queues": list(self.queues), "gpu": self.gpu,
                "gpu_memory_bytes": self.gpu_memory_bytes or None, "memory_bytes": self.memory_bytes or None}


def _bytes(gib: float | None) -> int:
    return int(round(gib * GIB)) if gib else 0


@lru_cache(maxsize=16)
def parse_classes(raw: str) -> dict[str, WorkerClass]:
    """``EXPLAINQ_WORKER_CLASSES`` parsed; a ValueError naming the variable and the entry for anything wrong."""
    if not raw.strip():
        return {}
    try:
        table = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"EXPLAINQ_WORKER_CLASSES is not JSON: {exc}") from None
    if not isinstance(table, dict) or not table:
        raise ValueError("EXPLAINQ_WORKER_CLASSES must be a JSON object: class name -> {queues, gpu, "
                         "gpu_memory_gib, memory_gib}")
    if len(table) > MAX_CLASSES:
        raise ValueError(f"EXPLAINQ_WORKER_CLASSES names more than {MAX_CLASSES} classes")
    import re

    out: dict[str, WorkerClass] = {}
    for name, entry in table.items():
        if not isinstance(name, str) or not re.fullmatch(CLASS_PATTERN, name):
            raise ValueError(f"EXPLAINQ_WORKER_CLASSES: class name {name!r} must match {CLASS_PATTERN}")
        try:
            spec = ClassSpec.model_validate(entry)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"EXPLAINQ_WORKER_CLASSES[{name!r}]{'.' + where if where else ''}: "
                             f"{first['msg']}") from None
        out[name] = WorkerClass(name, tuple(dict.fromkeys(spec.queues)), spec.gpu, _bytes(spec.gpu_memory_gib),
                                _bytes(spec.memory_gib))
    return out


def worker_classes(settings: Any) -> dict[str, WorkerClass]:
    return parse_classes(settings.worker_classes_raw)


def class_queue(queue: str, class_name: str) -> str:
    return f"{queue}{SEPARATOR}{class_name}"


def base_queue(queue: str) -> str:
    """``train`` of ``train@gpu-h100`` (and of ``train``)."""
    return queue.split(SEPARATOR, 1)[0]


def all_queues(settings: Any) -> tuple[str, ...]:
    """Every queue a job may wait in: the kinds' queues, then each class's own."""
    classes = worker_classes(settings)
    return QUEUES + tuple(class_queue(q, c.name) for c in classes.values() for q in c.queues)


def serving_queues(wc: WorkerClass | None, queues: list[str]) -> list[str]:
    """What a worker of class ``wc`` listens on, in priority order, for its ``queues``: each class queue before its
    plain queue (a worker of no class: the plain queues)."""
    if wc is None:
        return list(queues)
    return [name for q in queues for name in (class_queue(q, wc.name), q)]


# ------------------------------------------------------------------------------------------------- admission
@dataclass
class Admission:
    """The request being admitted (``admitting``): its queue and requirements, and the most memory any of its
    checks said it needs."""

    settings: Any
    queue: str
    requirements: Requirements | None
    memory_bytes: int = 0


_ADMISSION: ContextVar[Admission | None] = ContextVar("explainq_admission", default=None)


@contextlib.contextmanager
def admitting(settings: Any, queue: str, requirements: Requirements | None) -> Iterator[Admission]:
    """While a kind's ``validate`` runs: its memory checks (:func:`memory_budget`) compare with the classes that
    could take this request and record what it needs, for :func:`place`."""
    admission = Admission(settings, queue, requirements)
    token = _ADMISSION.set(admission)
    try:
        yield admission
    finally:
        _ADMISSION.reset(token)


def _stated(requirements: Requirements | None) -> dict[str, Any]:
    if requirements is None:
        return {}
    return requirements.model_dump(exclude_none=True)


def _meets(wc: WorkerClass, needs: dict[str, Any]) -> str | None:
    """The requirement field class ``wc`` fails (``memory`` for the memory estimate), or None."""
    if "device_class" in needs and needs["device_class"] != wc.name:
        return "device_class"
    if "gpu" in needs and bool(needs["gpu"]) != wc.gpu:
        return "gpu"
    if "gpu_memory_gib" in needs and (not wc.gpu or wc.gpu_memory_bytes < needs["gpu_memory_gib"] * GIB):
        return "gpu_memory_gib"
    if needs.get("memory_bytes") and wc.budget_bytes and wc.budget_bytes < needs["memory_bytes"]:
        return "memory"
    return None


_WORKER_BUDGET: list[int | None] = [None]  # set in a worker process: the memory budget of one job here


def set_worker_budget(budget_bytes: int | None) -> None:
    """In a worker: the budget its own checks use (its class's, else ``EXPLAINQ_WORKER_MEMORY_BYTES``)."""
    _WORKER_BUDGET[0] = budget_bytes


def memory_budget(settings: Any, need_bytes: int) -> int:
    """The memory a request's job may use on the workers that could take it (0: not checked), with ``need_bytes``
    recorded for :func:`place` when a request is being admitted. Without classes (or outside an admission):
    ``EXPLAINQ_WORKER_MEMORY_BYTES``. With classes: the largest budget among the classes that serve the request's
    queue and meet its stated requirements (0 when one of them states none)."""
    admission = _ADMISSION.get()
    if admission is not None:
        admission.memory_bytes = max(admission.memory_bytes, int(need_bytes))
    if admission is None and _WORKER_BUDGET[0] is not None:
        return _WORKER_BUDGET[0]  # a worker re-checking a job: its own budget
    classes = worker_classes(settings)
    if admission is None or not classes:
        return settings.worker_memory_bytes
    needs = _stated(admission.requirements)
    able = [c for c in classes.values() if admission.queue in c.queues and _meets(c, needs) is None]
    if not able:
        return settings.worker_memory_bytes  # place() refuses the requirements themselves, naming them
    if any(c.budget_bytes == 0 for c in able):
        return 0
    return max(c.budget_bytes for c in able)


@dataclass(frozen=True)
class Placement:
    queue: str                       # where the job waits
    worker_class: str | None = None  # the class whose own queue it is, when only some classes can run it
    needs: dict[str, Any] = field(default_factory=dict)  # stated requirements, and memory_bytes when estimated

    def meta(self) -> dict[str, Any]:
        """What the job carries for the check at pick-up."""
        return {"queue": self.queue, "class": self.worker_class, "needs": self.needs}


def _offer(classes: list[WorkerClass]) -> str:
    parts = []
    for c in classes:
        what = f"GPU with {c.gpu_memory_bytes / GIB:g} GiB" if c.gpu else "no GPU"
        if not c.gpu and c.memory_bytes:
            what += f", {c.memory_bytes / GIB:g} GiB"
        parts.append(f"{c.name} ({what})")
    return ", ".join(parts)


def place(settings: Any, queue: str, requirements: Requirements | None, memory_bytes: int = 0) -> Placement:
    """The queue of a job of a kind on ``queue`` with these needs (see the module's docstring); a FieldError on
    ``requirements`` (or the requirement) when no class serving ``queue`` can run it."""
    needs = _stated(requirements)
    if memory_bytes:
        needs["memory_bytes"] = int(memory_bytes)
    return place_needs(settings, queue, needs)


def place_needs(settings: Any, queue: str, needs: dict[str, Any]) -> Placement:
    """:func:`place` of needs as a job's placement carries them (the stated requirements and ``memory_bytes``)."""
    stated = _stated_value(needs)
    classes = worker_classes(settings)
    if not classes:
        needs = stated
        if needs:
            first = next(iter(needs))
            raise Unplaceable(("body", "requirements", first), "this service defines no worker classes "
                              "(EXPLAINQ_WORKER_CLASSES), so no worker says what it has: every worker takes every "
                              "job of its queue; leave requirements out", value=needs[first])
        return Placement(queue)
    serving = [c for c in classes.values() if queue in c.queues]
    if not serving:  # only workers of no class serve this queue (EXPLAINQ_WORKER_MEMORY_BYTES was checked)
        if stated:
            first = next(iter(stated))
            raise Unplaceable(("body", "requirements", first), f"no worker class serves queue {queue!r}, so no "
                              "worker of it says what it has; leave requirements out", value=stated[first])
        return Placement(queue)
    target = _smallest_able(serving, needs)
    if target is None:  # the memory estimate when a class meets what was stated, else a stated requirement
        meet_stated = [c for c in serving if _meets(c, stated) is None]
        failed = {"memory"} if meet_stated else {_meets(c, stated) for c in serving}
        field_name = next(f for f in ("device_class", "gpu", "gpu_memory_gib", "memory") if f in failed)
        raise _refusal(field_name, needs, f"no worker class that serves queue {queue!r} can run it; they offer: "
                       f"{_offer(serving)}")
    if "device_class" not in needs and all(_meets(c, needs) is None for c in serving):
        return Placement(queue, None, needs)
    return Placement(class_queue(queue, target.name), target.name, needs)


def _smallest_able(serving: list[WorkerClass], needs: dict[str, Any]) -> WorkerClass | None:
    able = [c for c in serving if _meets(c, needs) is None]
    if not able:
        return None
    return min(able, key=lambda c: (c.budget_bytes or math.inf, c.gpu_memory_bytes, c.name))


def hand_on_queue(settings: Any, origin: str, placement: dict[str, Any] | None) -> str | None:
    """Where a worker that cannot run a job (taken from ``origin``) hands it on: the own queue of the smallest class
    that serves its queue and can run it; None when there is none, or it is ``origin`` itself."""
    needs = (placement or {}).get("needs") or {}
    serving = [c for c in worker_classes(settings).values() if base_queue(origin) in c.queues]
    target = _smallest_able(serving, needs)
    if target is None:
        return None
    queue = class_queue(base_queue(origin), target.name)
    return None if queue == origin else queue


class Unplaceable(FieldError):
    """No worker class can run the job: the memory its estimate needs, or a stated requirement."""


def _refusal(field_name: str, needs: dict[str, Any], why: str) -> FieldError:
    if field_name == "memory":
        need = needs["memory_bytes"] / GIB
        return Unplaceable(("body", "requirements"), f"the job needs about {need:,.1f} GiB of worker memory "
                           f"(its kind's estimate) with these requirements: {why}", value=_stated_value(needs))
    return Unplaceable(("body", "requirements", field_name), f"{field_name} {needs[field_name]!r}: {why}",
                       value=needs[field_name])


def _stated_value(needs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in needs.items() if k != "memory_bytes"}


# ------------------------------------------------------------------------------------------------- pick-up
@dataclass(frozen=True)
class Offer:
    """What one worker offers: its class (None: no class), and what it has (detected or declared)."""

    worker_class: WorkerClass | None
    gpu: bool
    gpu_memory_bytes: int
    gpu_name: str | None
    memory_bytes: int  # the budget of one job here: its class's, else EXPLAINQ_WORKER_MEMORY_BYTES (0: unchecked)
    declared: bool = False

    def describe(self) -> dict[str, Any]:
        return {"class": self.worker_class.name if self.worker_class else None, "gpu": self.gpu,
                "gpu_name": self.gpu_name, "gpu_memory_bytes": self.gpu_memory_bytes or None,
                "memory_budget_bytes": self.memory_bytes or None, "declared": self.declared}


def fits(offer: Offer, placement: dict[str, Any] | None) -> str | None:
    """Why this worker cannot run a job placed as ``placement`` (a job's ``meta["placement"]``), or None."""
    if not placement:
        return None
    needs = placement.get("needs") or {}
    wc = offer.worker_class
    wanted = placement.get("class")
    if wanted and (wc is None or wc.name != wanted):
        return f"it was placed on class {wanted!r}"
    if "device_class" in needs and (wc is None or wc.name != needs["device_class"]):
        return f"it needs device class {needs['device_class']!r}"
    if "gpu" in needs and bool(needs["gpu"]) != offer.gpu:
        return "it needs a GPU" if needs["gpu"] else "it needs a worker without a GPU"
    if "gpu_memory_gib" in needs and (not offer.gpu or offer.gpu_memory_bytes < needs["gpu_memory_gib"] * GIB):
        return f"it needs a GPU with {needs['gpu_memory_gib']:g} GiB"
    budget = offer.memory_bytes
    if needs.get("memory_bytes") and budget and budget < needs["memory_bytes"]:
        return f"it needs about {needs['memory_bytes'] / GIB:,.1f} GiB, more than this worker's {budget / GIB:,.1f}"
    return None


class ResourcesSpec(BaseModel):
    """``EXPLAINQ_WORKER_RESOURCES``: what this worker has, declared instead of detected."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    gpu: bool = False
    gpu_memory_gib: float | None = Field(None, gt=0, le=4096)
    gpu_name: str | None = Field(None, max_length=128)


def worker_offer(settings: Any, class_name: str | None, detected: dict[str, Any]) -> Offer:
    """This worker's offer: its class (from the table; a ValueError for an unknown one) and what it has:
    ``EXPLAINQ_WORKER_RESOURCES`` when set, else ``detected`` (``{"gpu", "gpu_memory_bytes", "gpu_name"}``).
    A ValueError when it has less than its class promises (no GPU, a smaller one)."""
    classes = worker_classes(settings)
    wc = None
    if class_name:
        if class_name not in classes:
            known = ", ".join(sorted(classes)) or "none: set EXPLAINQ_WORKER_CLASSES"
            raise ValueError(f"worker class {class_name!r} is not in EXPLAINQ_WORKER_CLASSES (known: {known})")
        wc = classes[class_name]
    declared = bool(settings.worker_resources_raw.strip())
    if declared:
        try:
            spec = ResourcesSpec.model_validate_json(settings.worker_resources_raw)
        except ValidationError as exc:
            raise ValueError(f"EXPLAINQ_WORKER_RESOURCES: {exc.errors()[0]['msg']}") from None
        gpu, gpu_bytes, gpu_name = spec.gpu, _bytes(spec.gpu_memory_gib), spec.gpu_name
    else:
        gpu = bool(detected.get("gpu"))
        gpu_bytes, gpu_name = int(detected.get("gpu_memory_bytes") or 0), detected.get("gpu_name")
    if wc is not None:
        if wc.gpu and not gpu:
            raise ValueError(f"worker class {wc.name!r} promises a GPU and this worker has none (a CUDA torch and "
                             "a visible device, or EXPLAINQ_WORKER_RESOURCES)")
        if wc.gpu and gpu_bytes < wc.gpu_memory_bytes * 0.97:  # drivers report a little less than the card's size
            raise ValueError(f"worker class {wc.name!r} promises {wc.gpu_memory_bytes / GIB:g} GiB of GPU memory "
                             f"and this worker's GPU has {gpu_bytes / GIB:.1f} GiB")
        return Offer(wc, gpu, gpu_bytes, gpu_name, wc.budget_bytes, declared)
    return Offer(None, gpu, gpu_bytes, gpu_name, settings.worker_memory_bytes, declared)
