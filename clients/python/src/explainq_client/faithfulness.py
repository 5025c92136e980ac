"""The ``faithfulness`` section of an attribution result as a table, with its curves (HTML and plain text).

One row per word ranking (``ig``, ``random``, ``occlusion``): comprehensiveness and sufficiency at each fraction
of the words (DeYoung et al. 2020), the areas under the deletion and insertion curves (Petsiuk et al. 2018).
``to_pandas()`` gives a DataFrame when pandas is installed (the SDK does not depend on it).
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from explainq_client import render

__all__ = ["FaithfulnessTable", "faithfulness_html", "faithfulness_table", "faithfulness_text"]

LABELS = {"ig": "IG", "random": "random order", "occlusion": "occlusion"}


def _pct(q: Any) -> str:
    return f"{round(float(q) * 100)}%" if isinstance(q, int | float) else str(q)


class FaithfulnessTable(list[dict[str, Any]]):
    """Rows ``{"ranking", "comprehensiveness@1%", ..., "sufficiency@50%", "deletion_auc", "insertion_auc"}``;
    ``curves`` the mean deletion / insertion curves (``{"fraction": [...], ranking: {"deletion", "insertion"}}``),
    ``tests`` the paired Wilcoxon tests of IG against each other ranking, ``section`` the whole section."""

    def __init__(self, section: Mapping[str, Any]):
        fractions = list(section.get("fractions") or [])
        rows = []
        for name, o in (section.get("orders") or {}).items():
            if not isinstance(o, Mapping):
                continue
            row: dict[str, Any] = {"ranking": name}
            for metric in ("comprehensiveness", "sufficiency"):
                for q, v in zip(fractions, o.get(metric) or [], strict=False):
                    row[f"{metric}@{_pct(q)}"] = v
            row["deletion_auc"] = o.get("deletion_auc")
            row["insertion_auc"] = o.get("insertion_auc")
            rows.append(row)
        super().__init__(rows)
        self.section = dict(section)
        self.curves = dict(section.get("curves") or {})
        self.tests = list(section.get("tests") or [])

    @property
    def columns(self) -> list[str]:
        return list(self[0]) if self else []

    def to_pandas(self) -> Any:
        """The rows as a ``pandas.DataFrame`` indexed by ranking (pandas must be installed)."""
        import pandas as pd

        return pd.DataFrame(list(self)).set_index("ranking")

    def _repr_html_(self) -> str:
        return faithfulness_html(self.section)

    def __str__(self) -> str:
        return faithfulness_text(self.section)


def faithfulness_table(result: Mapping[str, Any]) -> FaithfulnessTable | None:
    """The result's faithfulness table, or None when the request did not ask for it."""
    section = result.get("faithfulness")
    return FaithfulnessTable(section) if isinstance(section, Mapping) else None


def _curve_series(section: Mapping[str, Any], curve: str) -> dict[str, list[tuple[float, float]]]:
    curves = section.get("curves") or {}
    xs = list(curves.get("fraction") or [])
    out = {}
    for name, c in curves.items():
        if name == "fraction" or not isinstance(c, Mapping):
            continue
        ys = c.get(curve) or []
        out[LABELS.get(name, name)] = [(float(x), float(y)) for x, y in zip(xs, ys, strict=False)
                                       if isinstance(y, int | float)]
    return out


def faithfulness_html(section: Mapping[str, Any]) -> str:
    """The deletion and insertion curves (inline SVG), the table and the paired tests."""
    table = FaithfulnessTable(section)
    cols = table.columns
    parts = [f"<div><b>faithfulness</b> over {escape(str(section.get('n_samples')))} samples "
             f"(time {render._num(section.get('seconds'), 3)} s, {render._num(section.get('time_ratio'), 3)}× the "
             "attribution's)<br>"]
    for curve in ("deletion", "insertion"):
        parts.append(render._chart(f"{curve} curve", _curve_series(section, curve), xlabel="fraction of words"))
    parts.append(render._table(cols, ([escape(LABELS.get(str(r["ranking"]), str(r["ranking"])))]
                                      + [render._num(r[c], 3) for c in cols[1:]] for r in table)))
    if table.tests:
        parts.append(render._table(
            ["metric", "IG vs", "n", "median difference", "W", "p", "p (Holm)", "effect [95%]"],
            ([escape(str(t.get("metric"))), escape(LABELS.get(str(t.get("against")), str(t.get("against")))),
              render._num(t.get("n")), render._num(t.get("median_difference"), 3), render._num(t.get("statistic")),
              render._num(t.get("p_value"), 3), render._num(t.get("p_holm"), 3), escape(_effect(t))]
             for t in table.tests),
            caption="Wilcoxon signed-rank tests, one-sided (IG more faithful); p adjusted by Holm over the tests; "
                    "effect: rank-biserial correlation in IG's favour, 95% bootstrap interval"))
    return "".join(parts) + "</div>"


def _effect(test: Mapping[str, Any]) -> str:
    """A test's effect size in IG's favour with its interval, as text ("-" when there is none)."""
    r = test.get("effect_rank_biserial")
    if not isinstance(r, int | float):
        return "-"
    ci = test.get("effect_interval")
    return f"{r:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if isinstance(ci, list) and len(ci) == 2 else "")


def faithfulness_text(section: Mapping[str, Any]) -> str:
    table = FaithfulnessTable(section)
    cols = table.columns
    out = [f"faithfulness over {section.get('n_samples')} samples (time {render._tnum(section.get('seconds'))} s, "
           f"{render._tnum(section.get('time_ratio'), 3)}x the attribution's)",
           render.text_table(cols, ([r["ranking"], *(render._tnum(r[c]) for c in cols[1:])] for r in table))]
    if table.tests:
        out += ["", "Wilcoxon signed-rank tests, one-sided (IG more faithful)",
                render.text_table(["metric", "IG vs", "n", "median diff", "W", "p", "p Holm", "effect [95%]"],
                                  ([t.get("metric"), t.get("against"), t.get("n"),
                                    render._tnum(t.get("median_difference")), render._tnum(t.get("statistic")),
                                    render._tnum(t.get("p_value")), render._tnum(t.get("p_holm")), _effect(t)]
                                   for t in table.tests))]
    return "\n".join(out)
