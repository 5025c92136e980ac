"""What a training run will cost, before it is submitted: an estimate, said to be one (no torch, no FastAPI).

The formula is the same for every training kind: ``examples = epochs × training examples per epoch`` (images,
triples or impressions, read from the request and the dataset's registered counts), ``steps = epochs ×
ceil(per epoch / batch size)``, and a time ``examples / rate`` where the rate (examples per second) is measured
on the caller's own most recent succeeded run of the same kind: its examples by the same formula over its run
time. Without such a run there is no time, only the counts. The rate of another configuration (a larger model,
another worker) differs, which is why it is shown as an estimate with the run it comes from.

A kind takes part by giving ``JobKind.estimate``: ``(request, settings) -> TrainingSize | None`` (None when the
dataset's size is not known without reading it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class TrainingSize:
    """One run's size: ``per_epoch`` training ``unit`` (plural noun) in batches of ``batch_size``."""
    unit: str
    per_epoch: int
    epochs: int
    batch_size: int

    @property
    def examples(self) -> int:
        return self.per_epoch * self.epochs

    @property
    def steps(self) -> int:
        return self.epochs * math.ceil(self.per_epoch / max(self.batch_size, 1))


@dataclass(frozen=True)
class MeasuredRate:
    """Examples per second of an earlier run (``job_id``), from its size and its run time."""
    job_id: str
    per_second: float
    examples: int
    seconds: float


def _seconds(start: str | None, end: str | None) -> float | None:
    try:
        a = datetime.fromisoformat(str(start).replace("Z", "+00:00"))
        b = datetime.fromisoformat(str(end).replace("Z", "+00:00"))
    except ValueError:
        return None
    seconds = (b - a).total_seconds()
    return seconds if seconds > 0 else None


def measured_rate(job_id: str, view: dict[str, Any], size: TrainingSize | None) -> MeasuredRate | None:
    """The rate of a finished run: ``size`` (of its own request) over the time between its start and end."""
    seconds = _seconds(view.get("started_at"), view.get("finished_at"))
    if size is None or seconds is None or size.examples <= 0:
        return None
    return MeasuredRate(job_id, size.examples / seconds, size.examples, seconds)


def estimate(size: TrainingSize | None, rate: MeasuredRate | None) -> dict[str, Any]:
    """The answer of ``POST /kinds/{name}/estimate``: counts when the size is known, a time when a rate is."""
    out: dict[str, Any] = {"estimate": True, "unit": None, "per_epoch": None, "epochs": None, "batch_size": None,
                           "examples": None, "steps": None, "seconds": None, "rate": None,
                           "formula": "examples = epochs x training examples per epoch; steps = epochs x "
                           "ceil(per epoch / batch size); time = examples / the examples per second of your "
                           "latest succeeded run of this kind"}
    if size is None:
        return out
    out.update(unit=size.unit, per_epoch=size.per_epoch, epochs=size.epochs, batch_size=size.batch_size,
               examples=size.examples, steps=size.steps)
    if rate is not None:
        out["seconds"] = size.examples / rate.per_second
        out["rate"] = {"job_id": rate.job_id, "per_second": rate.per_second, "examples": rate.examples,
                       "seconds": rate.seconds}
    return out
