"""The names of the IG quadrature rules, the default choice, and the options every attribution pipeline takes,
without torch (the API validates with them)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, TypeVar

METHODS = ("gausslegendre", "clenshaw_curtis", "riemann_right", "riemann_left", "riemann_middle",
           "riemann_trapezoid")
# rules whose nodes include both ends, so they need at least two
NEEDS_TWO = ("clenshaw_curtis", "riemann_trapezoid")


def default_method(tolerance: float | None) -> str:
    """The rule when none is asked for: Gauss-Legendre for a fixed number of steps (the most accurate per step),
    Clenshaw-Curtis with a tolerance (nearly as accurate per step on these models, and nested: a sample refined
    to n steps costs n gradient evaluations, where Gauss-Legendre's levels cost 16 + 32 + ... + n)."""
    return "gausslegendre" if tolerance is None else "clenshaw_curtis"


MAX_STEPS = 4096  # the most quadrature nodes a sample is integrated with, refinement included
ADAPTIVE_START_STEPS = 16  # where a sample's own refinement starts (models.explain.ig.integrated_gradients_adaptive)


@dataclass
class AttributionOptions:
    """What an attribution run asks of the engine, for any model family (a family's options derive from this and
    name the baselines its inputs have: ``BASELINES``)."""

    BASELINES: ClassVar[tuple[str, ...]] = ("pad", "zero")

    n_steps: int = 64
    # one of METHODS, or "occlusion"; None: "clenshaw_curtis" with a tolerance (its levels are nested, so refining
    # reuses every earlier gradient), "gausslegendre" without
    method: str | None = None
    tolerance: float | None = None
    alpha_batch_size: int | str = "auto"
    batch_size: int | str = "auto"
    precision: str = "auto"
    baseline: str = "pad"
    top_k: int = 10
    optimized: bool = True
    memory_budget: int | None = None
    max_steps: int = MAX_STEPS
    faithfulness: bool = False  # add comprehensiveness, sufficiency and curves (models.explain.faithfulness)
    faithfulness_seed: int = 0  # of the random word order the faithfulness numbers are compared with

    def __post_init__(self) -> None:
        if self.method is None:
            self.method = default_method(self.tolerance)

    def check(self) -> None:
        if self.method not in (*METHODS, "occlusion"):
            raise ValueError(f"method must be one of {', '.join((*METHODS, 'occlusion'))}")
        if not 1 <= self.n_steps <= self.max_steps:
            raise ValueError(f"n_steps must be in [1, {self.max_steps}]")
        if self.method in NEEDS_TWO and self.n_steps < 2:
            raise ValueError(f"{self.method} needs n_steps >= 2")
        if self.baseline not in self.BASELINES:
            raise ValueError(f"baseline must be one of {', '.join(self.BASELINES)}")
        if self.tolerance is not None and not self.tolerance > 0:
            raise ValueError("tolerance must be > 0")
        if self.faithfulness and self.method == "occlusion":
            raise ValueError("faithfulness compares IG's word ranking with occlusion's: use an IG method")

    @property
    def adaptive(self) -> bool:
        """Whether each sample is refined on its own until the tolerance is met. The reference loop
        (``optimized=False``) meets a tolerance by rerunning everything at twice the steps instead
        (:func:`refine_by_doubling`); occlusion has no steps."""
        return self.tolerance is not None and self.optimized and self.method != "occlusion"

    @property
    def start_steps(self) -> int:
        """The steps an adaptive run starts every sample at."""
        return min(self.n_steps, ADAPTIVE_START_STEPS)

    def pass_precision(self, resolved: str) -> str:
        """The precision of the passes, ``resolved`` from the request's (``models.common.resolve_precision``):
        occlusion and the reference loop always run in fp32."""
        return "fp32" if self.method == "occlusion" or not self.optimized else resolved


R = TypeVar("R")


def refine_by_doubling(opts: AttributionOptions, run_at: Callable[[int], R],
                       relative_deltas: Callable[[R], list[float]]) -> tuple[R, int, bool | None]:
    """The reference loop with a tolerance: the whole run (``run_at(n_steps)``) at twice the steps until the
    median relative delta meets ``opts.tolerance`` or ``opts.max_steps`` is reached. Returns the last run, its
    steps and whether the tolerance was met (None without samples)."""
    n_steps = opts.n_steps
    while True:
        run = run_at(n_steps)
        rels = relative_deltas(run)
        if not rels:
            return run, n_steps, None
        met = statistics.median(rels) <= opts.tolerance
        if met or n_steps >= opts.max_steps:
            return run, n_steps, met
        n_steps = min(opts.max_steps, n_steps * 2)
