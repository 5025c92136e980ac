"""What the attribution and TracIn pages draw, built from a job's public result (no I/O here).

Attributions: one colour scale for the page (the largest |attribution| of every sample, every view and, in a
comparison, both models), or one per sample; each word as the text has it, its value, and whether the comparison
marks it; the completeness warnings; the comparison's per-sample changes and its table. TracIn: the model's own
prediction per test triple, the in-training badge, bars from zero on one scale per test triple (the SDK's
picture), and why a test triple has no opponents when it has none.
"""

from __future__ import annotations

import math
from typing import Any

from app.ui import views

SCALES = ("global", "sample")
VIEWS = ("heatmap", "table")
COLOURBAR_TICKS = 5


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def _parts(rec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A sample record's views: the first at the top level, the others (NAML's body) under ``views``."""
    return [("title", rec)] + [(name, v) for name, v in (rec.get("views") or {}).items() if isinstance(v, dict)]


def max_abs(records: list[dict[str, Any]]) -> float:
    """The largest finite |attribution| of every view of ``records`` (0 without any)."""
    out = 0.0
    for rec in records:
        for _, part in _parts(rec):
            for v in part.get("word_attributions") or []:
                f = _finite(v)
                if f is not None:
                    out = max(out, abs(f))
    return out


def colour_bar(scale: float) -> dict[str, Any]:
    """The numeric colour bar of a scale: its ends are −scale and +scale."""
    ticks = [scale * (2 * i / (COLOURBAR_TICKS - 1) - 1) for i in range(COLOURBAR_TICKS)]
    return {"min": -scale, "max": scale, "ticks": [{"value": t, "text": views.signed(t, 3) if t else "0"}
                                                   for t in ticks]}


def cells(part: dict[str, Any], scale: float, marked: set[int] | None = None) -> list[dict[str, Any]]:
    """The words of one view: the model's word (``word``), the text's (``display``), the value, colour and sign,
    whether the comparison marks it, and whether the text has a space before it."""
    words = part.get("words") or []
    values = part.get("word_attributions") or []
    display = part.get("display_words") or words
    spans = part.get("spans") or [None] * len(words)
    marked = marked or set()
    out = []
    previous_end = None
    for i, (w, v) in enumerate(zip(words, values, strict=False)):
        span = spans[i] if i < len(spans) else None
        space = True
        if isinstance(span, list | tuple) and len(span) == 2 and previous_end is not None:
            space = span[0] > previous_end
        previous_end = span[1] if isinstance(span, list | tuple) and len(span) == 2 else None
        value = _finite(v)
        out.append({"i": i, "word": w, "display": display[i] if i < len(display) else w, "value": v,
                    "style": views.attr_style(value, scale), "sign": views.sign(value),
                    "cls": "pos" if (value or 0) > 0 else "neg" if (value or 0) < 0 else "zero",
                    "changed": i in marked, "space": space or i == 0})
    return out


def _warned(rec: dict[str, Any], threshold: float | None) -> list[dict[str, Any]]:
    """The views of a sample whose relative completeness error exceeds ``threshold`` (or is not finite)."""
    if threshold is None:
        return []
    out = []
    for name, part in _parts(rec):
        rel = part.get("relative_delta")
        if rel is None and "relative_delta" not in part:
            continue
        f = _finite(rel)
        if f is None or f > threshold:
            out.append({"view": name, "relative_delta": rel})
    return out


TABLE_CELLS = 24  # an image's cells listed in its table (the strongest by |attribution|); every one is in the CSV


def _grey(value: float | None, lo: float, hi: float) -> str:
    """The input's intensity as a grey outline colour (dark = low), for drawing the image under its heatmap."""
    if value is None or hi <= lo:
        return "rgb(128,128,128)"
    g = round(255 * (value - lo) / (hi - lo))
    return f"rgb({g},{g},{g})"


def tensor_view(rec: dict[str, Any], scale: float) -> dict[str, Any] | None:
    """An exported classifier's record drawn over its input: an image as its grid of cells (each coloured by its
    attribution on the page's scale, outlined by the input's intensity, its value in its title and in the table of
    the strongest cells), a tabular row as one signed bar per feature with the feature's value. None for text."""
    inp = rec.get("input")
    if not isinstance(inp, dict) or inp.get("kind") not in ("image", "tabular"):
        return None
    names = [str(w) for w in rec.get("words") or []]
    values = [_finite(v) for v in rec.get("word_attributions") or []]
    inputs = [_finite(v) for v in inp.get("values") or []]
    if inp["kind"] == "tabular":
        bars = []
        for i, (name, v) in enumerate(zip(names, values, strict=False)):
            width = min(100.0, abs(v) / scale * 100) if v is not None and scale else 0.0
            bars.append({"i": i, "name": name, "value": v, "input": inputs[i] if i < len(inputs) else None,
                         "width": round(width, 2), "cls": "pos" if (v or 0) > 0 else "neg" if (v or 0) < 0 else "zero"})
        return {"kind": "tabular", "bars": bars}
    grid = inp.get("grid") if isinstance(inp.get("grid"), list) and len(inp["grid"]) == 2 else None
    if grid is None or grid[0] * grid[1] != len(values):
        return None
    finite = [v for v in inputs if v is not None]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    rows = []
    for r in range(grid[0]):
        row = []
        for c in range(grid[1]):
            k = r * grid[1] + c
            v = values[k]
            row.append({"name": names[k] if k < len(names) else f"r{r}c{c}", "value": v,
                        "style": views.attr_style(v, scale),
                        "outline": _grey(inputs[k] if k < len(inputs) else None, lo, hi)})
        rows.append(row)
    strongest = sorted((k for k, v in enumerate(values) if v is not None), key=lambda k: (-abs(values[k]), k))
    table = [{"i": k, "word": names[k], "display": names[k], "value": values[k],
              "style": views.attr_style(values[k], scale), "cls": "pos" if values[k] > 0 else "neg"
              if values[k] < 0 else "zero", "changed": False} for k in strongest[:TABLE_CELLS]]
    return {"kind": "image", "rows": rows, "cols": grid[1], "patch": inp.get("patch"), "shape": inp.get("shape"),
            "table": table, "n_cells": len(values)}


def _sample_view(rec: dict[str, Any], scale: float, marked: set[int], threshold: float | None) -> dict[str, Any]:
    return {**rec, "views_": [{"name": name, "cells": cells(part, scale, marked if name == "title" else None)}
                              for name, part in _parts(rec)],
            "tensor_": tensor_view(rec, scale), "scale_": scale, "warned_": _warned(rec, threshold)}


def listed(result: dict[str, Any], name: str, inline: list[Any] | None = None) -> dict[str, Any]:
    """How much of the list ``name`` the result holds (``listed[name]``: ``total``, ``inline``, ``artifact``); a
    list the result holds whole (no ``listed`` entry) is all inline. ``more``: entries the result leaves out."""
    entry = (result.get("listed") or {}).get(name) if isinstance(result.get("listed"), dict) else None
    shown = len(inline) if inline is not None else 0
    if isinstance(entry, dict) and isinstance(entry.get("total"), int):
        shown = entry["inline"] if isinstance(entry.get("inline"), int) else shown
        return {"total": entry["total"], "inline": shown, "artifact": entry.get("artifact"),
                "more": entry["total"] > shown}
    return {"total": shown, "inline": shown, "artifact": None, "more": False}


def attribution_context(result: dict[str, Any], page: int, per_page: int, scale_mode: str = "global",
                        show_values: bool = False, view: str = "heatmap") -> dict[str, Any]:
    """The attribution page's context: the samples of ``page`` (with the comparison model's beside them), the
    scale and its colour bar, the completeness threshold and warnings, the comparison table and word statistics.
    The result holds its first samples inline (every one in ``samples.jsonl``): the pages are of those, and
    ``samples_listed`` says how many there are in all."""
    scale_mode = scale_mode if scale_mode in SCALES else "global"
    view = view if view in VIEWS else "heatmap"
    samples = [s for s in result.get("samples") or [] if isinstance(s, dict)]
    comparison = result.get("comparison") if isinstance(result.get("comparison"), dict) else None
    other_samples = [s for s in (comparison or {}).get("samples") or [] if isinstance(s, dict)]
    other_by_id = {s.get("id"): s for s in other_samples}
    per_sample = {p.get("id"): p for p in (comparison or {}).get("per_sample") or [] if isinstance(p, dict)}
    threshold = _finite(result.get("warn_relative_delta"))
    pages = max(1, -(-len(samples) // per_page))
    page = min(max(page, 1), pages)
    scale = max_abs(samples + other_samples)
    shown = []
    for rec in samples[(page - 1) * per_page: page * per_page]:
        other = other_by_id.get(rec.get("id"))
        changes = per_sample.get(rec.get("id")) or {}
        changed = [c for c in changes.get("changed") or [] if isinstance(c, dict)]
        own = scale if scale_mode == "global" else max_abs([rec] + ([other] if other else []))
        item = _sample_view(rec, own, {c.get("index_a") for c in changed}, threshold)
        if other is not None:
            item["other_"] = _sample_view(other, own, {c.get("index_b") for c in changed}, threshold)
        item["changes_"] = changed
        item["bar_"] = colour_bar(own)
        shown.append(item)
    table = []
    for c in (comparison or {}).get("changed") or []:
        s = max(abs(c.get("mean_before") or 0.0), abs(c.get("mean_after") or 0.0)) or 1.0
        table.append({**c, "before_style": views.attr_style(c.get("mean_before"), s),
                      "after_style": views.attr_style(c.get("mean_after"), s)})
    n_samples = result.get("n_samples") if isinstance(result.get("n_samples"), int) else len(samples)
    n_compared = (comparison or {}).get("n_samples")
    return {"samples": shown, "pages": pages, "page": page, "n_samples": n_samples,
            "samples_listed": listed(result, "samples", samples),
            "errors_listed": listed(result, "errors", result.get("errors") or []),
            "n_compared": n_compared if isinstance(n_compared, int) else len(other_samples),
            "scale": scale, "scale_mode": scale_mode, "page_bar": colour_bar(scale),
            "show_values": show_values, "view": view, "threshold": threshold,
            "warnings": [w for w in result.get("warnings") or [] if isinstance(w, str)],
            "word_bars": views.word_stat_bars(result.get("word_stats") or {}),
            "comparison": comparison, "changed": table}


# ------------------------------------------------------------------------------------------------- TracIn
def zero_bars(rows: list[dict[str, Any]], key: str, scale: float) -> dict[str, Any]:
    """Bars from zero on one scale: each row's bar is |value| / ``scale`` of the full width (0 for a missing
    value), so equal values draw equal bars and a 7 % spread looks like one. The SDK's renderer draws the same
    (``explainq_client.render._bar`` with the same scale); ``scale`` is returned for the page to print."""
    out = []
    for r in rows:
        v = _finite(r.get(key))
        out.append({**r, "width": min(100.0, abs(v) / scale * 100.0) if v is not None and scale else 0.0})
    return {"rows": out, "scale": scale}


def influence_scale(entry: dict[str, Any]) -> float:
    """One scale for a test triple's tables: the largest |influence| among its proponents, opponents and pairs
    (the SDK's renderer takes the same)."""
    values = [_finite(p.get("influence")) for key in ("proponents", "opponents", "pairs")
              for p in entry.get(key) or [] if isinstance(p, dict)]
    return max((abs(v) for v in values if v is not None), default=0.0)


def no_opponents_note(result: dict[str, Any], entry: dict[str, Any]) -> str | None:
    """Why a test triple's opponents table is empty and what to try, when every candidate scored positive; None
    when it has opponents (or lists pairs)."""
    if entry.get("opponents") is None or entry.get("opponents") or entry.get("n_negative"):
        return None
    n = entry.get("n_candidates")
    every = f"all {n} candidates" if isinstance(n, int) else "every candidate"
    loss = result.get("loss")
    if loss == "train":
        tried = ("The training loss (loss \"train\") scores a triple against every entity at once, so training "
                 "on the triples near this one tends to raise its score whichever way they point. To see what works "
                 "against the prediction, run the query again with loss \"score_bce\" (the gradient of this "
                 "triple's own score), or store features with POST /featurize and loss \"margin\" and ask with "
                 "estimator \"trak\" or \"tracin_projected\".")
    elif loss == "margin":
        tried = ("This query already used the margin (the output the attribution-quality evaluations measure); a "
                 "wider filter (more hops) scores more candidates, and another checkpoint or layer choice changes "
                 "which parameters' gradients are compared.")
    else:
        tried = ("Try the margin: store features with POST /featurize and loss \"margin\", then ask with estimator "
                 "\"trak\" or \"tracin_projected\"; a wider filter (more hops) also scores more candidates.")
    return f"No opponents: {every} raised the model's belief in this triple (no negative influence). {tried}"


def breakdown_table(result: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any] | None:
    """A test triple's listed scores broken down (each pair's ``breakdown``): the column names (each checkpoint by
    its name, each layer group) and one row per listed pair with its role, rank, triple, influence and parts; None
    when no listed pair has a breakdown (estimators other than exact TracIn, results of earlier versions)."""
    checkpoints = [str(c.get("name")) for c in result.get("checkpoints") or [] if isinstance(c, dict)]
    rows, groups = [], []
    for key, role in (("proponents", "proponent"), ("opponents", "opponent")):
        for rank, p in enumerate(entry.get(key) or [], 1):
            b = p.get("breakdown") if isinstance(p, dict) else None
            if not isinstance(b, dict):
                continue
            layers = b.get("layers") or {}
            groups += [g for g in layers if g not in groups]
            rows.append({"role": role, "rank": rank, "train_triple": p.get("train_triple"),
                         "influence": p.get("influence"), "checkpoints": list(b.get("checkpoints") or []),
                         "layers": layers})
    if not rows:
        return None
    return {"checkpoints": checkpoints, "groups": groups, "rows": rows}


RANKING_SHOWN = 200  # self-influence rows drawn on the page (self_influence.jsonl has the whole ranking)


def tracin_context(result: dict[str, Any]) -> dict[str, Any]:
    """Per test triple of the result (its first ``RESULTS_INLINE``; ``results_listed`` says how many in all): its
    lists with bars from zero on the test triple's one scale (a listed training triple that is the test triple
    itself marked), why it has no opponents when it has none, its prediction and in-training flag; the first ``RANKING_SHOWN`` of a self-influence ranking (``ranking_listed``: of how
    many, and where the whole ranking is)."""
    entries = [r for r in result.get("results") or [] if isinstance(r, dict)]
    out = []
    for r in entries:
        test = list(r.get("test_triple") or [])
        lists = {}
        scale = influence_scale(r)
        reverse = [test[2], test[1], test[0]] if len(test) == 3 else None
        for key in ("proponents", "opponents", "pairs"):
            rows = [{**p, "is_test_triple": p.get("is_test_triple") or list(p.get("train_triple") or []) == test,
                     "is_reverse": p.get("is_reverse") or (list(p.get("train_triple") or []) == reverse
                                                           and reverse != test)}
                    for p in r.get(key) or [] if isinstance(p, dict)]
            lists[key + "_"] = zero_bars(rows, "influence", scale)
        out.append({**r, **lists, "scale_": scale, "no_opponents_": no_opponents_note(result, r),
                    "breakdown_": breakdown_table(result, r)})
    ranking = [r for r in result.get("ranking") or [] if isinstance(r, dict)]
    ranking_listed = listed(result, "ranking", ranking)
    shown = ranking[:RANKING_SHOWN]
    top = max((abs(v) for v in (_finite(r.get("self_influence")) for r in shown) if v is not None), default=0.0)
    return {"per_test": out, "results_listed": listed(result, "results", entries),
            "ranking": zero_bars(shown, "self_influence", top), "ranking_listed": ranking_listed,
            "ranking_more": ranking_listed["total"] > len(shown)}
