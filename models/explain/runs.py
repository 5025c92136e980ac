"""One attribution run of a classifier, whatever its inputs (texts' tokens, an image's pixels, a row's features):
what each item got, how it was integrated, when a run stops refining, and the run's summary.

The classifier pipelines (:mod:`models.hf.attribution`, :mod:`models.export.attribution`) differ in how they
build a batch (tokens and embeddings, or positions of a tensor) and how a record shows it; everything here is the
same for both: :func:`integrate` (the reference loop, adaptive refinement per item, or a fixed number of steps),
:class:`ClassRun` (per item: attributions per position, F(x), F(x'), the classes, the adaptive steps),
:func:`attribute` (adaptive, doubling with a tolerance, or one run) and :func:`summary`.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from models.common import NonFiniteError
from models.explain.ig import (
    ForwardFn,
    IGResult,
    integrated_gradients,
    integrated_gradients_adaptive,
    integrated_gradients_reference,
    relative_delta,
)
from models.explain.rules import AttributionOptions, refine_by_doubling


def integrate(forward: ForwardFn, x: torch.Tensor, base: torch.Tensor, opts: AttributionOptions, n_steps: int,
              alpha_batch_size: int | None, rows: int | None, precision: str,
              endpoint_scores: tuple[torch.Tensor, torch.Tensor] | None = None) -> IGResult:
    """IG of ``forward`` over ``(N, L, D)`` inputs from their baselines: the reference loop (one item and one step
    at a time, ``opts.optimized`` off), each item refined until ``opts.tolerance``, or ``n_steps`` for all."""
    if not opts.optimized:
        results = []
        for i in range(x.shape[0]):
            row = torch.tensor([i], device=x.device)
            with torch.enable_grad():
                results.append(integrated_gradients_reference(
                    lambda e, row=row: forward(e, row), x[i], base[i], n_steps=n_steps, method=opts.method))
        return IGResult(torch.cat([r.attributions for r in results]), torch.cat([r.scores for r in results]),
                        torch.cat([r.baseline_scores for r in results]), n_steps, opts.method)
    if opts.tolerance is not None:
        auto = opts.alpha_batch_size == "auto"
        return integrated_gradients_adaptive(
            forward, x, base, tolerance=opts.tolerance, method=opts.method, start_steps=n_steps,
            max_steps=opts.max_steps, alpha_batch_size=None if auto else alpha_batch_size,
            max_rows=rows if auto else None, precision=precision, token_sums=True)
    return integrated_gradients(forward, x, base, n_steps=n_steps, method=opts.method,
                                alpha_batch_size=alpha_batch_size, precision=precision,
                                endpoint_scores=endpoint_scores)


@dataclass
class ClassRun:
    """Per item id: its attributions (fp64, one per position), F(x) and F(x') of its target class, the target and
    predicted classes' records, and (adaptive runs) its steps, gradient evaluations and convergence."""

    n_steps: int
    batch_size: int
    alpha_batch_size: int | None
    attr: dict[str, np.ndarray] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    baseline_scores: dict[str, float] = field(default_factory=dict)
    target: dict[str, dict[str, Any]] = field(default_factory=dict)
    predicted: dict[str, dict[str, Any]] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    evaluations: dict[str, int] = field(default_factory=dict)
    converged: dict[str, bool] = field(default_factory=dict)
    token_errors: dict[str, float | None] = field(default_factory=dict)

    def add(self, ids: Sequence[str], res: IGResult, target_recs: Sequence[dict[str, Any]],
            predicted_recs: Sequence[dict[str, Any]], what: str) -> None:
        """Keep a batch's results (``res.attributions`` ``(N, L, D)`` summed over D); a NaN or infinite value
        raises :class:`NonFiniteError` naming the ``what`` (texts, inputs) it is about."""
        attr = res.attributions.sum(-1).double().cpu().numpy()
        bad = [sid for j, sid in enumerate(ids) if not (np.isfinite(attr[j]).all() and math.isfinite(
            float(res.scores[j])) and math.isfinite(float(res.baseline_scores[j])))]
        if bad:
            raise NonFiniteError(f"non-finite attribution or score for {what} {bad}", bad)
        steps = getattr(res, "steps", None)
        for j, sid in enumerate(ids):
            self.attr[sid] = attr[j]
            self.scores[sid] = float(res.scores[j])
            self.baseline_scores[sid] = float(res.baseline_scores[j])
            self.target[sid] = target_recs[j]
            self.predicted[sid] = predicted_recs[j]
            if steps is not None:
                self.steps[sid] = int(steps[j])
                self.evaluations[sid] = int(res.evaluations[j])
                self.converged[sid] = bool(res.converged[j])
                e = float(res.token_errors[j])
                self.token_errors[sid] = e if math.isfinite(e) else None

    def rel(self, sid: str) -> float:
        """The item's relative completeness error (0 for an inert input: no attribution, no score change)."""
        a = self.attr[sid]
        return float(relative_delta(float(a.sum()), self.scores[sid], self.baseline_scores[sid],
                                    bool((a == 0).all())))

    def relative_deltas(self) -> list[float]:
        return [self.rel(sid) for sid in self.attr]


@dataclass
class Attributed:
    """A finished run (None without items), the steps it ended at, and whether the tolerance was met."""

    run: ClassRun | None
    n_steps: int
    tolerance_met: bool | None = None


def attribute(opts: AttributionOptions, has_items: bool, run_at: Callable[[int], ClassRun]) -> Attributed:
    """Adaptive (each item refined on its own from ``opts.start_steps``), doubling (the reference loop with a
    tolerance: the whole run at twice the steps until the median relative error meets it), or one run."""
    if not has_items:
        return Attributed(None, opts.n_steps)
    if opts.adaptive:
        run = run_at(opts.start_steps)
        return Attributed(run, opts.start_steps, all(run.converged.values()))
    if opts.tolerance is not None and opts.method != "occlusion":
        return Attributed(*refine_by_doubling(opts, run_at, ClassRun.relative_deltas))
    return Attributed(run_at(opts.n_steps), opts.n_steps)


def summary(opts: AttributionOptions, precision: str, att: Attributed, records: Sequence[dict[str, Any]],
            errors: Sequence[dict[str, Any]], started: float, prepare_seconds: float, view: str,
            delta_by_view: dict[str, Any]) -> dict[str, Any]:
    """How the attributions were computed and how well they add up (``AttributionSummary``; ``delta_by_view``:
    the records' relative errors per view, as the family's report accumulator gives them)."""
    run = att.run
    rels = run.relative_deltas() if run is not None else []
    errors_ = [e for e in (run.token_errors.values() if run is not None else ()) if e is not None]
    if opts.method == "occlusion":
        n_steps = evaluations = None
    elif opts.adaptive:
        n_steps = max(run.steps.values()) if run is not None else att.n_steps
        evaluations = sum(run.evaluations.values()) if run is not None else 0
    else:
        n_steps, evaluations = att.n_steps, att.n_steps * len(rels)
    return {
        "n_samples": len(records), "n_errors": len(errors), "method": opts.method, "n_steps": n_steps,
        "gradient_evaluations": evaluations, "precision": precision, "baseline": opts.baseline,
        "optimized": opts.optimized, "views": [view],
        "median_relative_delta": statistics.median(rels) if rels else float("nan"),
        "max_relative_delta": max(rels) if rels else float("nan"),
        "relative_delta_by_view": delta_by_view,
        "tolerance": opts.tolerance, "tolerance_met": att.tolerance_met,
        "max_token_error": max(errors_) if errors_ and opts.adaptive else None,
        "batch_size": run.batch_size if run is not None else None,
        "alpha_batch_size": run.alpha_batch_size if run is not None else None,
        "seconds": time.perf_counter() - started, "seconds_prepare": prepare_seconds,
    }
