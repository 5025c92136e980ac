"""Presentation helpers: colours, numbers and times, and the per-kind shapes the templates draw."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from core.compare import flat_params

TERMINAL = ("succeeded", "failed", "canceled")
STATUSES = ("queued", "running", "succeeded", "failed", "canceled")
# ColorBrewer-style diverging ends that stay distinct under the common colour-vision deficiencies.
POSITIVE_RGB = (230, 97, 1)   # orange
NEGATIVE_RGB = (33, 102, 172)  # blue


def attr_style(value: float | None, scale: float) -> str:
    """Background for an attribution on a diverging blue (negative) / white / orange (positive) scale."""
    if value is None or not scale:
        return ""
    t = max(-1.0, min(1.0, value / scale))
    end = POSITIVE_RGB if t >= 0 else NEGATIVE_RGB
    a = abs(t)
    rgb = tuple(round(255 + (c - 255) * a) for c in end)
    fg = "#fff" if a > 0.6 else "#111"
    return f"background:rgb{rgb};color:{fg}"


def sign(value: float | None) -> str:
    if value is None or value == 0:
        return "0"
    return "+" if value > 0 else "−"


def num(value: Any, digits: int = 4) -> str:
    """A compact number: fixed point for moderate magnitudes, scientific otherwise."""
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) < 10 ** -(digits - 1) or abs(value) >= 10**6):
        return f"{value:.{max(digits - 2, 1)}e}"
    return f"{value:.{digits}f}".rstrip("0").rstrip(".") or "0"


def signed(value: Any, digits: int = 4) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return "+" + num(value, digits)
    return num(value, digits).replace("-", "−")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def fmt_time(value: str | None) -> str:
    t = parse_time(value)
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if t else "–"


def duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "–"
    if seconds < 10:
        return f"{seconds:.1f} s"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h} h {m:02d} min"
    if m:
        return f"{m} min {s:02d} s"
    return f"{s} s"


def between(start: str | None, end: str | None) -> float | None:
    a, b = parse_time(start), parse_time(end)
    if a is None:
        return None
    return ((b or datetime.now(UTC)) - a).total_seconds()


def size(n: Any) -> str:
    if not isinstance(n, int | float):
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def percent(progress: dict[str, Any] | None) -> float | None:
    if not progress or not progress.get("total"):
        return None
    return max(0.0, min(100.0, 100.0 * float(progress.get("done") or 0) / float(progress["total"])))


def progress_text(progress: dict[str, Any] | None) -> str:
    if not progress:
        return ""
    done, total, unit = progress.get("done"), progress.get("total"), progress.get("unit") or ""
    text = f"{num(done)} / {num(total)} {unit}" if total else f"{num(done)} {unit}"
    return text.strip()


def eta(progress: dict[str, Any] | None) -> str:
    value = (progress or {}).get("eta_s")
    return f"ETA {duration(value)}" if isinstance(value, int | float) else ""


# ------------------------------------------------------------------------------------------- per kind
def word_cells(words: list[str], values: list[float], scale: float | None = None,
               marked: set[str] | None = None) -> list[dict[str, Any]]:
    """The words of one text with their attribution, colour, sign and whether the comparison changed them."""
    scale = scale if scale else max((abs(v) for v in values if v is not None), default=0.0)
    marked = marked or set()
    return [{"word": w, "value": v, "style": attr_style(v, scale), "sign": sign(v),
             "cls": "pos" if (v or 0) > 0 else "neg" if (v or 0) < 0 else "zero",
             "changed": w.lower() in marked}
            for w, v in zip(words, values, strict=False)]


def word_stat_bars(word_stats: dict[str, dict[str, Any]], n: int = 10) -> list[dict[str, Any]]:
    """Per label (``{"top", "bottom", "words"}``: its words of largest and smallest mean attribution, of ``words``
    in all), the ``n`` most positive then the ``n`` most negative, largest mean first, as bar widths (%)."""
    out = []
    for label, stats in sorted(word_stats.items()):
        top = list(stats.get("top") or [])[:n]
        bottom = [r for r in reversed(list(stats.get("bottom") or [])[:n]) if r not in top]
        chosen = top + bottom
        scale = max((abs(r["mean"]) for r in chosen if r.get("mean") is not None), default=0.0) or 1.0
        out.append({"label": label, "words": stats.get("words"), "rows": [
            {**r, "width": 50.0 * abs(r.get("mean") or 0.0) / scale,
             "cls": "pos" if (r.get("mean") or 0.0) > 0 else "neg"} for r in chosen]})
    return out


def influence_rows(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    scale = max((abs(r.get(key) or 0.0) for r in rows), default=0.0) or 1.0
    return [{**r, "width": 100.0 * abs(r.get(key) or 0.0) / scale} for r in rows]


def flat_row(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A per-epoch row for a chart, nested values flattened with "_" (``{"valid": {"mrr": x}}`` is
    ``valid_mrr``)."""
    out: dict[str, Any] = {}
    for key, value in (row or {}).items():
        if isinstance(value, dict):
            out.update(flat_row(value, f"{prefix}{key}_"))
        elif not isinstance(value, list):
            out[prefix + key] = value
    return out


def ablation_view(result: dict[str, Any]) -> dict[str, Any]:
    """Representations × layer sets with test accuracy mean ± std, the all → visual drop, and bar widths."""
    results = result.get("results") or {}
    sets = list(results)
    reps: list[str] = []
    for cells in results.values():
        reps += [r for r in cells if r not in reps]
    rows = []
    for rep in reps:
        cells = []
        for ls in sets:
            acc = ((results.get(ls) or {}).get(rep) or {}).get("test_acc") or {}
            mean, std = acc.get("mean"), acc.get("std")
            cells.append({"set": ls, "mean": mean, "std": std,
                          "width": 100.0 * mean if isinstance(mean, int | float) else 0.0,
                          "err": 100.0 * std if isinstance(std, int | float) else 0.0})
        rows.append({"rep": rep, "cells": cells, "drop": (result.get("drop") or {}).get(rep)})
    classes = result.get("num_classes")
    return {"sets": sets, "rows": rows, "chance": 1.0 / classes if classes else None}


# ------------------------------------------------------------------------------------------- runs overlay
# One colour per run (Okabe-Ito, colour-blind safe); within a run, a validation series is dashed.
RUN_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
MAX_RUNS = 8


def overlay(runs: list[dict[str, Any]], charts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each of the kind's charts with every run's curves on one x axis (the union of the runs' epochs, or of their
    fractional epochs for the step curve): ``{"id", "title", "x": [...], "series": [{"label", "colour", "dash",
    "run", "key", "values": [... None where the run has no point]}]}``. ``runs``: ``{"id", "rows", "steps"}`` with
    rows flattened (:func:`flat_row`)."""
    out = []
    for chart in charts:
        source = "steps" if chart.get("rows") == "steps" else "rows"
        xs = sorted({r["epoch"] for run in runs for r in run[source]
                     if isinstance(r.get("epoch"), int | float) and not isinstance(r.get("epoch"), bool)})
        index = {x: i for i, x in enumerate(xs)}
        series = []
        for n, run in enumerate(runs):
            for s in chart.get("series", []):
                key, label = s[0], s[1]
                values: list[float | None] = [None] * len(xs)
                for r in run[source]:
                    v, x = r.get(key), r.get("epoch")
                    if x in index and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                        values[index[x]] = v
                if any(v is not None for v in values):
                    series.append({"label": f"{run['id'][:8]} {label}", "colour": RUN_COLOURS[n % len(RUN_COLOURS)],
                                   "dash": key.lower().startswith("val"), "run": run["id"], "key": key,
                                   "values": values})
        out.append({"id": chart.get("id"), "title": chart.get("title"), "x": xs, "series": series})
    return out


def params_table(requests: list[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """The runs' hyper-parameters side by side: ``{"name", "cells", "differs"}`` per request field, the fields
    whose values differ between the runs first (a field a run's request lacks counts as differing)."""
    flat = [flat_params(r) if isinstance(r, dict) else {} for r in requests]
    names = list(dict.fromkeys(k for f in flat for k in f))
    missing = object()
    rows = []
    for name in names:
        values = [f.get(name, missing) for f in flat]
        differs = any(v != values[0] for v in values[1:])
        rows.append({"name": name, "cells": [None if v is missing else v for v in values], "differs": differs})
    return sorted(rows, key=lambda r: not r["differs"])  # stable: the request's order within each group


# ------------------------------------------------------------------------------------ classifier influence
def preview_view(preview: Any) -> dict[str, Any] | None:
    """An image example's preview (rows of values) as grey cells, black to white over the image's own range."""
    if not isinstance(preview, list) or not preview or not all(isinstance(r, list) and r for r in preview):
        return None
    values = [v for r in preview for v in r if isinstance(v, int | float) and math.isfinite(v)]
    lo, hi = (min(values), max(values)) if values else (0.0, 0.0)

    def grey(v: Any) -> str:
        if not isinstance(v, int | float) or not math.isfinite(v) or hi <= lo:
            return "rgb(128,128,128)"
        g = round(255 * (v - lo) / (hi - lo))
        return f"rgb({g},{g},{g})"

    return {"cols": len(preview[0]), "cells": [grey(v) for r in preview for v in r]}


def classifier_influence_view(result: dict[str, Any]) -> dict[str, Any]:
    """Per test example its previews and its proponents and opponents with bars drawn from zero on one scale per
    test example (the largest magnitude it lists); the self-influence ranking on its own scale."""

    def listed(items: list[dict[str, Any]], scale: float) -> list[dict[str, Any]]:
        return [{**e, "width": round(100.0 * abs(e.get("score") or 0.0) / scale, 1) if scale else 0.0,
                 "thumb": preview_view(e.get("preview"))} for e in items]

    tests = []
    for t in result.get("tests") or []:
        scores = [abs(e.get("score") or 0.0) for e in [*(t.get("proponents") or []), *(t.get("opponents") or [])]]
        scale = max(scores, default=0.0)
        tests.append({**t, "thumb": preview_view(t.get("preview")), "scale": scale,
                      "proponents_": listed(t.get("proponents") or [], scale),
                      "opponents_": listed(t.get("opponents") or [], scale)})
    ranking = result.get("self_influence") or []
    scale = max((abs(e.get("score") or 0.0) for e in ranking), default=0.0)
    return {"tests": tests, "ranking": listed(ranking, scale), "ranking_scale": scale,
            "images": any(t["thumb"] for t in tests) or any(e["thumb"] for e in listed(ranking, scale)),
            "texts": any(t.get("text") for t in tests) or any(e.get("text") for e in ranking)}
