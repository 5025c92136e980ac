"""A bounded per-step training curve: the running loss from the first steps, at most ``max_points`` points.

Every point is the mean training loss over a contiguous range of steps (micro-batches), and the points' ranges
partition the steps recorded so far. A point is emitted every ``stride`` steps (``stride`` starts at 1); when the
curve holds more than ``max_points`` points, neighbouring pairs are merged (their weighted mean, the later step)
and ``stride`` doubles. So a run of any length keeps at most ``max_points`` points, the first ones show after the
first steps, and a training loop that must synchronise with a device to read its loss does so only when a point is
due (:meth:`StepCurve.due`): about ``max_points · (1 + ½ log2(steps / max_points))`` times in a whole run.

Pure Python (no torch): the service and the SDK read what it writes, ``rows()``: ``{"step", "epoch", "loss"}``
with ``epoch`` the fractional epoch (``step / steps_per_epoch``) so a step curve shares the per-epoch charts' axis.
"""

from __future__ import annotations

import math
from typing import Any

MAX_POINTS = 200


class StepCurve:
    """The running-loss curve of one training run (see the module's docstring)."""

    def __init__(self, steps_per_epoch: int, max_points: int = MAX_POINTS) -> None:
        if steps_per_epoch < 1:
            raise ValueError("steps_per_epoch must be >= 1")
        if max_points < 2:
            raise ValueError("max_points must be >= 2")
        self.steps_per_epoch = steps_per_epoch
        self.max_points = max_points
        self.stride = 1
        # (last step, loss sum, weight) per point; the weight is what the loss sum is a sum over (examples)
        self.points: list[tuple[int, float, float]] = []
        self.last_step = 0  # the last step a point (or the pending window) was closed at
        self._pending: tuple[int, float, float] | None = None  # (last step, sum, weight) not yet a point

    def due(self, step: int) -> bool:
        """Whether ``step`` (1-based, counted over the whole run) closes the current window."""
        return step - self.last_step >= self.stride

    def add(self, step: int, loss_sum: float, weight: float, force: bool = False) -> None:
        """The losses of the steps after the previous ``add`` up to ``step``: their sum ``loss_sum`` over
        ``weight`` examples. A point is emitted when due (or ``force``, at an epoch's end); otherwise the values
        wait in the pending window. A non-finite sum is recorded as it is (the point reads ``None``)."""
        if step <= (self._pending[0] if self._pending else self.last_step):
            raise ValueError(f"step {step} is not after the last one recorded")
        if weight <= 0:
            return
        if self._pending is not None:
            loss_sum += self._pending[1]
            weight += self._pending[2]
        self._pending = (step, loss_sum, weight)
        if force or self.due(step):
            self.points.append(self._pending)
            self._pending = None
            self.last_step = step
            if len(self.points) > self.max_points:
                self._halve()

    def _halve(self) -> None:
        merged = []
        for i in range(0, len(self.points) - 1, 2):
            (_, s1, w1), (step, s2, w2) = self.points[i], self.points[i + 1]
            merged.append((step, s1 + s2, w1 + w2))
        if len(self.points) % 2:
            merged.append(self.points[-1])
        self.points = merged
        self.stride *= 2

    def rows(self) -> list[dict[str, Any]]:
        """The points, and the pending window as a last point, as chart rows."""
        out = []
        for step, s, w in self.points + ([self._pending] if self._pending else []):
            mean = s / w
            out.append({"step": step, "epoch": round(step / self.steps_per_epoch, 6),
                        "loss": mean if math.isfinite(mean) else None})
        return out

    # ---- checkpoints (a resumed run continues its curve)
    def state(self) -> dict[str, Any]:
        return {"steps_per_epoch": self.steps_per_epoch, "max_points": self.max_points, "stride": self.stride,
                "points": [list(p) for p in self.points], "last_step": self.last_step}

    @classmethod
    def from_state(cls, state: dict[str, Any] | None, steps_per_epoch: int, max_points: int = MAX_POINTS
                   ) -> StepCurve:
        """The curve saved with a checkpoint, or a new one when there is none or it was recorded with another
        number of steps per epoch (another batch size: its steps are not this run's)."""
        curve = cls(steps_per_epoch, max_points)
        if not state or state.get("steps_per_epoch") != steps_per_epoch:
            return curve
        curve.stride = int(state["stride"])
        curve.points = [(int(p[0]), float(p[1]), float(p[2])) for p in state["points"]]
        curve.last_step = int(state["last_step"])
        while len(curve.points) > curve.max_points:
            curve._halve()
        return curve


def reference_rows(losses: list[tuple[float, float]], ends: list[int], steps_per_epoch: int) -> list[dict[str, Any]]:
    """The plain computation :class:`StepCurve` must agree with: ``losses[i]`` is step ``i + 1``'s (sum, weight),
    ``ends`` the last step of each point; every point is the weighted mean of its range."""
    out, start = [], 0
    for end in ends:
        s = sum(x[0] for x in losses[start:end])
        w = sum(x[1] for x in losses[start:end])
        out.append({"step": end, "epoch": round(end / steps_per_epoch, 6), "loss": s / w})
        start = end
    return out
