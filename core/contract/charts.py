"""How clients draw a training kind's curves: the chart specs a kind describes and one colour rule for every client
(the dashboard reads the colours from ``GET /kinds``; the SDK's ``explainq_client.render.series_colours`` is the
same rule, tested equal)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# The Okabe-Ito palette, colour-blind safe. In a chart, the first training series (a key starting with "train", or the bare "loss") is TRAIN_COLOUR,
# the first validation series (a key starting with "val") VALIDATION_COLOUR, every other series the next of
# OTHER_COLOURS in order.
TRAIN_COLOUR = "#0072B2"       # blue
VALIDATION_COLOUR = "#D55E00"  # vermillion
OTHER_COLOURS = ("#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")


def series_split(key: str) -> str | None:
    """``"train"``, ``"validation"`` or None for a chart series' row key (flattened: ``valid_mrr``)."""
    k = key.lower()
    if k.startswith("train") or k == "loss":
        return "train"
    if k.startswith("val"):
        return "validation"
    return None


def series_colours(keys: Sequence[str]) -> list[str]:
    """The colour of each series of one chart, in order (see TRAIN_COLOUR)."""
    out, taken, other = [], set(), 0
    for key in keys:
        split = series_split(key)
        if split is not None and split not in taken:
            taken.add(split)
            out.append(TRAIN_COLOUR if split == "train" else VALIDATION_COLOUR)
        else:
            out.append(OTHER_COLOURS[other % len(OTHER_COLOURS)])
            other += 1
    return out


def chart_description(chart: dict[str, Any]) -> dict[str, Any]:
    """A chart spec as clients get it: ``rows`` (``"history"``: one row per epoch; ``"steps"``: the per-step
    running-loss curve, x the fractional epoch) and each series as ``[row key, label, colour]``."""
    series = [list(s[:2]) for s in chart.get("series", [])]
    colours = series_colours([s[0] for s in series])
    return {**chart, "rows": chart.get("rows", "history"),
            "series": [[key, label, colour] for (key, label), colour in zip(series, colours, strict=True)]}


# The per-step running-loss chart every training kind shows first (models.curves: bounded, live from the first
# steps).
STEPS_CHART: dict[str, Any] = {"id": "steps", "title": "Running loss by step", "rows": "steps",
                               "series": [["loss", "train loss (running mean)"]]}


