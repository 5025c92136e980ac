"""Two jobs side by side (``client.compare(a, b)``, the server's ``GET /compare``): a dict with tables."""

from __future__ import annotations

from html import escape
from typing import Any

from explainq_client import render

__all__ = ["ComparisonResult"]

MAX_ROWS = 25

# the tables each renderer's comparison has (``to_pandas(of=...)``), the first being the default
TABLES = {"attributions": ("samples", "words", "sample_words"), "influence": ("triples", "lists"),
          "training": ("metrics", "history", "fields")}


def _triple(t: Any) -> str:
    return " · ".join(map(str, t)) if isinstance(t, list | tuple) else str(t)


class ComparisonResult(dict[str, Any]):
    """The comparison of two succeeded jobs of one kind, as the server answers it (deltas are b − a): ``a`` and
    ``b`` (the jobs: id, model, digest...), ``renderer`` and its section (``attributions``, ``influence`` or
    ``training``), ``notes``. :meth:`rows` and :meth:`to_pandas` give its tables (``TABLES[renderer]``)."""

    @property
    def renderer(self) -> str:
        return str(self.get("renderer") or "")

    @property
    def section(self) -> dict[str, Any]:
        """The filled section: ``self[self.renderer]``."""
        return dict(self.get(self.renderer) or {})

    @property
    def tables(self) -> tuple[str, ...]:
        return TABLES.get(self.renderer, ())

    def rows(self, of: str | None = None) -> list[dict[str, Any]]:
        """One of :attr:`tables` as rows (default: the first).

        attributions: ``samples`` (per matched sample: both scores, delta, ranks), ``words`` (per vocabulary
        word: counts, means, delta, ranks), ``sample_words`` (per word of each listed sample); influence:
        ``triples`` (per test triple, list and training triple: ranks, influences, change) and ``lists`` (per test
        triple and list: overlap, Spearman, Kendall, entered, left); training: ``metrics`` (the last row's),
        ``history`` (both runs' rows, with a ``run`` column) and ``fields`` (request fields that differ)."""
        of = of or (self.tables[0] if self.tables else "")
        if of not in self.tables:
            raise ValueError(f"of must be one of {', '.join(self.tables)} for a {self.renderer} comparison")
        s = self.section
        if of == "samples":
            return [{k: v for k, v in r.items() if k not in ("words", "largest_change")} for r in s.get("samples") or []]
        if of == "words":
            return list(s.get("words") or [])
        if of == "sample_words":
            return [{"sample": r.get("id"), **w} for r in s.get("samples") or [] for w in r.get("words") or []]
        if of in ("triples", "lists"):
            tests = list(s.get("tests") or [])
            if s.get("ranking"):
                tests = [{"test_triple": None, "lists": [s["ranking"]]}]
            out = []
            for t in tests:
                test = _triple(t["test_triple"]) if t.get("test_triple") else None
                for lst in t.get("lists") or []:
                    if of == "lists":
                        out.append({"test_triple": test, **{k: v for k, v in lst.items() if k != "triples"}})
                    else:
                        out += [{"test_triple": test, "role": lst.get("role"), **r,
                                 "train_triple": _triple(r.get("train_triple"))} for r in lst.get("triples") or []]
            return out
        if of == "metrics":
            return list(s.get("metrics") or [])
        if of == "history":
            return [{"run": side, **row} for side in ("a", "b") for row in s.get(f"history_{side}") or []]
        return list(s.get("changed_fields") or [])

    def to_pandas(self, of: str | None = None) -> Any:
        """:meth:`rows` as a ``pandas.DataFrame`` (pandas must be installed; the SDK does not depend on it)."""
        import pandas as pd

        return pd.DataFrame(self.rows(of))

    def _head(self) -> str:
        a, b = self.get("a") or {}, self.get("b") or {}
        return (f"{self.get('kind')}: a = {str(a.get('id', ''))[:8]} ({a.get('model') or '–'}), "
                f"b = {str(b.get('id', ''))[:8]} ({b.get('model') or '–'}); deltas are b − a")

    def _tables(self) -> list[tuple[str, list[str], list[list[Any]]]]:
        """(caption, headers, rows of values) of what the renderers draw."""
        s = self.section
        if self.renderer == "attributions":
            head = [("samples", ["sample", "score a", "score b", "Δ score", "rank a", "rank b", "rank change",
                                 "largest word change"],
                     [[r["id"], r["score_a"], r["score_b"], r["score_delta"], r["rank_a"], r["rank_b"],
                       r["rank_change"], (f"{r['largest_change']['word']} {r['largest_change']['delta']:+.4g}"
                                          if r.get("largest_change") and r["largest_change"].get("delta")
                                          is not None else None)]
                      for r in (s.get("samples") or [])[:MAX_ROWS]]),
                    ("words by change", ["word", "count a", "count b", "mean a", "mean b", "Δ", "rank change"],
                     [[w["word"], w["count_a"], w["count_b"], w["mean_a"], w["mean_b"], w["delta"],
                       w["rank_change"]] for w in (s.get("words") or [])[:MAX_ROWS]])]
            return head
        if self.renderer == "influence":
            return [(f"{r['test_triple'] or 'self-influence ranking'}: {r['role']}",
                     ["k", "overlap", "Spearman", "Kendall", "entered", "left"],
                     [[r["k"], r["overlap"], r["spearman"], r["kendall"], r["entered"], r["left"]]])
                    for r in self.rows("lists")[:MAX_ROWS]]
        if self.renderer == "training":
            return [("last epoch", ["metric", "a", "b", "Δ"],
                     [[m["key"], m["a"], m["b"], m["delta"]] for m in s.get("metrics") or []]),
                    ("request fields that differ", ["field", "a", "b"],
                     [[f["field"], f.get("a"), f.get("b")] for f in s.get("changed_fields") or []])]
        return []

    def _repr_html_(self) -> str:
        parts = [f"<div><b>Comparison</b> {escape(self._head())}"]
        notes = [str(n) for n in self.get("notes") or []]
        if notes:
            parts.append("<ul style='color:#8a4b00'>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>")
        for caption, headers, rows in self._tables():
            parts.append(render._table(headers, ([render._num(v) for v in row] for row in rows), caption=caption))
        return "".join(parts) + "</div>"

    def text(self) -> str:
        out = [f"Comparison {self._head()}", *(f"  note: {n}" for n in self.get("notes") or [])]
        for caption, headers, rows in self._tables():
            out += ["", caption, render.text_table(headers, ([render._tnum(v) for v in row] for row in rows))]
        return "\n".join(out)
