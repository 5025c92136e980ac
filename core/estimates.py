"""What a training run will cost, before it is submitted: an estimate, said to be one (no torch, no FastAPI).

The formula is the same for every training kind: ``examples = epochs × training examples per epoch`` (images,
triples or impressions, read from the request and the dataset's registered counts), ``steps = epochs ×
ceil(per epoch / batch size)``, and a time ``examples / rate`` where the rate (examples per second) is measured
on the caller's own most recent succeeded run of the same kind: its examples by the same formula over its run
time. Without such a run there is no time, only the counts. The rate of another configuration (a larger model,
another worker) differs, which is why it is shown as an estimate with the run it comes from.

A kind takes part by giving ``JobKind.estimate``: ``(request, settings, owner) -> TrainingSize | None`` (None when
the dataset's size is not known without reading it).

An evaluation (``evaluate_attribution``, ``evaluate_mislabel``) trains many ConvE models: its estimate is an
:class:`EvaluationSize`, the models it trains in groups (subset models, replicates, the full-data model, ensemble
members, the model of the corrupted graph), each of a :class:`TrainingSize` with the recipe's parameter count, and
the bytes it writes. Its time follows a stated model, ``seconds = k x training examples x parameters`` (a ConvE
step's work grows with the queries it scores and the weights each touches), with ``k`` measured on the caller's
newest succeeded ``train_conve`` run of known size (``basis`` "measured") or, without one,
:data:`CONVE_SECONDS_PER_EXAMPLE_PARAMETER`, measured on this project's reference machine (``basis`` "model").
It is the training's time on one worker, run after run: the estimators' own time is not in it, and a fanned-out
evaluation's shards share the ``bulk`` workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class TrainingSize:
    """One run's size: ``per_epoch`` training ``unit`` (plural noun) in batches of ``batch_size``; ``parameters``
    the model's, when the kind knows it (ConvE: ``core.memory.conve_training``)."""
    unit: str
    per_epoch: int
    epochs: int
    batch_size: int
    parameters: int | None = None

    @property
    def examples(self) -> int:
        return self.per_epoch * self.epochs

    @property
    def steps(self) -> int:
        return self.epochs * math.ceil(self.per_epoch / max(self.batch_size, 1))


@dataclass(frozen=True)
class MeasuredRate:
    """Examples per second of an earlier run (``job_id``), from its size and its run time (``parameters``: its
    model's, when known)."""
    job_id: str
    per_second: float
    examples: int
    seconds: float
    parameters: int | None = None


# The stated model's constant without a measured run: seconds per (training example x parameter) of ConvE training
# on 2 shared cores of an AMD EPYC, loaded: the evaluation recipe's defaults on nations (dim 100, 32 filters, batch
# 128, reciprocal; 3 epochs, 9,552 examples, 473,900 parameters) took 9.15 s, k 2.02e-9; 20,552 and 2,099,400
# parameters gave 1.8e-9 and 2.1e-9 to 2.6e-9, a 4,044-parameter model 7.5e-9 (docs/quality.md).
CONVE_SECONDS_PER_EXAMPLE_PARAMETER = 2.0e-9
FLOAT_BYTES = 4  # a float32 weight
SUSPECT_ROW_BYTES = 72  # a suspects.csv row, measured with FB15k-237-like names (19.7 MB for 272,115 rows)


@dataclass(frozen=True)
class ModelGroup:
    """``count`` models of one role, each trained as ``size``."""
    what: str
    count: int
    size: TrainingSize


@dataclass(frozen=True)
class EvaluationSize:
    """What an evaluation trains (``groups``) and writes (``disk``: bytes by what, each approximate), the
    models' ``parameters`` (one recipe), and what it may reuse instead of training (``reuse``)."""
    groups: tuple[ModelGroup, ...]
    parameters: int
    disk: dict[str, int]
    reuse: str

    @property
    def trainings(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def examples(self) -> int:
        return sum(g.count * g.size.examples for g in self.groups)

    @property
    def steps(self) -> int:
        return sum(g.count * g.size.steps for g in self.groups)


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
    return MeasuredRate(job_id, size.examples / seconds, size.examples, seconds, size.parameters)


def seconds_per_example_parameter(rate: MeasuredRate | None) -> float | None:
    """``k`` of the stated model from a measured run (None: no run, or its parameter count is unknown)."""
    if rate is None or not rate.parameters:
        return None
    return rate.seconds / (rate.examples * rate.parameters)


def evaluation_estimate(size: EvaluationSize, rate: MeasuredRate | None,
                        rate_kind: str = "train_conve") -> dict[str, Any]:
    """The answer of ``POST /kinds/{name}/estimate`` for an evaluation: its trainings, their examples and steps,
    the training time by the stated model (``k`` from ``rate``, a run of ``rate_kind``, else the reference
    constant, measured on ConvE) and the bytes it writes."""
    measured = seconds_per_example_parameter(rate)
    k = measured if measured is not None else CONVE_SECONDS_PER_EXAMPLE_PARAMETER
    first = size.groups[0].size
    return {
        "estimate": True, "unit": first.unit, "per_epoch": None, "epochs": first.epochs,
        "batch_size": first.batch_size, "examples": size.examples, "steps": size.steps,
        "trainings": size.trainings, "parameters": size.parameters,
        "models": [{"what": g.what, "count": g.count, "per_epoch": g.size.per_epoch, "epochs": g.size.epochs,
                    "examples": g.count * g.size.examples} for g in size.groups],
        "seconds": k * size.examples * size.parameters,
        "basis": "measured" if measured is not None else "model",
        "seconds_per_example_parameter": k,
        "rate": None if measured is None or rate is None else {
            "job_id": rate.job_id, "per_second": rate.per_second, "examples": rate.examples,
            "seconds": rate.seconds, "parameters": rate.parameters},
        "disk_bytes": sum(size.disk.values()), "disk": dict(size.disk),
        "reuse": size.reuse,
        "formula": "trainings = the models the evaluation needs; examples = each model's epochs x its training "
                   + ("triples per epoch (twice with reciprocal relations)" if first.unit == "triples" else
                      f"{first.unit} per epoch") + ", summed; time = k x examples x parameters, "
                   "k " + (f"measured on your latest succeeded {rate_kind} run" if measured is not None else
                           f"{CONVE_SECONDS_PER_EXAMPLE_PARAMETER:.2g} s, measured on 2 shared cores of an AMD EPYC "
                           f"training ConvE (no {rate_kind} run of yours to measure it on)")
                   + "; the training only, one model after another (the estimators' time is not counted)",
    }


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
