"""The names of the IG quadrature rules and the default choice, without torch (the API validates with them)."""

from __future__ import annotations

METHODS = ("gausslegendre", "clenshaw_curtis", "riemann_right", "riemann_left", "riemann_middle",
           "riemann_trapezoid")
# rules whose nodes include both ends, so they need at least two
NEEDS_TWO = ("clenshaw_curtis", "riemann_trapezoid")


def default_method(tolerance: float | None) -> str:
    """The rule when none is asked for: Gauss-Legendre for a fixed number of steps (the most accurate per step),
    Clenshaw-Curtis with a tolerance (nearly as accurate per step on these models, and nested: a sample refined
    to n steps costs n gradient evaluations, where Gauss-Legendre's levels cost 16 + 32 + ... + n)."""
    return "gausslegendre" if tolerance is None else "clenshaw_curtis"
