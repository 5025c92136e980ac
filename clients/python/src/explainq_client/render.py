"""HTML for Jupyter: attribution heatmaps, training curves, TracIn tables, ablation tables.

Self-contained HTML and inline SVG (no JavaScript, nothing fetched). Every piece of text from a result is
escaped with :func:`html.escape`. Attributions use one diverging, colour-blind-safe scale,
:func:`diverging_color`: blue for negative, white for zero, orange for positive.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

__all__ = [
    "NEGATIVE_RGB", "NEUTRAL_RGB", "OTHER_COLOURS", "POSITIVE_RGB", "TRAIN_COLOUR", "VALIDATION_COLOUR",
    "ablation_html", "ablation_text", "attribution_html", "attribution_text", "curves_html", "diverging_color",
    "evaluation_html", "evaluation_text", "job_html", "json_html", "listed_total", "series_colours", "steps_chart",
    "tracin_html", "tracin_text", "training_html", "training_summary", "training_text",
]

# The scale's three anchors, the same as the dashboard's (ColorBrewer ends, distinct under the common colour-vision
# deficiencies). Values between are interpolated linearly in sRGB.
NEGATIVE_RGB = (33, 102, 172)   # #2166ac
NEUTRAL_RGB = (255, 255, 255)   # white
POSITIVE_RGB = (230, 97, 1)     # #e66101
# Curve colours: the server's definition (core/kinds/base.py, given to the dashboard by GET /kinds), the same
# rule here and tested equal. The Okabe-Ito palette (colour-blind safe): in a chart, the first training series (a
# name starting with "train", or the bare "loss") is TRAIN_COLOUR, the first validation series (a name starting
# with "val") VALIDATION_COLOUR, every other series the next of OTHER_COLOURS.
TRAIN_COLOUR = "#0072B2"       # blue
VALIDATION_COLOUR = "#D55E00"  # vermillion
OTHER_COLOURS = ("#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
# One colour per bar of a chart whose series are not train/validation (estimators of an evaluation).
ESTIMATOR_COLOURS = (TRAIN_COLOUR, VALIDATION_COLOUR, *OTHER_COLOURS)
MAX_SAMPLES_SHOWN = 50
MAX_ROWS_SHOWN = 25


def series_split(name: str) -> str | None:
    """``"train"``, ``"validation"`` or None for a curve's name."""
    k = name.lower()
    if k.startswith("train") or k == "loss":
        return "train"
    if k.startswith("val"):
        return "validation"
    return None


def series_colours(names: Sequence[str]) -> list[str]:
    """The colour of each curve of one chart, in order (see TRAIN_COLOUR)."""
    out: list[str] = []
    taken: set[str] = set()
    other = 0
    for name in names:
        split = series_split(name)
        if split is not None and split not in taken:
            taken.add(split)
            out.append(TRAIN_COLOUR if split == "train" else VALIDATION_COLOUR)
        else:
            out.append(OTHER_COLOURS[other % len(OTHER_COLOURS)])
            other += 1
    return out


def diverging_color(value: float, scale: float) -> str:
    """The ``#rrggbb`` colour of ``value`` on the diverging scale whose ends are ``-scale`` and ``+scale``.

    0 is neutral, ``-scale`` (or below) full blue, ``+scale`` (or above) full orange. A zero or non-finite
    ``scale`` gives the neutral colour; a non-finite value is clamped by its sign."""
    if not scale or not math.isfinite(scale) or math.isnan(value):
        return _hex(NEUTRAL_RGB)
    t = max(-1.0, min(1.0, value / abs(scale)))
    end = POSITIVE_RGB if t > 0 else NEGATIVE_RGB
    return _hex(round(n + (e - n) * abs(t)) for n, e in zip(NEUTRAL_RGB, end, strict=True))


def _hex(rgb: Iterable[int]) -> str:
    return "#" + "".join(f"{c:02x}" for c in rgb)


def _text_on(value: float, scale: float) -> str:
    strong = bool(scale) and math.isfinite(scale) and abs(value) / abs(scale) > 0.6
    return "#ffffff" if strong else "#1a1a1a"


def _num(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return escape(str(value)) if value is not None else "–"
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}g}"


def _signed(value: float) -> str:
    return f"{value:+.4g}"


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], caption: str = "") -> str:
    """A table from already-escaped cells (headers are escaped here)."""
    head = "".join(f"<th style='text-align:left;padding:2px 8px'>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td style='padding:2px 8px'>{c}</td>" for c in row) + "</tr>"
                   for row in rows)
    cap = f"<caption style='text-align:left;font-weight:600'>{escape(caption)}</caption>" if caption else ""
    return f"<table style='border-collapse:collapse;font-size:13px'>{cap}<tr>{head}</tr>{body}</table>"


def _bar(value: float, scale: float, width_px: int = 120) -> str:
    """A horizontal bar for ``value`` in ``[-scale, scale]``, coloured on the diverging scale, with the value."""
    frac = min(abs(value) / scale, 1.0) if scale else 0.0
    colour = diverging_color(value, scale)
    return (f"<span style='display:inline-block;width:{width_px}px;background:#eee;vertical-align:middle'>"
            f"<span style='display:block;height:10px;width:{frac * 100:.1f}%;background:{colour}'></span></span>"
            f" <code>{_signed(value)}</code>")


def _lookup(result: Mapping[str, Any], name: str) -> Any:
    """``result[name]``, a dotted name reaching into nested objects (``comparison.samples``)."""
    value: Any = result
    for part in name.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def listed_total(result: Mapping[str, Any], name: str) -> int:
    """How many entries the list ``name`` has in all: ``listed[name]["total"]`` when the result holds only its first
    ones inline, else the length of the list it holds whole."""
    entry = (result.get("listed") or {}).get(name)
    if isinstance(entry, Mapping) and isinstance(entry.get("total"), int):
        return int(entry["total"])
    inline = _lookup(result, name)
    return len(inline) if isinstance(inline, Sequence) and not isinstance(inline, str) else 0


def _artifact(result: Mapping[str, Any], name: str) -> str | None:
    entry = (result.get("listed") or {}).get(name)
    return entry.get("artifact") if isinstance(entry, Mapping) else None


def _where(result: Mapping[str, Any], name: str | None, html: bool) -> str:
    """Where the entries left out are: the listed list's artifact, read with ``job.entries(name)``; else the
    returned dict."""
    artifact = _artifact(result, name) if name else None
    if artifact is None:
        return "the returned dict has all of them"
    if html:
        return (f"all of them are in <code>{escape(artifact)}</code>: "
                f"<code>job.entries({escape(repr(name))})</code>")
    return f"all of them are in {artifact}: explainq-client entries <job id> {name}"


def _more(shown: int, total: int, what: str, result: Mapping[str, Any] | None = None,
          name: str | None = None) -> str:
    """"showing N of M": of the ``total`` entries (``listed`` totals, for a list the result holds in part), the
    ``shown`` ones drawn, and where the others are."""
    if total <= shown:
        return ""
    return f"<p><em>showing {shown} of {total} {escape(what)}; {_where(result or {}, name, True)}</em></p>"


# ------------------------------------------------------------------------------------------------ attributions
def words_html(words: Sequence[str], attributions: Sequence[float], scale: float | None = None,
               values: bool = False) -> str:
    """Words as spans coloured by attribution on ``scale`` (default: their largest magnitude), the signed value
    on hover, and with ``values`` printed under each word."""
    if scale is None:
        scale = max((abs(a) for a in attributions if math.isfinite(a)), default=0.0)
    spans = []
    for word, value in zip(words, attributions, strict=True):
        under = (f"<br><small style='font-size:10px'>{escape(_signed(value))}</small>" if values else "")
        spans.append(
            f"<span title='{escape(_signed(value))}' data-attribution='{value!r}' style='background:"
            f"{diverging_color(value, scale)};color:{_text_on(value, scale)};padding:1px 3px;margin:1px;"
            f"border-radius:3px;display:inline-block;text-align:center;vertical-align:top'>{escape(word)}"
            f"{under}</span>")
    return "<span style='line-height:1.9'>" + " ".join(spans) + "</span>"


def tensor_html(record: Mapping[str, Any], scale: float) -> str | None:
    """An exported classifier's record drawn over its input: an image as its grid of cells coloured by attribution
    (each cell's value on hover and in ``data-attribution``), a tabular row as one signed bar per feature with its
    value; None for a text record."""
    inp = record.get("input")
    if not isinstance(inp, Mapping):
        return None
    names = [str(w) for w in record.get("words") or []]
    values = [_float(a) for a in record.get("word_attributions") or []]
    if inp.get("kind") == "tabular":
        given = [_float(v) for v in inp.get("values") or []]
        rows = "".join(f"<tr><td>{escape(n)}</td><td style='text-align:right'>{_num(given[i] if i < len(given) else None)}"
                       f"</td><td>{_bar(v, scale)}</td></tr>" for i, (n, v) in enumerate(zip(names, values,
                                                                                          strict=False)))
        return ("<table style='font-size:12px'><tr><th>feature</th><th>value</th><th>attribution</th></tr>"
                f"{rows}</table>")
    grid = inp.get("grid")
    if inp.get("kind") != "image" or not isinstance(grid, list) or len(grid) != 2 or grid[0] * grid[1] != len(values):
        return None
    px = max(3, min(14, 224 // max(grid)))
    cells = []
    for r in range(grid[0]):
        row = "".join(
            f"<td title='{escape(names[r * grid[1] + c])}: {escape(_signed(v))}' data-attribution='{v!r}' "
            f"style='width:{px}px;height:{px}px;padding:0;background:{diverging_color(v, scale)}'></td>"
            for c, v in enumerate(values[r * grid[1]:(r + 1) * grid[1]]))
        cells.append(f"<tr>{row}</tr>")
    patch = inp.get("patch")
    note = f"{len(values)} cells" + (f" of {patch}x{patch} pixels" if isinstance(patch, int) and patch > 1 else "")
    return (f"<table style='border-collapse:collapse;border-spacing:0'>{''.join(cells)}</table>"
            f"<small>{note}, summed over channels (hover a cell for its value)</small>")


def _legend(scale: float | None = None) -> str:
    stops = ", ".join(diverging_color(v, 1.0) for v in (-1, -0.5, 0, 0.5, 1))
    if scale is None:
        return ("<div style='font-size:12px;margin:4px 0'>negative "
                f"<span style='display:inline-block;width:120px;height:10px;background:linear-gradient(to right, "
                f"{stops})'></span> positive (hover a word for its attribution)</div>")
    return (f"<div style='font-size:12px;margin:4px 0'>{escape(_signed(-scale))} "
            f"<span style='display:inline-block;width:120px;height:10px;background:linear-gradient(to right, "
            f"{stops})'></span> {escape(_signed(scale))} (one scale for every sample; the value of each word is "
            "under it)</div>")


def _max_abs(records: Iterable[Mapping[str, Any]]) -> float:
    """The largest finite |attribution| of every view of ``records``."""
    out = 0.0
    for s in records:
        for v in [s, *((s.get("views") or {}).values())]:
            if isinstance(v, Mapping):
                out = max([out, *(abs(a) for a in v.get("word_attributions") or []
                                  if isinstance(a, int | float) and math.isfinite(a))])
    return out


def _word_stat_rows(stats: Mapping[str, Any], n: int = 10) -> list[Mapping[str, Any]]:
    """A label's word statistics (``{"top", "bottom", "words"}``): its ``n`` highest mean attributions, then its
    ``n`` lowest, highest first."""
    top = [r for r in list(stats.get("top") or [])[:n] if isinstance(r, Mapping)]
    bottom = [r for r in reversed(list(stats.get("bottom") or [])[:n]) if isinstance(r, Mapping) and r not in top]
    return top + bottom


def _float(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def attribution_html(result: Mapping[str, Any]) -> str:
    """Each sample's candidate (and body, when attributed) as coloured words, its score, baseline score and
    completeness delta; the comparison's changed words; per-label word statistics. Of a run with more samples
    than the result holds, the first ones, and how many there are in all (``listed``)."""
    samples = list(result.get("samples") or [])
    scale = _max_abs(samples)
    parts = [f"<div><b>attributions</b> of model <code>{escape(str(result.get('model', '')))}</code>",
             _legend(scale)]
    warnings = [w for w in result.get("warnings") or [] if isinstance(w, str)]
    if warnings:
        parts.append("<ul style='color:#8a4b00'>" + "".join(f"<li>{escape(w)}</li>" for w in warnings) + "</ul>")
    rows = []
    for s in samples[:MAX_SAMPLES_SHOWN]:
        views = [("title", s), *((name, v) for name, v in (s.get("views") or {}).items() if isinstance(v, Mapping))]
        cells = tensor_html(s, scale) or "<br>".join(
            (f"<small>{escape(name)}</small> " if len(views) > 1 else "")
            + words_html(v.get("display_words") or v.get("words") or [],
                         [_float(a) for a in v.get("word_attributions") or []], scale, values=True)
            for name, v in views)
        rows.append([escape(str(s.get("id", ""))), escape(str(s.get("label") or "")), cells,
                     _num(s.get("score")), _num(s.get("baseline_score")), _num(s.get("delta"), 2)])
    parts.append(_table(["id", "label", "candidate", "score", "baseline score", "completeness delta"], rows))
    parts.append(_more(len(rows), listed_total(result, "samples"), "samples", result, "samples"))
    errors = list(result.get("errors") or [])
    if errors:
        parts.append(_table(["sample", "error"], ([escape(str(e.get("id"))), escape(str(e.get("error")))]
                                                  for e in errors), caption="samples not attributed"))
        parts.append(_more(len(errors), listed_total(result, "errors"), "samples not attributed", result, "errors"))
    comparison = result.get("comparison")
    if isinstance(comparison, Mapping):
        changed = list(comparison.get("changed") or [])
        scale = max((abs(_float(c.get("change"))) for c in changed), default=0.0)
        parts.append(_table(
            ["word", "mean before", "mean after", "change"],
            ([escape(str(c.get("word"))), _num(c.get("mean_before")), _num(c.get("mean_after")),
              _bar(_float(c.get("change")), scale)] for c in changed[:MAX_ROWS_SHOWN]),
            caption=f"words that changed vs {comparison.get('model')} (|change| > {comparison.get('threshold')})"))
        total = comparison.get("changed_total") if isinstance(comparison.get("changed_total"), int) else len(changed)
        if total > min(len(changed), MAX_ROWS_SHOWN):
            where = ("all of them are in <code>comparison.json</code>" if total > len(changed)
                     else "the returned dict has all of them")
            parts.append(f"<p><em>showing {min(len(changed), MAX_ROWS_SHOWN)} of {total} changed words; "
                         f"{where}</em></p>")
    for label, stats in sorted((result.get("word_stats") or {}).items()):
        rows_ = _word_stat_rows(stats) if isinstance(stats, Mapping) else []
        scale = max((abs(_float(r.get("mean"))) for r in rows_), default=0.0)
        words = stats.get("words") if isinstance(stats, Mapping) else None
        parts.append(_table(["word", "mean attribution", "count"],
                            ([escape(str(r.get("word"))), _bar(_float(r.get("mean")), scale),
                              _num(r.get("count"))] for r in rows_),
                            caption=f"highest and lowest words for label {label}"
                            + (f" (of {words}; all in word_stats.json)" if isinstance(words, int) else "")))
    return "".join(parts) + "</div>"


# ------------------------------------------------------------------------------------------------ curves
_SKIP = {"epoch", "lr", "epoch_time_s", "batch", "step"}


def _flat(row: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat(value, name + "."))
        elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
                and key not in _SKIP:
            out[name] = float(value)
    return out


def _chart(title: str, series: dict[str, list[tuple[float, float]]], w: int = 380, h: int = 220,
           dots: bool = True, xlabel: str = "epoch") -> str:
    points = [p for pts in series.values() for p in pts]
    if not points:
        return ""
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + abs(y0) * 0.1 + 1e-9)
    left, right, top, bottom = 48, 10, 22, 30

    def xy(p: tuple[float, float]) -> str:
        x = left + (p[0] - x0) / (x1 - x0) * (w - left - right)
        y = top + (1 - (p[1] - y0) / (y1 - y0)) * (h - top - bottom)
        return f"{x:.1f},{y:.1f}"

    lines, legend = [], []
    ordered = sorted(series.items())
    for (name, pts), colour in zip(ordered, series_colours([n for n, _ in ordered]), strict=True):
        lines.append(f"<polyline fill='none' stroke='{colour}' stroke-width='2' points='{' '.join(map(xy, pts))}'>"
                     f"<title>{escape(name)}</title></polyline>")
        lines += [f"<circle cx='{xy(p).split(',')[0]}' cy='{xy(p).split(',')[1]}' r='2.5' fill='{colour}'>"
                  f"<title>{escape(name)} {escape(xlabel)} {_num(p[0])}: {_num(p[1])}</title></circle>"
                  for p in pts if dots]
        legend.append(f"<span style='color:{colour}'>&#9632;</span> {escape(name)}")
    axes = (f"<line x1='{left}' y1='{h - bottom}' x2='{w - right}' y2='{h - bottom}' stroke='#888'/>"
            f"<line x1='{left}' y1='{top}' x2='{left}' y2='{h - bottom}' stroke='#888'/>"
            f"<text x='{left - 4}' y='{top + 4}' font-size='10' text-anchor='end'>{_num(y1, 3)}</text>"
            f"<text x='{left - 4}' y='{h - bottom}' font-size='10' text-anchor='end'>{_num(y0, 3)}</text>"
            f"<text x='{left}' y='{h - bottom + 14}' font-size='10'>{_num(x0)}</text>"
            f"<text x='{w - right}' y='{h - bottom + 14}' font-size='10' text-anchor='end'>{_num(x1)}</text>"
            f"<text x='{(w + left) / 2}' y='{h - 4}' font-size='10' text-anchor='middle'>{escape(xlabel)}</text>"
            f"<text x='{left}' y='14' font-size='12' font-weight='600'>{escape(title)}</text>")
    return (f"<div style='display:inline-block;margin:4px'><svg xmlns='http://www.w3.org/2000/svg' width='{w}' "
            f"height='{h}' role='img' aria-label='{escape(title)}'>{axes}{''.join(lines)}</svg>"
            f"<div style='font-size:12px'>{' '.join(legend)}</div></div>")


def steps_chart(steps: Sequence[Mapping[str, Any]], title: str = "training") -> str:
    """The per-step running training loss (``steps``: ``{"step", "epoch", "loss"}``, x the fractional epoch)."""
    pts = [(float(r["epoch"]), float(r["loss"])) for r in steps
           if isinstance(r, Mapping) and isinstance(r.get("epoch"), int | float)
           and isinstance(r.get("loss"), int | float) and math.isfinite(r["loss"])]
    return _chart(f"{title}: running loss by step", {"train loss (running mean)": pts}, dots=False) if pts else ""


def curves_html(history: Sequence[Mapping[str, Any]], title: str = "training",
                steps: Sequence[Mapping[str, Any]] = ()) -> str:
    """Per-epoch curves from a training ``history``: every loss in one chart, every other metric (accuracy,
    MRR, Hits@k...) in another. Nested dicts (``valid: {mrr}``) become ``valid.mrr``. With ``steps``, the
    per-step running loss first (it shows from a run's first steps)."""
    losses: dict[str, list[tuple[float, float]]] = {}
    others: dict[str, list[tuple[float, float]]] = {}
    for i, row in enumerate(history):
        x = row.get("epoch", i + 1)
        x = float(x) if isinstance(x, int | float) else float(i + 1)
        for name, value in _flat(row).items():
            (losses if "loss" in name else others).setdefault(name, []).append((x, value))
    charts = steps_chart(steps, title) + _chart(f"{title}: loss", losses) + _chart(f"{title}: metrics", others)
    return f"<div>{charts or '<em>no steps recorded yet</em>'}</div>"


SUMMARY_SKIPPED = ("history", "steps", "warnings", "artifacts")  # drawn as the curves, or listed elsewhere


def training_summary(result: Mapping[str, Any]) -> dict[str, Any]:
    """What every training result's table shows whatever its kind: its top-level values that print in a cell
    (numbers, strings, booleans), and the numbers in its objects (``metrics: {test: {mrr}}`` is
    ``metrics.test.mrr``); the per-epoch ``history`` and the ``steps`` are drawn as curves instead."""
    out: dict[str, Any] = {}
    for key, value in result.items():
        if key in SUMMARY_SKIPPED or value is None:
            continue
        if isinstance(value, str | int | float | bool):
            out[key] = value
        elif isinstance(value, Mapping):
            out.update(_flat(value, key + "."))
    return out


def _title(result: Mapping[str, Any]) -> str:
    for key in ("model_name", "model"):
        if isinstance(result.get(key), str):
            return str(result[key])
    return ""


def training_html(result: Mapping[str, Any]) -> str:
    """Curves, then the result's values (:func:`training_summary`): the same for every training kind."""
    table = _table(["field", "value"], ([escape(k), _num(v)] for k, v in training_summary(result).items()),
                   caption="result")
    warnings = [w for w in result.get("warnings") or [] if isinstance(w, str)]
    warned = ("<ul style='color:#8a4b00'>" + "".join(f"<li>{escape(w)}</li>" for w in warnings) + "</ul>"
              if warnings else "")
    return curves_html(result.get("history") or [], _title(result) or "training", result.get("steps") or []) + \
        table + warned


def json_html(result: Mapping[str, Any], validated: bool = True) -> str:
    """A result no renderer draws, as indented JSON; one that did not validate with a note saying why."""
    note = ("<p><em>This result was written by an earlier version of the server and does not match its kind's "
            "result schema, so it is shown as JSON rather than drawn.</em></p>" if not validated else "")
    body = escape(json.dumps(dict(result), indent=2, ensure_ascii=False))
    return f"<div>{note}<pre style='font-size:12px;max-height:32em;overflow:auto'>{body}</pre></div>"


# ------------------------------------------------------------------------------------------------ tracin
def _triple(t: Any) -> str:
    return escape(" · ".join(map(str, t))) if isinstance(t, Sequence) and not isinstance(t, str) else escape(str(t))


def _tracin_head(result: Mapping[str, Any]) -> str:
    """Mode, estimator (approximate or exact), what was scored, and how the run was split."""
    parts = [f"mode {result.get('mode', '')}"]
    if result.get("estimator"):
        parts.append(f"estimator {result['estimator']}" + (" (approximate)" if result.get("approximate") else ""))
    n_test, n_cand = result.get("n_test"), result.get("n_candidates")
    if result.get("mode") != "self" and isinstance(n_test, int):
        parts.append(f"{n_test} test triple{'s' if n_test != 1 else ''}")
    if isinstance(n_cand, int):
        parts.append(f"{n_cand} candidate training triples")
    shards = result.get("shards")
    if isinstance(shards, Mapping):
        parts.append(f"{shards.get('total')} shards")
    return ", ".join(parts)


def _tracin_caveats(result: Mapping[str, Any]) -> list[str]:
    """The result's warnings and notes (what it leaves out, and where), and what failed shards left unscored."""
    lines = [str(w) for w in result.get("warnings") or []] + [str(n) for n in result.get("notes") or []]
    failed = result.get("failed")
    if isinstance(failed, Mapping) and failed.get("shards"):
        lines.append(f"incomplete: shards {', '.join(map(str, failed['shards']))} failed, leaving "
                     f"{failed.get('candidates')} candidates unscored")
    return lines


def no_opponents(result: Mapping[str, Any], entry: Mapping[str, Any]) -> str | None:
    """What a test triple without opponents means (every candidate scored positive) and what to try; None when it
    has opponents or lists pairs (the job page says the same)."""
    if entry.get("opponents") is None or entry.get("opponents") or entry.get("n_negative"):
        return None
    loss = result.get("loss")
    hint = ("run it again with loss='score_bce', or ask stored features of loss 'margin' (estimator 'trak' or "
            "'tracin_projected')" if loss == "train" else
            "widen the filter (more hops): this query already used the margin" if loss == "margin" else
            "ask stored features of loss 'margin' (estimator 'trak' or 'tracin_projected')")
    return f"no opponents: every candidate raised the model's belief in this triple; to see what works against it, {hint}"


ITSELF, REVERSED = " [the test triple itself]", " [the test triple reversed]"


def _flag(entry: Mapping[str, Any], pair: Mapping[str, Any]) -> str:
    """" [the test triple itself]" / " [the test triple reversed]" for a listed training triple that is one."""
    test = list(entry.get("test_triple") or [])
    triple = list(pair.get("train_triple") or [])
    if pair.get("is_test_triple") or (triple and triple == test):
        return ITSELF
    if pair.get("is_reverse") or (len(test) == 3 and triple == test[::-1] and triple != test):
        return REVERSED
    return ""


def breakdown_rows(result: Mapping[str, Any], entry: Mapping[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """A test triple's listed scores broken down (each pair's ``breakdown``; the job page's table): headers
    (listed, training triple, influence, each checkpoint, each layer group) and one row per pair that has one."""
    checkpoints = [f"checkpoint {c.get('name')}" for c in result.get("checkpoints") or [] if isinstance(c, Mapping)]
    groups: list[str] = []
    pairs = []
    for key, role in (("proponents", "proponent"), ("opponents", "opponent")):
        for rank, p in enumerate(entry.get(key) or [], 1):
            b = p.get("breakdown") if isinstance(p, Mapping) else None
            if isinstance(b, Mapping):
                groups += [g for g in b.get("layers") or {} if g not in groups]
                pairs.append((f"{role} {rank}", p, b))
    rows = [[label, _text_triple(p.get("train_triple")), _influence(p.get("influence")),
             *(_influence(v) for v in b.get("checkpoints") or []),
             *(_influence((b.get("layers") or {}).get(g)) for g in groups)] for label, p, b in pairs]
    return ["listed", "training triple", "influence", *checkpoints, *groups], rows


def _influence(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _ibar(value: Any, scale: float) -> str:
    v = _influence(value)
    return _bar(v, scale) if v is not None else "–"


def tracin_html(result: Mapping[str, Any]) -> str:
    """Per test triple: proponents and opponents with influence bars (the first ``MAX_SAMPLES_SHOWN`` test
    triples; how many there are in all, ``listed``), the strongest pairs over every test triple; or the
    self-influence ranking."""
    parts = [f"<div><b>TracIn</b> on <code>{escape(str(result.get('model', '')))}</code>, "
             f"{escape(_tracin_head(result))}"]
    if result.get("filter"):
        parts.append(f", filter <code>{escape(str(result['filter']))}</code>")
    caveats = _tracin_caveats(result)
    if caveats:
        parts.append("<ul style='color:#8a4b00'>" + "".join(f"<li>{escape(c)}</li>" for c in caveats) + "</ul>")
    entries = [e for e in result.get("results") or [] if isinstance(e, Mapping)]
    for entry in entries[:MAX_SAMPLES_SHOWN]:
        pred = entry.get("prediction") if isinstance(entry.get("prediction"), Mapping) else None
        context = (f"model score {_num(pred.get('score'))}, filtered rank {_num(pred.get('rank'))} of "
                   f"{_num(pred.get('n_entities'))}; " if pred else "")
        parts.append(f"<h4 style='margin:8px 0 2px'>{_triple(entry.get('test_triple'))} "
                     + ("<small style='color:#6b4e16'>[in the training set]</small> " if entry.get("in_train")
                        else "")
                     + f"<small>({escape(context)}self-influence {_num(entry.get('self_influence'))}, "
                     f"{_num(entry.get('n_candidates'))} candidates)</small></h4>")
        groups = [(k, list(entry.get(k) or [])) for k in ("proponents", "opponents", "pairs")
                  if entry.get(k) is not None]
        scale = max((abs(_influence(r.get("influence")) or 0.0) for _, rows in groups for r in rows), default=0.0)
        for name, rows in groups:
            parts.append(_table(["training triple", "influence", "train self-influence"],
                                ([_triple(r.get("train_triple")) + escape(_flag(entry, r)),
                                  _ibar(r.get("influence"), scale), _num(r.get("train_self_influence"))]
                                 for r in rows[:MAX_ROWS_SHOWN]),
                                caption=name))
            parts.append(_more(min(len(rows), MAX_ROWS_SHOWN), len(rows), name))
        note = no_opponents(result, entry)
        if note:
            parts.append(f"<p style='color:#8a4b00'>{escape(note)}</p>")
        head, body = breakdown_rows(result, entry)
        if body:
            parts.append(_table(head, ([escape(str(c)) if i < 2 else _num(c) for i, c in enumerate(row)]
                                       for row in body[:MAX_ROWS_SHOWN]),
                                caption="where each score comes from (parts add up to the influence)"))
    parts.append(_more(min(len(entries), MAX_SAMPLES_SHOWN), listed_total(result, "results"), "test triples",
                       result, "results"))
    if len(entries) > 1:
        for name in ("top_proponents", "top_opponents"):
            rows = [r for r in result.get(name) or [] if isinstance(r, Mapping)]
            scale = max((abs(_influence(r.get("influence")) or 0.0) for r in rows), default=0.0)
            if rows:
                parts.append(_table(["test triple", "training triple", "influence"],
                                    ([_triple(r.get("test_triple")), _triple(r.get("train_triple")),
                                      _ibar(r.get("influence"), scale)] for r in rows[:MAX_ROWS_SHOWN]),
                                    caption=f"strongest {name[4:]} over every test triple"))
    ranking = list(result.get("ranking") or [])
    if ranking:
        parts.append(_table(["rank", "training triple", "self-influence"],
                            ([str(i + 1), _triple(r.get("train_triple")), _num(r.get("self_influence"))]
                             for i, r in enumerate(ranking[:MAX_ROWS_SHOWN])),
                            caption="self-influence ranking (highest first: candidates for mislabelled facts)"))
        parts.append(_more(min(len(ranking), MAX_ROWS_SHOWN), listed_total(result, "ranking"), "ranked triples",
                           result, "ranking"))
    return "".join(parts) + "</div>"


# ------------------------------------------------------------------------------------------------ ablations
def _ablation_table(result: Mapping[str, Any], num: Any, name: Any, missing: str, arrow: str
                    ) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the representation × layer-set table: test accuracy mean ± std per cell and the
    all → visual drop, numbers through ``num``, names through ``name`` (HTML escapes them, text does not)."""
    cells: Mapping[str, Mapping[str, Any]] = result.get("results") or {}
    sets = list(cells)
    reps = list(dict.fromkeys(rep for ls in sets for rep in cells[ls]))
    drop = result.get("drop") or {}
    rows = []
    for rep in reps:
        row = [name(rep)]
        for ls in sets:
            m = (cells[ls].get(rep) or {}).get("test_acc") or {}
            row.append(f"{num(m.get('mean'), 3)} ± {num(m.get('std'), 2)}" if m else missing)
        if drop:
            d = drop.get(rep)
            row.append(num(d.get("absolute"), 3) if d else missing)
        rows.append(row)
    headers = ["representation", *(f"{ls} test acc" for ls in sets)] + ([f"drop all{arrow}visual"] if drop else [])
    return headers, rows


def ablation_html(result: Mapping[str, Any]) -> str:
    """Test accuracy mean ± std per representation × layer set, and the all → visual drop."""
    headers, rows = _ablation_table(result, _num, escape, "–", "→")
    return f"<div><b>LoRA ablation</b> on <code>{escape(str(result.get('dataset', '')))}</code>" + \
        _table(headers, rows) + "</div>"


# ------------------------------------------------------------------------------------------------ evaluations
def _evaluation_table(result: Mapping[str, Any], num: Any, name: Any) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of an evaluation: per estimator its LDS mean and interval, or its mislabel-detection
    AUC and found@10%/20%; and its time. Numbers through ``num``, names through ``name``."""
    estimators: Mapping[str, Mapping[str, Any]] = result.get("estimators") or {}
    rows = []
    if result.get("metric") == "mislabel":
        for est, r in estimators.items():
            ci = r.get("auc_interval") or {}
            interval = "" if ci.get("low") is None else f"[{num(ci.get('low'), 3)}, {num(ci.get('high'), 3)}]"
            auc = r["auc"] if "auc" in r else ci.get("auc")  # a classifier evaluation's is in its interval
            rows.append([name(est), num(auc, 3), interval, num(r.get("found_at_10"), 3),
                         num(r.get("found_at_20"), 3), num(r.get("seconds"), 3)])
        return ["estimator", "AUC", "95% interval", "found@10%", "found@20%", "seconds"], rows
    for est, r in estimators.items():
        lds = r.get("lds") or {}
        ratio = r.get("ratio_to_tracin") or {}
        vs = "" if ratio.get("ratio") is None else (
            num(ratio.get("ratio"), 2) + ("" if ratio.get("low") is None
                                          else f" [{num(ratio.get('low'), 2)}, {num(ratio.get('high'), 2)}]"))
        rows.append([name(est), num(lds.get("mean"), 3), f"[{num(lds.get('low'), 3)}, {num(lds.get('high'), 3)}]",
                     num(lds.get("n")), num(r.get("n_undefined")), num(r.get("seconds"), 3), vs])
    return ["estimator", "LDS", "95% interval", f"test {_unit(result)}s", "undefined", "seconds", "x TracIn"], rows


def _unit(result: Mapping[str, Any]) -> str:
    """What an evaluation's training and test items are: a classifier's examples (its result names a ``model``)
    or a knowledge graph's triples."""
    return "example" if "model_version" in result else "triple"


def _evaluation_head(result: Mapping[str, Any], dataset: str, num: Any) -> str:
    """The evaluation's one-line summary (``dataset`` as the caller writes it)."""
    unit = _unit(result)
    on = f"on {dataset}" if unit == "triple" else f"of {num(result.get('model'))} on {dataset}"
    if result.get("metric") == "mislabel":
        if unit == "example":
            return (f"{on}: {num(result.get('n_flipped'))} of {num(result.get('n_train'))} training labels "
                    f"flipped (fraction {num(result.get('fraction'))})")
        return f"{on}: {num(result.get('n_corrupted'))} of {num(result.get('n_train'))} training triples corrupted"
    head = f"{on}: {num(result.get('m'))} subset models at alpha {num(result.get('alpha'))}"
    if unit == "example":
        head += f" ({num(result.get('subset_size'))} of {num(result.get('n_train'))} training examples each)"
    return head + f", {num(result.get('n_test'))} test {unit}s"


def _recipe_line(result: Mapping[str, Any], num: Any, name: Any = str) -> str:
    """The recipe every model of a classifier evaluation was trained with (none for a ConvE one's: its table is
    in the result)."""
    recipe = result.get("recipe") or {}
    if _unit(result) != "example" or not isinstance(recipe, Mapping):
        return ""
    return "recipe: " + ", ".join(f"{name(str(k))} {num(v)}" for k, v in recipe.items()
                                  if not isinstance(v, Mapping | list))


SUSPECTS_SHOWN = 10  # of each estimator's suspects, in the notebook and terminal views (all: result.suspects())


def _suspect_table(r: Mapping[str, Any], num: Any, name: Any) -> tuple[list[str], list[list[str]]]:
    """The first :data:`SUSPECTS_SHOWN` suspects of one estimator: rank, the triple, its self-influence and
    whether it was corrupted (and from which tail)."""
    rows = []
    for s in list(r.get("suspects") or [])[:SUSPECTS_SHOWN]:
        triple = " · ".join(str(x) for x in s.get("triple") or [])
        corrupted = f"yes (was {s.get('original_tail')})" if s.get("corrupted") else "no"
        rows.append([num(s.get("rank")), name(triple), num(s.get("self_influence"), 6), name(corrupted)])
    return ["rank", "training triple", "self-influence", "corrupted"], rows


def _ceiling_line(result: Mapping[str, Any], num: Any) -> str:
    """The ground truth's noise ceiling, when the evaluation measured it (``replicates``)."""
    nc = result.get("noise_ceiling") or {}
    agree = nc.get("agreement") or {}
    if agree.get("mean") is None:
        return ""
    return (f"noise ceiling: replicates agree at {num(agree.get('mean'), 3)} [{num(agree.get('low'), 3)}, "
            f"{num(agree.get('high'), 3)}], so no LDS can be expected above about {num(nc.get('ceiling'), 3)}")


def _interval_chart(rows: Sequence[tuple[str, float, float, float]], w: int = 380) -> str:
    """Horizontal bars from 0 to each mean with whiskers over its interval (an SVG with a title per bar)."""
    if not rows:
        return ""
    lo = min(0.0, *(r[2] for r in rows))
    hi = max(0.0, *(r[3] for r in rows))
    hi = hi if hi > lo else lo + 1.0
    left, right, row_h = 90, 16, 22
    h = 26 + row_h * len(rows)

    def x(v: float) -> float:
        return left + (v - lo) / (hi - lo) * (w - left - right)

    parts = [f"<line x1='{x(0):.1f}' y1='6' x2='{x(0):.1f}' y2='{h - 14}' stroke='#888'/>",
             f"<text x='{left}' y='{h - 2}' font-size='10'>{_num(lo, 3)}</text>",
             f"<text x='{w - right}' y='{h - 2}' font-size='10' text-anchor='end'>{_num(hi, 3)}</text>"]
    for i, (label, mean, low, high) in enumerate(rows):
        y = 8 + i * row_h
        colour = ESTIMATOR_COLOURS[i % len(ESTIMATOR_COLOURS)]
        x0, x1 = sorted((x(0), x(mean)))
        parts.append(f"<g><title>{escape(label)}: {_num(mean, 4)} [{_num(low, 4)}, {_num(high, 4)}]</title>"
                     f"<text x='{left - 6}' y='{y + 12}' font-size='11' text-anchor='end'>{escape(label)}</text>"
                     f"<rect x='{x0:.1f}' y='{y + 3}' width='{max(x1 - x0, 1):.1f}' height='12' fill='{colour}'/>"
                     f"<line x1='{x(low):.1f}' y1='{y + 9}' x2='{x(high):.1f}' y2='{y + 9}' stroke='#000'/>"
                     f"<line x1='{x(low):.1f}' y1='{y + 4}' x2='{x(low):.1f}' y2='{y + 14}' stroke='#000'/>"
                     f"<line x1='{x(high):.1f}' y1='{y + 4}' x2='{x(high):.1f}' y2='{y + 14}' stroke='#000'/></g>")
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' role='img' "
            f"aria-label='LDS per estimator with 95% intervals'>{''.join(parts)}</svg>")


def evaluation_html(result: Mapping[str, Any]) -> str:
    """LDS per estimator as bars with interval whiskers and a table; or mislabel detection's table and recall
    curves."""
    headers, rows = _evaluation_table(result, _num, escape)
    estimators: Mapping[str, Mapping[str, Any]] = result.get("estimators") or {}
    head = _evaluation_head(result, f"<code>{escape(str(result.get('dataset', '')))}</code>", _num)
    recipe = _recipe_line(result, _num, escape)
    recipe = f"<p>{recipe}</p>" if recipe else ""
    if result.get("metric") == "mislabel":
        curves = {est: list(zip((r.get("recall_curve") or {}).get("inspected", []),
                                (r.get("recall_curve") or {}).get("found", []), strict=False))
                  for est, r in estimators.items()}
        suspects = "".join(f"<p><b>{escape(str(est))}</b>: its top suspects</p>" + _table(*_suspect_table(
            r, _num, escape)) for est, r in estimators.items() if r.get("suspects"))
        found = "flipped examples found" if _unit(result) == "example" else "corrupted triples found"
        return (f"<div><b>Mislabel detection</b> {head}" + _table(headers, rows)
                + _chart(found, curves, xlabel="fraction inspected") + suspects + recipe + "</div>")
    bars = [(str(est), float((r.get("lds") or {}).get("mean")), float((r.get("lds") or {}).get("low")),
             float((r.get("lds") or {}).get("high"))) for est, r in estimators.items()
            if (r.get("lds") or {}).get("mean") is not None]
    ceiling = _ceiling_line(result, _num)
    warnings = "".join(f"<li>{escape(str(w))}</li>" for w in result.get("warnings") or [])
    return (f"<div><b>LDS</b> {head}" + (f"<ul style='color:#8a4b00'>{warnings}</ul>" if warnings else "")
            + _interval_chart(bars) + _table(headers, rows) + (f"<p>{ceiling}</p>" if ceiling else "") + recipe
            + "</div>")


def evaluation_text(result: Mapping[str, Any]) -> str:
    headers, rows = _evaluation_table(result, _tnum, str)
    head = _evaluation_head(result, str(result.get("dataset", "")), str)
    title = f"{'mislabel detection' if result.get('metric') == 'mislabel' else 'LDS'} {head}"
    ceiling = "" if result.get("metric") == "mislabel" else _ceiling_line(result, _tnum)
    warnings = "".join(f"\n  {w}" for w in result.get("warnings") or [])
    suspects = "".join(f"\n\n{est}: its top suspects\n" + text_table(*_suspect_table(r, _tnum, str))
                       for est, r in (result.get("estimators") or {}).items()
                       if result.get("metric") == "mislabel" and r.get("suspects"))
    recipe = _recipe_line(result, _tnum)
    return (title + warnings + "\n\n" + text_table(headers, rows) + (f"\n\n{ceiling}" if ceiling else "")
            + suspects + (f"\n\n{recipe}" if recipe else ""))


# ------------------------------------------------------------------------------------------------ a job
def job_html(view: Mapping[str, Any], curves: bool = True) -> str:
    """A job's status line and progress bar; with ``curves``, a training job's curves from its live
    ``metrics.history``."""
    status = str(view.get("status"))
    progress = view.get("progress") or {}
    done, total = progress.get("done"), progress.get("total")
    bar = ""
    if isinstance(done, int | float) and isinstance(total, int | float) and total:
        eta = progress.get("eta_s")
        bar = (f"<progress value='{done}' max='{total}'></progress> {_num(done)}/{_num(total)} "
               f"{escape(str(progress.get('unit') or ''))}" + (f", ETA {eta:.0f}s" if eta is not None else ""))
    error = view.get("error")
    err = f"<br><b>{escape(str(error.get('code')))}</b>: {escape(str(error.get('message')))}" \
        if isinstance(error, Mapping) else ""
    message = f" <small>{escape(str(progress.get('message')))}</small>" if progress.get("message") else ""
    head = (f"<div><code>{escape(str(view.get('id')))}</code> <b>{escape(str(view.get('kind')))}</b> "
            f"{escape(status)} {bar}{message}{err}</div>")
    metrics = view.get("metrics") or {}
    history, steps = metrics.get("history"), metrics.get("steps")
    return head + (curves_html(history or [], str(view.get("kind")), steps or []) if (history or steps) and curves
                   else "")


# ------------------------------------------------------------------------------------------------ plain text
# The same views as plain text for a terminal (``explainq-client result <id> --table``).
def text_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns padded to their widest cell, two spaces apart; ``None`` prints empty."""
    cells = [[str("" if v is None else v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
                     for row in [list(headers), *cells])


def _tnum(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value) if value is not None else "-"
    return str(value) if isinstance(value, int) else f"{value:.{digits}g}"


def _text_triple(t: Any) -> str:
    return " · ".join(map(str, t)) if isinstance(t, Sequence) and not isinstance(t, str) else str(t)


def _text_more(shown: int, total: int, what: str, result: Mapping[str, Any] | None = None,
               name: str | None = None) -> list[str]:
    if total <= shown:
        return []
    return [f"... showing {shown} of {total} {what}; {_where(result or {}, name, False)}"]


def _top_words(view: Mapping[str, Any], k: int = 5) -> str:
    pairs = [(str(w), float(a)) for w, a in zip(view.get("words") or [], view.get("word_attributions") or [],
                                                strict=False) if isinstance(a, int | float)]
    pairs.sort(key=lambda p: -abs(p[1]))
    return " ".join(f"{w}({_signed(a)})" for w, a in pairs[:k])


def attribution_text(result: Mapping[str, Any]) -> str:
    """Per sample: id, label, score, completeness delta and its words of largest |attribution|; the changed
    words of a comparison; each label's highest and lowest words."""
    samples = list(result.get("samples") or [])
    out = [f"attributions of model {result.get('model', '')}", ""]
    rows = [[s.get("id", ""), s.get("label"), _tnum(s.get("score")), _tnum(s.get("delta"), 2), _top_words(s)]
            for s in samples[:MAX_SAMPLES_SHOWN]]
    out += [text_table(["sample", "label", "score", "delta", "top words (attribution)"], rows),
            *_text_more(len(rows), listed_total(result, "samples"), "samples", result, "samples")]
    warnings = [w for w in result.get("warnings") or [] if isinstance(w, str)]
    if warnings:
        out += ["", "warnings", *(f"  {w}" for w in warnings)]
    errors = list(result.get("errors") or [])
    if errors:
        out += ["", "samples not attributed",
                text_table(["sample", "error"], ([e.get("id"), e.get("error")] for e in errors)),
                *_text_more(len(errors), listed_total(result, "errors"), "samples not attributed", result, "errors")]
    comparison = result.get("comparison")
    if isinstance(comparison, Mapping):
        changed = list(comparison.get("changed") or [])
        shown = min(len(changed), MAX_ROWS_SHOWN)
        total = comparison.get("changed_total") if isinstance(comparison.get("changed_total"), int) else len(changed)
        out += ["", f"words that changed vs {comparison.get('model')} (|change| > {comparison.get('threshold')})",
                text_table(["word", "mean before", "mean after", "change"],
                           ([c.get("word"), _tnum(c.get("mean_before")), _tnum(c.get("mean_after")),
                             _signed(_float(c.get("change")))] for c in changed[:shown]))]
        if total > shown:
            out.append(f"... showing {shown} of {total} changed words; "
                       + ("all of them are in comparison.json" if total > len(changed)
                          else "the JSON result has all of them"))
    for label, stats in sorted((result.get("word_stats") or {}).items()):
        words = stats.get("words") if isinstance(stats, Mapping) else None
        out += ["", f"highest and lowest words for label {label}"
                + (f" (of {words}; all in word_stats.json)" if isinstance(words, int) else ""),
                text_table(["word", "mean attribution", "count"],
                           ([r.get("word"), _signed(_float(r.get("mean"))), _tnum(r.get("count"))]
                            for r in (_word_stat_rows(stats) if isinstance(stats, Mapping) else [])))]
    return "\n".join(out)


def tracin_text(result: Mapping[str, Any]) -> str:
    """Per test triple: its proponents and opponents by influence; or the self-influence ranking."""
    out = [f"TracIn on {result.get('model', '')}, {_tracin_head(result)}"
           + (f", filter {result['filter']}" if result.get("filter") else "")]
    out += [f"  note: {c}" for c in _tracin_caveats(result)]
    entries = [e for e in result.get("results") or [] if isinstance(e, Mapping)]
    for entry in entries[:MAX_SAMPLES_SHOWN]:
        pred = entry.get("prediction") if isinstance(entry.get("prediction"), Mapping) else None
        context = (f"model score {_tnum(pred.get('score'))}, filtered rank {_tnum(pred.get('rank'))} of "
                   f"{_tnum(pred.get('n_entities'))}; " if pred else "")
        out += ["", f"test triple {_text_triple(entry.get('test_triple'))}"
                + (" [in the training set]" if entry.get("in_train") else "")
                + f" ({context}self-influence {_tnum(entry.get('self_influence'))}, "
                f"{_tnum(entry.get('n_candidates'))} candidates)"]
        for name in ("proponents", "opponents", "pairs"):
            if entry.get(name) is None:
                continue
            rows = list(entry.get(name) or [])
            out += [f"  top {name}",
                    text_table(["  rank", "training triple", "influence", "train self-influence"],
                               ([f"  {i + 1}", _text_triple(r.get("train_triple")) + _flag(entry, r),
                                 _tsigned(r.get("influence")), _tnum(r.get("train_self_influence"))]
                                for i, r in enumerate(rows[:MAX_ROWS_SHOWN]))),
                    *_text_more(min(len(rows), MAX_ROWS_SHOWN), len(rows), name)]
        note = no_opponents(result, entry)
        out += [f"  {note}"] if note else []
        head, body = breakdown_rows(result, entry)
        if body:
            out += ["  where each score comes from (parts add up to the influence)",
                    text_table(["  " + head[0], *head[1:]],
                               ([f"  {row[0]}", row[1], *(_tsigned(v) for v in row[2:])]
                                for row in body[:MAX_ROWS_SHOWN]))]
    more = _text_more(min(len(entries), MAX_SAMPLES_SHOWN), listed_total(result, "results"), "test triples",
                      result, "results")
    out += ["", *more] if more else []
    ranking = list(result.get("ranking") or [])
    if ranking:
        out += ["", "self-influence ranking (highest first: candidates for mislabelled facts)",
                text_table(["rank", "training triple", "self-influence"],
                           ([i + 1, _text_triple(r.get("train_triple")), _tnum(r.get("self_influence"))]
                            for i, r in enumerate(ranking[:MAX_ROWS_SHOWN]))),
                *_text_more(min(len(ranking), MAX_ROWS_SHOWN), listed_total(result, "ranking"), "ranked triples",
                            result, "ranking")]
    return "\n".join(out)


def _tsigned(value: Any) -> str:
    v = _influence(value)
    return _signed(v) if v is not None else "-"


def training_text(result: Mapping[str, Any]) -> str:
    """One row per epoch (every numeric field of the history, nested ones as ``valid.mrr``), then the result's
    values (:func:`training_summary`), the same for every training kind."""
    history = list(result.get("history") or [])
    flat = [_flat(row) for row in history]
    columns = list(dict.fromkeys(k for row in flat for k in row))
    out = [f"training {_title(result)}".rstrip(), ""]
    if history:
        out.append(text_table(["epoch", *columns],
                              ([_tnum(row.get("epoch", i + 1)), *(_tnum(f.get(c)) if c in f else "" for c in columns)]
                               for i, (row, f) in enumerate(zip(history, flat, strict=True)))))
    else:
        out.append("no epochs finished")
    final = training_summary(result)
    if final:
        out += ["", "result", text_table(["field", "value"], ([k, _tnum(v)] for k, v in final.items()))]
    warnings = [w for w in result.get("warnings") or [] if isinstance(w, str)]
    if warnings:
        out += ["", "warnings", *(f"  {w}" for w in warnings)]
    return "\n".join(out)


def ablation_text(result: Mapping[str, Any]) -> str:
    """Test accuracy mean ± std per representation × layer set, and the all → visual drop."""
    headers, rows = _ablation_table(result, _tnum, str, "-", "->")
    return f"LoRA ablation on {result.get('dataset', '')}\n\n" + text_table(headers, rows)


# ---- provenance
def provenance_rows(block: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What produced a result, as (what, value) rows: the models and datasets with their digests, the seeds, the
    device and precision, the software, the worker and the times."""
    rows: list[tuple[str, str]] = []
    for m in [*(block.get("models") or []), *(block.get("registered") or [])]:
        if not isinstance(m, Mapping):
            continue
        parts = [str(m.get("name"))]
        if m.get("version"):
            parts.append(f"version {m['version']}")
        if m.get("digest"):
            parts.append(f"sha256 {str(m['digest'])[:12]}")
        rows.append((str(m.get("field") or "registered"), " · ".join(parts)))
    for d in block.get("datasets") or []:
        if isinstance(d, Mapping):
            digest = f" · sha256 {str(d['digest'])[:12]}" if d.get("digest") else ""
            rows.append((str(d.get("field")), f"{d.get('name')} ({d.get('source')}){digest}"))
    seeds = block.get("seeds") or {}
    if seeds:
        rows.append(("seeds", ", ".join(f"{k}={v}" for k, v in seeds.items())))
    device = str(block.get("device") or "–") + (f" · precision {block['precision']}" if block.get("precision") else "")
    rows.append(("device", device))
    s = block.get("software") or {}
    software = f"explainq {s.get('explainq') or '?'}" + (f" ({str(s['commit'])[:12]})" if s.get("commit") else "")
    software += f" · torch {s.get('torch') or '?'}" + (f" · CUDA {s['cuda']}" if s.get("cuda") else "")
    rows.append(("software", software))
    rows.append(("worker", str(block.get("worker") or "–")))
    rows.append(("ran", f"{block.get('started_at') or '?'} → {block.get('finished_at') or '?'}"))
    return rows


def provenance_html(block: Mapping[str, Any]) -> str:
    return _table(["", ""], ([escape(k), escape(v)] for k, v in provenance_rows(block)), caption="Provenance")


def provenance_text(block: Mapping[str, Any]) -> str:
    return text_table(["", ""], provenance_rows(block))


def _thumb_html(preview: Any, px: int = 56) -> str:
    """An image example's preview (rows of values) as a small grey grid, black to white over its own range."""
    if not isinstance(preview, Sequence) or not preview or not isinstance(preview[0], Sequence):
        return ""
    values = [_float(v) for row in preview for v in row]
    finite = [v for v in values if v is not None]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    cells = "".join(
        f"<span style='background:rgb({g},{g},{g})'></span>"
        for g in (round(255 * (v - lo) / (hi - lo)) if v is not None and hi > lo else 128 for v in values))
    return (f"<span style='display:inline-grid;width:{px}px;height:{px}px;border:1px solid #999;"
            f"grid-template-columns:repeat({len(preview[0])},1fr)'>{cells}</span>")


ESTIMATOR_TITLES = {"tracin": "TracIn-CP", "tracin_projected": "TracIn-CP (projected)", "trak": "TRAK",
                    "trak_ensemble": "TRAK (ensemble)", "ekfac": "EK-FAC influence functions"}


def _estimator_title(result: Mapping[str, Any]) -> str:
    name = str(result.get("estimator") or "tracin")
    return ESTIMATOR_TITLES.get(name, name)


def classifier_influence_html(result: Mapping[str, Any]) -> str:
    """Per test example (its preview or text) its proponents and opponents with bars from zero on one scale per
    test example; or the self-influence ranking. Images as thumbnails, texts as text."""
    head = (f"<div><b>{_estimator_title(result)}</b> on <code>{escape(str(result.get('model', '')))}</code>, mode "
            f"{escape(str(result.get('mode')))}, {len(result.get('checkpoints') or [])} checkpoints, "
            f"{_num(result.get('train_examples'))} training examples")
    parts = [head]

    def rows(items: list[Mapping[str, Any]], scale: float) -> list[list[str]]:
        return [[_thumb_html(e.get("preview")) or escape(str(e.get("text") or "")), f"#{_num(e.get('index'))}",
                 escape(str(e.get("label"))), _bar(_float(e.get("score")) or 0.0, scale)] for e in items]

    tests = [t for t in result.get("tests") or [] if isinstance(t, Mapping)]
    for t in tests[:MAX_SAMPLES_SHOWN]:
        own = _thumb_html(t.get("preview"), 80) or f"<q>{escape(str(t.get('text') or ''))}</q>"
        parts.append(f"<h4 style='margin:8px 0 2px'>{escape(str(t.get('id')))} {own} <small>class "
                     f"{escape(str(t.get('target')))}, predicted {escape(str(t.get('predicted')))}</small></h4>")
        groups = [(k, [e for e in t.get(k) or [] if isinstance(e, Mapping)]) for k in ("proponents", "opponents")]
        scale = max((abs(_float(e.get("score")) or 0.0) for _, items in groups for e in items), default=0.0)
        for name, items in groups:
            parts.append(_table(["example", "index", "label", "influence"], rows(items[:MAX_ROWS_SHOWN], scale),
                                caption=name))
    ranking = [e for e in result.get("self_influence") or [] if isinstance(e, Mapping)]
    if ranking:
        scale = max((abs(_float(e.get("score")) or 0.0) for e in ranking), default=0.0)
        parts.append(_table(["example", "index", "label", "self-influence"], rows(ranking[:MAX_ROWS_SHOWN], scale),
                            caption="Highest self-influence"))
    return "".join(parts) + "</div>"


def classifier_influence_text(result: Mapping[str, Any]) -> str:
    lines = [f"{_estimator_title(result)} on {result.get('model')}, mode "
             f"{result.get('mode')}"]
    for t in result.get("tests") or []:
        lines.append(f"{t.get('id')}: class {t.get('target')}, predicted {t.get('predicted')}")
        for key in ("proponents", "opponents"):
            lines.append(f"  {key}: " + ", ".join(f"#{e.get('index')} {e.get('label')} {_signed(e.get('score') or 0.0)}"
                                                  for e in (t.get(key) or [])[:MAX_ROWS_SHOWN]))
    for i, e in enumerate((result.get("self_influence") or [])[:MAX_ROWS_SHOWN], 1):
        lines.append(f"{i}. #{e.get('index')} {e.get('label')} {_num(e.get('score'))}")
    return "\n".join(lines)
