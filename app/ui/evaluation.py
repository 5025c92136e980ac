"""The shapes the evaluation pages draw (renderers ``evaluation``, the ConvE evaluations, and
``classifier_evaluation``, the classifier ones): LDS bars with interval whiskers, mislabel recall curves, as plain
numbers and SVG coordinates (no JavaScript needed; every number is also in a table)."""

from __future__ import annotations

import math
from typing import Any

# Okabe-Ito (colour-blind safe), as the SDK's charts.
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000", "#F0E442")
BAR_W, ROW_H, LABEL_W = 420, 26, 110
CURVE_W, CURVE_H, PAD = 420, 260, 36


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def lds_bars(estimators: dict[str, Any]) -> dict[str, Any]:
    """One row per estimator with its mean and interval, and the x positions of its bar and whiskers on an
    axis from min(0, lows) to max(0, highs)."""
    rows = []
    for i, (name, r) in enumerate(estimators.items()):
        lds = (r or {}).get("lds") or {}
        rows.append({"name": name, "mean": lds.get("mean"), "low": lds.get("low"), "high": lds.get("high"),
                     "n": lds.get("n"), "n_undefined": (r or {}).get("n_undefined"), "seconds": (r or {}).get("seconds"),
                     "colour": COLOURS[i % len(COLOURS)], "ratio": (r or {}).get("ratio_to_tracin") or {}})
    drawn = [r for r in rows if all(_finite(r[k]) for k in ("mean", "low", "high"))]
    lo = min([0.0] + [r["low"] for r in drawn])
    hi = max([0.0] + [r["high"] for r in drawn])
    hi = hi if hi > lo else lo + 1.0
    span = BAR_W - LABEL_W - 16

    def x(v: float) -> float:
        return round(LABEL_W + (v - lo) / (hi - lo) * span, 1)

    for i, r in enumerate(rows):
        r["y"] = 10 + i * ROW_H
        if r in drawn:
            a, b = sorted((x(0.0), x(r["mean"])))
            r.update(bar_x=a, bar_w=max(round(b - a, 1), 1.0), low_x=x(r["low"]), high_x=x(r["high"]))
    return {"rows": rows, "width": BAR_W, "height": 30 + ROW_H * len(rows), "zero_x": x(0.0), "lo": lo, "hi": hi,
            "label_w": LABEL_W}


def recall_curves(estimators: dict[str, Any]) -> dict[str, Any]:
    """Each estimator's recall curve (fraction of corrupted triples found against fraction inspected) as SVG
    polyline points on a unit square, with the random-order diagonal."""
    inner_w, inner_h = CURVE_W - 2 * PAD, CURVE_H - 2 * PAD
    series = []
    for i, (name, r) in enumerate(estimators.items()):
        curve = (r or {}).get("recall_curve") or {}
        pts = [(q, f) for q, f in zip(curve.get("inspected") or [], curve.get("found") or [], strict=False)
               if _finite(q) and _finite(f)]
        points = " ".join(f"{PAD + q * inner_w:.1f},{PAD + (1 - f) * inner_h:.1f}" for q, f in pts)
        series.append({"name": name, "points": points, "colour": COLOURS[i % len(COLOURS)]})
    return {"series": series, "width": CURVE_W, "height": CURVE_H, "pad": PAD, "x1": CURVE_W - PAD,
            "y1": CURVE_H - PAD, "ten_x": round(PAD + 0.1 * inner_w, 1), "twenty_x": round(PAD + 0.2 * inner_w, 1)}


def suspect_tables(estimators: dict[str, Any]) -> list[dict[str, Any]]:
    """Per estimator that lists suspects (results written before they existed list none), its listed training
    triples, best first, and how many of them were corrupted."""
    out = []
    for name, r in estimators.items():
        listed = [s for s in (r or {}).get("suspects") or [] if isinstance(s, dict)]
        if listed:
            out.append({"name": name, "suspects": listed, "n_corrupted": sum(bool(s.get("corrupted")) for s in listed)})
    return out


def mislabel_rows(estimators: dict[str, Any]) -> list[dict[str, Any]]:
    """Per estimator its AUC with its interval (a classifier evaluation keeps the AUC inside ``auc_interval``),
    found after 10 % and 20 %, and its seconds."""
    rows = []
    for name, r in estimators.items():
        r = r or {}
        ci = r.get("auc_interval") if isinstance(r.get("auc_interval"), dict) else None
        rows.append({"name": name, "auc": r["auc"] if "auc" in r else (ci or {}).get("auc"), "auc_interval": ci,
                     **{k: r.get(k) for k in ("found_at_10", "found_at_20", "seconds")}})
    return rows


def evaluation_view(result: dict[str, Any]) -> dict[str, Any]:
    estimators = result.get("estimators") if isinstance(result.get("estimators"), dict) else {}
    if result.get("metric") == "mislabel":
        return {"metric": "mislabel", "rows": mislabel_rows(estimators), "curves": recall_curves(estimators),
                "suspects": suspect_tables(estimators)}
    return {"metric": "lds", "bars": lds_bars(estimators)}


FLIPPED_SHOWN = 500  # of a mislabel evaluation's flipped training examples, on the page (all: the result's list)


def _pairs(record: Any) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in record.items() if not isinstance(v, dict | list)] if isinstance(record, dict) else []


def _model_card(ref: Any) -> dict[str, Any] | None:
    """A trained model's store key, seed, accuracy per split and checkpoint epochs."""
    if not isinstance(ref, dict):
        return None
    return {"key": ref.get("key"), "seed": ref.get("seed"),
            "accuracy": _pairs(ref.get("accuracy")),
            "epochs": [c.get("epoch") for c in ref.get("checkpoints") or [] if isinstance(c, dict)]}


def classifier_evaluation_view(result: dict[str, Any]) -> dict[str, Any]:
    """The classifier evaluations' card: the ConvE evaluations' shapes (bars and LDS table, AUC table and recall
    curves) with the recipe every model was trained with, the model(s) the estimators ran on and, for mislabel
    detection, the flipped training examples (their positions in the training split)."""
    view = evaluation_view(result)
    view["recipe"] = _pairs(result.get("recipe"))
    if view["metric"] == "mislabel":
        flipped = [i for i in result.get("flipped") or [] if isinstance(i, int)]
        view.update(model=_model_card(result.get("mislabel_model")), flipped=flipped[:FLIPPED_SHOWN],
                    flipped_more=max(len(flipped) - FLIPPED_SHOWN, 0))
        return view
    ensemble = result.get("ensemble") if isinstance(result.get("ensemble"), dict) else {}
    view.update(model=_model_card(result.get("full_model")), members=ensemble.get("members") or 0,
                replicates=bool(result.get("replicate_seeds")))
    return view
