"""TracIn reports for a trained ConvE bundle: modes ``test``, ``self`` and ``single``, filtering and the CSV.

- ``test``: for each test triple, every candidate training triple is scored; ``proponents`` are the candidates with
  positive influence, largest first, ``opponents`` those with negative influence, most negative first. Each list
  holds at most ``top_k`` entries (all when ``top_k`` is None) and the result states ``n_candidates``,
  ``n_positive`` and ``n_negative``, so a cut is never silent.
- ``self``: TracIn(z, z) for the candidate training triples, largest first: high self-influence flags facts the
  model finds hard, often mislabelled ones.
- ``single``: the influence of each given training triple on each test triple, unranked.

Checkpoint weights (``lr_weight``): ``last`` weights checkpoint i by the learning rate stored with it, the rate
of the last epoch of its interval; ``interval`` by the sum of the rates of every epoch since the previous
selected checkpoint (``models.explain.tracin.interval_weights``), which is what TracIn's first-order derivation
implies for SGD. Neither is exact for Adam, whose step is η·m̂/(√v̂ + ε) rather than η·∇ℓ: the rate is only the
scalar part of a per-parameter preconditioned step, so with Adam both weightings are heuristics. ``interval``
still counts how many epochs each checkpoint stands for and follows a decay inside the interval; ``last``
ignores both. The weights used are in the result (``checkpoints[i].weight``).

One builder per mode, whichever path scored the candidates (one pass here, the features ``POST /featurize``
stored (:mod:`models.kg.stored`), or the shards of a fanned-out job merged by its reduce step): :class:`TestReport`
(modes ``test`` and ``single``: fed each test triple's entry in order) and :func:`self_report` (mode ``self``). They
write the artifacts (``results.jsonl``: every test triple's entry; ``self_influence.jsonl``: every candidate,
ranked; ``influence.csv``: every listed pair) and give the result's fields, the first ``RESULTS_INLINE`` entries
inline, so the result has one shape however it was computed. Without an output directory (a library call) every
entry is inline and the CSV rows are returned instead.

A NaN or infinite score fails the report (``NonFiniteError`` naming the triples); it is never dropped. Every
path reports one as :class:`models.explain.tracin.NonFiniteScores` (rows and columns of the scores) and
:func:`raise_non_finite` names the triples.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.common import NonFiniteError
from models.explain.tracin import LR_WEIGHTS, CandidatePairs, NonFiniteScores, interval_weights
from models.kg.checkpoint import KGBundle
from models.kg.graph import AdjacencyIndex
from models.kg.tracin import ConvETracIn
from models.tables import TableWriter

MODES = ("test", "self", "single")
CSV_COLUMNS = ["TestHead", "TestRel", "TestTail", "TrainHead", "TrainRel", "TrainTail", "TracInScore",
               "SelfInfluence", "Role", "TestHeadLabel", "TestRelLabel", "TestTailLabel", "TrainHeadLabel",
               "TrainRelLabel", "TrainTailLabel"]


@dataclass
class FilterSpec:
    n_hops: int = 1
    min_degree: int = 0
    preserve_test_entities: bool = True


ProgressFn = Callable[[int, int, str], None]


def _ranked(scores: torch.Tensor, top_k: int | None, positive: bool) -> list[int]:
    """Positions of the positive (or negative) ``scores``, strongest first, cut to ``top_k``."""
    sel = (scores > 0) if positive else (scores < 0)
    pos = torch.nonzero(sel).flatten()
    order = torch.argsort(scores[pos], descending=positive, stable=True)
    pos = pos[order]
    return (pos if top_k is None else pos[:top_k]).tolist()


def checkpoint_weights(bundle: KGBundle, ckpts: Sequence, lr_weight: str) -> list[float]:
    """η per selected checkpoint for ``lr_weight`` (see the module docstring)."""
    if lr_weight not in LR_WEIGHTS:
        raise ValueError(f"lr_weight must be one of {LR_WEIGHTS}, got {lr_weight!r}")
    if lr_weight == "last":
        return [float(c.lr) for c in ckpts]
    training = bundle.training or {}
    if "lr" not in training:
        raise ValueError("lr_weight 'interval' needs the model's training schedule (lr, lr_decay), which this "
                         "model does not record; use lr_weight 'last'")
    order = sorted(range(len(ckpts)), key=lambda i: ckpts[i].epoch)
    w = interval_weights([ckpts[i].epoch for i in order], float(training["lr"]),
                         float(training.get("lr_decay", 1.0)))
    out = [0.0] * len(ckpts)
    for i, wi in zip(order, w, strict=True):
        out[i] = wi
    return out


def _check_finite(ds, triples: torch.Tensor, values: torch.Tensor, what: str) -> None:
    """NonFiniteError naming the triples whose ``values`` (rows) hold a NaN or an infinity."""
    bad = ~torch.isfinite(values)
    if bad.dim() > 1:
        bad = bad.flatten(1).any(1)
    if bool(bad.any()):
        _raise_non_finite(ds, triples[bad], what)


def raise_non_finite(ds, exc: NonFiniteScores, test: torch.Tensor, train: torch.Tensor | None = None,
                     what: str = "influence") -> None:
    """The ``NonFiniteError`` of a ``NonFiniteScores`` raised while scoring ``test`` (rows) against ``train``
    (columns): the test triples of its rows, or else the training triples of its columns."""
    if exc.rows:
        _raise_non_finite(ds, test[torch.as_tensor(exc.rows, dtype=torch.long)], what)
    if train is not None and exc.cols:
        _raise_non_finite(ds, train[torch.as_tensor(exc.cols, dtype=torch.long)], what)
    raise NonFiniteError(f"non-finite {what}", [])


def _raise_non_finite(ds, triples: torch.Tensor, what: str) -> None:
    names = ds.decode(triples)
    shown = ", ".join("(" + ", ".join(t) + ")" for t in names[:10])
    more = f" and {len(names) - 10} more" if len(names) > 10 else ""
    raise NonFiniteError(f"non-finite {what} for {len(names)} triple(s): {shown}{more}", names)


def _label_cols(ds, prefix: str, trip: Sequence[str] | None) -> dict:
    if trip is None:
        return {f"{prefix}HeadLabel": "", f"{prefix}RelLabel": "", f"{prefix}TailLabel": ""}
    return {f"{prefix}HeadLabel": ds.entity_label(trip[0]), f"{prefix}RelLabel": ds.relation_label(trip[1]),
            f"{prefix}TailLabel": ds.entity_label(trip[2])}


def csv_row(ds, test: Sequence[str] | None, tr: Sequence[str], score: float | str, self_inf: float,
            role: str) -> dict:
    te = test if test is not None else ("", "", "")
    return {"TestHead": te[0], "TestRel": te[1], "TestTail": te[2], "TrainHead": tr[0], "TrainRel": tr[1],
            "TrainTail": tr[2], "TracInScore": score, "SelfInfluence": self_inf, "Role": role,
            **_label_cols(ds, "Test", test), **_label_cols(ds, "Train", tr)}


def entry_csv_rows(ds, entry: dict) -> list[dict]:
    """The CSV rows of one test triple's entry (its proponents, then its opponents)."""
    return [csv_row(ds, entry["test_triple"], e["train_triple"], e["influence"], e["train_self_influence"],
                    key[:-1]) for key in ("proponents", "opponents") for e in entry.get(key, [])]


def finish_entry(entry: dict, top_k: int | None) -> dict:
    """Public form of a test triple's entry: ``truncated`` set, the internal ``train_index`` dropped."""
    out = {k: v for k, v in entry.items() if k not in ("proponents", "opponents")}
    for key in ("proponents", "opponents"):
        if key in entry:
            out[key] = [{k: v for k, v in e.items() if k != "train_index"} for e in entry[key]]
    out["truncated"] = top_k is not None and "proponents" in entry and (entry["n_positive"] > top_k
                                                                          or entry["n_negative"] > top_k)
    return out


def merge_entries(parts: Sequence[dict], top_k: int | None) -> dict:
    """One test triple's entry from its entries over disjoint candidate ranges (the shards of a fanned-out run):
    counts add up, and the lists are the strongest ``top_k`` of the union, ties in training-triple order, exactly
    as one pass over every candidate ranks them."""
    first = parts[0]
    out = {"test_triple": first["test_triple"], "self_influence": first["self_influence"],
           "n_candidates": sum(p["n_candidates"] for p in parts),
           "n_positive": sum(p["n_positive"] for p in parts), "n_negative": sum(p["n_negative"] for p in parts)}
    if all("proponents" in p for p in parts):
        for key, sign in (("proponents", -1.0), ("opponents", 1.0)):
            rows = sorted((e for p in parts for e in p[key]), key=lambda e: (sign * e["influence"], e["train_index"]))
            out[key] = rows if top_k is None else rows[:top_k]
    return out


class GlobalTop:
    """The ``k`` strongest (test, training) pairs over every test triple, fed one test triple's entry at a time
    (each entry's lists hold its strongest ``k`` at least, so nothing stronger is missed). Ties: test order, then
    training order."""

    KEYS = (("top_proponents", "proponents", -1.0), ("top_opponents", "opponents", 1.0))

    def __init__(self, k: int) -> None:
        self.k = k
        self.rows: dict[str, list[tuple]] = {key: [] for key, _, _ in self.KEYS}

    def add(self, t: int, entry: dict) -> None:
        for key, lists, sign in self.KEYS:
            new = [(sign * e["influence"], t, e.get("train_index", 0), entry["test_triple"], e)
                   for e in entry.get(lists, [])[:self.k]]
            if new:
                rows = self.rows[key] + new
                rows.sort(key=lambda r: r[:3])
                self.rows[key] = rows[:self.k]

    def result(self) -> dict[str, list[dict]]:
        return {key: [{"test_triple": tt, "train_triple": e["train_triple"], "influence": e["influence"],
                       "train_self_influence": e["train_self_influence"]} for *_, tt, e in rows]
                for key, rows in self.rows.items()}


def _triple_keys(triples: torch.Tensor, n_rel: int, n_ent: int) -> torch.Tensor:
    return (triples[:, 0] * n_rel + triples[:, 1]) * n_ent + triples[:, 2]


@torch.no_grad()
def predictions(bundle: KGBundle, test_ids: torch.Tensor, batch_size: int = 256) -> list[dict]:
    """The model's own prediction for each test triple (h, r, t), and where the triple is known.

    ``score``: the final model's logit of t for the query (h, r); ``rank``: the filtered rank of t among every
    entity (every other known tail of (h, r) in any split is left out; ties count half, as in training's
    metrics: :func:`models.kg.train.ranks_from_scores`); ``splits``: the dataset's splits holding the triple
    (``train`` among them: the triple is a training triple, and so one of its own candidates).
    """
    from models.kg.train import ranks_from_scores

    ds = bundle.dataset
    model = bundle.model
    model.eval()
    n_ent, n_rel = len(ds.entities), len(ds.relations)
    known = ds.all_known()
    hr = known[:, 0] * n_rel + known[:, 1]
    order = torch.argsort(hr, stable=True)
    sorted_hr, tails = hr[order], known[order, 2]
    split_keys = {name: _triple_keys(t, n_rel, n_ent) for name, t in ds.splits.items() if len(t)}
    device = next(model.parameters()).device
    out: list[dict] = []
    for i in range(0, len(test_ids), batch_size):
        b = test_ids[i:i + batch_size]
        scores = model(b[:, 0].to(device), b[:, 1].to(device)).float().cpu()
        q = b[:, 0] * n_rel + b[:, 1]
        lo = torch.searchsorted(sorted_hr, q, right=False)
        hi = torch.searchsorted(sorted_hr, q, right=True)
        mask = torch.zeros(len(b), n_ent, dtype=torch.bool)
        for row, (a, z) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
            mask[row, tails[a:z]] = True
        ranks = ranks_from_scores(scores, b[:, 2], mask)
        keys = _triple_keys(b, n_rel, n_ent)
        held = {name: torch.isin(keys, k) for name, k in split_keys.items()}
        for row in range(len(b)):
            out.append({"score": float(scores[row, b[row, 2]]), "rank": float(ranks[row]), "n_entities": n_ent,
                        "splits": [name for name in ds.splits if name in held and bool(held[name][row])]})
    bad = [j for j, p in enumerate(out) if not math.isfinite(p["score"])]
    if bad:
        _raise_non_finite(ds, test_ids[bad], "model score")
    return out


def add_predictions(entries: list[dict], preds: Sequence[dict]) -> None:
    """Set each test triple's ``prediction`` and ``in_train`` (in place), and mark a listed training triple that
    is the test triple itself (``is_test_triple``) or its reverse, (tail, relation, head) (``is_reverse``)."""
    for e, p in zip(entries, preds, strict=True):
        e["prediction"] = p
        e["in_train"] = "train" in p["splits"]
        head, rel, tail = list(e["test_triple"])
        for key in ("proponents", "opponents", "pairs"):
            for row in e.get(key) or []:
                triple = list(row["train_triple"])
                if triple == [head, rel, tail]:
                    row["is_test_triple"] = True
                elif triple == [tail, rel, head]:
                    row["is_reverse"] = True


GLOBAL_TOP = 100        # pairs in the global lists when top_k is null
LIST_ALL_MAX_PAIRS = 100_000  # top_k null: every candidate listed in the result only up to this many pairs


@dataclass
class Plan:
    """What a TracIn request scores: the engine, and in mode test/single the encoded triples and candidates."""

    engine: ConvETracIn
    settings: dict
    test_ids: torch.Tensor
    train: torch.Tensor          # the training triples (ids) whose candidates are scored
    union: torch.Tensor          # candidate positions in ``train``: sorted, the union over test triples
    pairs: CandidatePairs | None  # per test triple, its candidate positions in ``union`` (None: all)


@dataclass(frozen=True)
class TracInOptions:
    """What a TracIn report computes (the library's defaults; the service fills them from its request): the mode,
    how many training triples each test triple lists, the checkpoints and their weights, the layers and loss
    whose gradients are compared, the exact or projected method and its precision, the candidate filter."""

    mode: str = "test"
    top_k: int | None = 10
    checkpoints: str | Sequence[str] = "all"
    layers: str | Sequence[str] = "all"
    loss: str = "train"
    projection_dim: int | None = None
    precision: str = "auto"
    batch_size: int = 256
    filter: FilterSpec | None = None
    method: str = "ghost"
    lr_weight: str = "last"


def plan(bundle: KGBundle, test_triples: Sequence[Sequence[str]] | None, options: TracInOptions | None = None,
         device: torch.device | str | None = None, **fields: Any) -> Plan:
    """Build the engine and the candidate set of a request (cheap: no scoring). ``options``, or its fields given
    as keywords (over ``options`` when both are)."""
    o = TracInOptions(**fields) if options is None else dataclasses.replace(options, **fields)
    mode, top_k, checkpoints, layers, loss = o.mode, o.top_k, o.checkpoints, o.layers, o.loss
    projection_dim, precision, batch_size, filter, method = o.projection_dim, o.precision, o.batch_size, o.filter, \
        o.method
    lr_weight = o.lr_weight
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if top_k is not None and top_k < 0:
        raise ValueError("top_k must be >= 0 or None")
    ds = bundle.dataset
    ckpts = bundle.checkpoints if checkpoints == "all" else [bundle.checkpoint(str(c)) for c in checkpoints]
    weights = checkpoint_weights(bundle, ckpts, lr_weight)
    engine = ConvETracIn(bundle.model, ckpts, layers=layers, loss=loss, method=method, precision=precision,
                    projection_dim=projection_dim, batch_size=batch_size, device=device, weights=weights)
    test_ids = ds.encode(test_triples) if test_triples else torch.empty(0, 3, dtype=torch.long)
    if filter is not None and len(test_ids) == 0:
        raise ValueError("filter needs test_triples (it is centred on their head and tail)")
    if mode != "self" and len(test_ids) == 0:
        raise ValueError("test_triples is empty")
    settings = {"mode": mode, "estimator": "tracin", "approximate": projection_dim is not None, "top_k": top_k,
                "lr_weight": lr_weight,
                "checkpoints": [{"name": c.name, "epoch": c.epoch, "lr": c.lr, "weight": w}
                                for c, w in zip(ckpts, weights, strict=True)],
                "layers": list(engine.names), "loss": loss, "projection_dim": projection_dim,
                "seed": engine.gradients.seed if projection_dim is not None else None, "damping": None,
                "precision": engine.precision, "requested_precision": engine.requested_precision,
                "warnings": list(engine.warnings), "method": method,
                "filter": None if filter is None else dict(filter.__dict__)}
    train = ds.train
    pairs = None
    if filter is None:
        union = torch.arange(len(train))
    else:
        adj = AdjacencyIndex(train, len(ds.entities))
        cand = [adj.candidates([int(row[0]), int(row[2])], filter.n_hops, filter.min_degree,
                               filter.preserve_test_entities) for row in test_ids]
        union = torch.unique(torch.cat(cand)) if cand else torch.empty(0, dtype=torch.long)
        if mode == "test":
            pairs = CandidatePairs.from_columns([torch.searchsorted(union, c) for c in cand], len(union))
    return Plan(engine, settings, test_ids, train, union, pairs)


def score_self(p: Plan, bundle: KGBundle, start: int = 0, end: int | None = None,
               progress: Callable[[int, int], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Self-influence of candidates ``[start, end)``: ``(train indices, values)``."""
    idx = p.union[start:end]
    si = p.engine.self_influence(p.train[idx], progress=progress)
    _check_finite(bundle.dataset, p.train[idx], si, "self-influence")
    return idx, si


def score_test(p: Plan, bundle: KGBundle, top_k: int | None, start: int = 0, end: int | None = None,
               progress: Callable[[int, int], None] | None = None, dense: Any = None,
               list_all: bool = True, test_cache: dict | None = None) -> list[dict]:
    """Entries (per test triple) over candidates ``[start, end)`` of the union, streaming (bounded memory).

    ``top_k`` None: ``dense`` (an ``[n_test, end - start]`` array) receives every score, and with ``list_all``
    every candidate is listed (read back from it); otherwise the running top-k per test triple is all that is kept.
    ``test_cache``: kept by the caller across ranges of one request, it holds the test triples' factors
    (``TracIn.top_influence``).
    """
    ds = bundle.dataset
    end = len(p.union) if end is None else end
    cols = p.union[start:end]
    pairs = None if p.pairs is None else p.pairs.columns(start, end)
    k = 0 if top_k is None else top_k
    try:
        top = p.engine.top_influence(p.test_ids, p.train[cols], k, candidates=pairs, progress=progress, dense=dense,
                                     test_cache=test_cache)
    except NonFiniteScores as exc:
        raise_non_finite(ds, exc, p.test_ids, p.train[cols])
    names = ds.decode(p.test_ids)
    entries = []
    train_names: dict[int, list[str]] = {}

    def train_name(j: int) -> list[str]:
        if j not in train_names:
            train_names[j] = ds.decode(p.train[j:j + 1])[0]
        return train_names[j]

    for i, te in enumerate(names):
        entry: dict = {"test_triple": te, "self_influence": float(top.test_self[i]),
                       "n_candidates": int(top.n_candidates[i]), "n_positive": int(top.n_positive[i]),
                       "n_negative": int(top.n_negative[i])}
        if top_k is None:
            if dense is not None and list_all:
                row = torch.from_numpy(dense[i])
                entry["proponents"], entry["opponents"] = ([
                    _pair_entry(int(cols[c]), float(row[c]), None, train_name) for c in _ranked(row, None, pos)]
                    for pos in (True, False))
        else:
            for key, positive in (("proponents", True), ("opponents", False)):
                entry[key] = [_pair_entry(int(cols[c]), v, sf, train_name) for c, v, sf in top.listed(i, positive)]
        entries.append(entry)
    if top_k is not None:
        add_breakdown(p, entries)
    if top_k is None and dense is not None and list_all:  # train self-influence of the listed triples
        listed = sorted({e["train_index"] for t in entries for key in ("proponents", "opponents")
                         for e in t.get(key, [])})
        if listed:
            si = p.engine.self_influence(p.train[torch.tensor(listed)])
            by = dict(zip(listed, si.tolist(), strict=True))
            for t in entries:
                for key in ("proponents", "opponents"):
                    for e in t.get(key, []):
                        e["train_self_influence"] = by[e["train_index"]]
    return entries


def add_breakdown(p: Plan, entries: list[dict]) -> None:
    """Give each listed pair of ``entries`` (score_test's, with ``train_index``) its ``breakdown``: the score per
    checkpoint (in the order of the result's ``checkpoints``) and per layer group (``ConvETracIn.breakdown``), each
    summing to the pair's influence. In place."""
    rows, cols, refs = [], [], []
    for i, entry in enumerate(entries):
        for key in ("proponents", "opponents"):
            for row in entry.get(key) or []:
                rows.append(i)
                cols.append(row["train_index"])
                refs.append(row)
    if not refs:
        return
    per_ck, per_group, labels = p.engine.breakdown(p.test_ids[torch.tensor(rows)], p.train[torch.tensor(cols)])
    for row, ck, groups in zip(refs, per_ck.tolist(), per_group.tolist(), strict=True):
        row["breakdown"] = {"checkpoints": ck, "layers": dict(zip(labels, groups, strict=True))}


def _pair_entry(j: int, value: float, self_inf: float | None, train_name: Callable[[int], list[str]]) -> dict:
    return {"train_triple": train_name(j), "influence": value, "train_self_influence": self_inf,
            "train_index": j}


def pair_count(p: Plan) -> int:
    """How many (test, candidate) pairs mode ``test`` scores."""
    return len(p.test_ids) * len(p.union) if p.pairs is None else len(p.pairs.rows)


RESULTS_INLINE = 200  # test triples whose entries a service result lists (every one is in results.jsonl)
RANKING_INLINE = LIST_ALL_MAX_PAIRS  # self-influence rows a result lists at most (all in self_influence.jsonl)


class TestReport:
    """The report of modes ``test`` and ``single``, fed each test triple's entry in test order (its lists as
    scored, with each training triple's ``train_index``): the global top pairs, each entry finished (public form,
    the model's own prediction, the test triple itself marked when listed), ``results.jsonl`` and
    ``influence.csv`` under ``out_dir``, and the first ``inline`` entries for the result (every one, and the CSV
    rows in memory, without ``out_dir``)."""

    def __init__(self, bundle: KGBundle, test_ids: torch.Tensor, top_k: int | None, out_dir: Path | None = None,
                 inline: int = RESULTS_INLINE) -> None:
        self.ds = bundle.dataset
        self.top_k = top_k
        self.preds = predictions(bundle, test_ids)
        self.best = GlobalTop(GLOBAL_TOP if top_k is None else top_k)
        self.out_dir = out_dir
        self.inline = inline if out_dir is not None else None
        self.results: list[dict] = []
        self.rows: list[dict] = []
        self.n = 0
        self._jsonl = self._csv = None
        if out_dir is not None:
            self._jsonl = open(out_dir / "results.jsonl", "w", encoding="utf-8")  # noqa: SIM115 (closed in finish)
            self._csv_fh = open(out_dir / "influence.csv", "w", newline="", encoding="utf-8")  # noqa: SIM115
            self._csv = TableWriter(self._csv_fh, CSV_COLUMNS)

    def add(self, entry: dict) -> None:
        t = self.n
        self.best.add(t, entry)
        public = finish_entry(entry, self.top_k)
        add_predictions([public], self.preds[t:t + 1])
        rows = entry_csv_rows(self.ds, public)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(public) + "\n")
            self._csv.rows(rows)
        else:
            self.rows += rows
        if self.inline is None or len(self.results) < self.inline:
            self.results.append(public)
        self.n += 1

    def finish(self) -> dict:
        """The result's fields: ``n_test``, ``results`` (inline), ``listed``, ``top_proponents``,
        ``top_opponents``."""
        if self._jsonl is not None:
            self._jsonl.close()
            self._csv_fh.close()
        return {"n_test": self.n, "results": self.results, **self.best.result(),
                "listed": {"results": {"total": self.n, "inline": len(self.results),
                                       "artifact": "results.jsonl" if self.out_dir is not None else None}}}


def self_report(ds, train: torch.Tensor, idx: torch.Tensor, si: torch.Tensor, top_k: int | None,
                out_dir: Path | None = None) -> tuple[dict, list[dict]]:
    """The report of mode ``self`` from the candidates' self-influence (``train[idx]``, values ``si``): ranked
    largest first, ties in training order; the strongest ``top_k`` (every one when None, at most
    ``RANKING_INLINE``) listed, in ``influence.csv`` too; the whole ranking in ``self_influence.jsonl`` under
    ``out_dir``. Returns the result's fields and the listed rows' CSV rows."""
    order = torch.argsort(si, descending=True, stable=True)
    shown = len(order) if top_k is None else min(top_k, len(order))
    notes = []
    if shown > RANKING_INLINE:
        notes.append(f"{shown} ranked triples; the first {RANKING_INLINE} are listed here, all of them in "
                     "self_influence.jsonl")
        shown = RANKING_INLINE
    keep = order[:shown]
    ranking = [{"train_triple": n, "self_influence": float(si[k])}
               for n, k in zip(ds.decode(train[idx[keep]]), keep.tolist(), strict=True)]
    rows = [csv_row(ds, None, r["train_triple"], "", r["self_influence"], "self") for r in ranking]
    if out_dir is not None:
        with open(out_dir / "self_influence.jsonl", "w", encoding="utf-8") as fh:
            for c in range(0, len(order), 65_536):
                part = order[c:c + 65_536]
                for name, value in zip(ds.decode(train[idx[part]]), si[part].tolist(), strict=True):
                    fh.write(json.dumps({"train_triple": name, "self_influence": value}) + "\n")
        write_csv(rows, out_dir / "influence.csv")
    return {"n_test": 0, "ranking": ranking, "notes": notes,
            "listed": {"ranking": {"total": len(order), "inline": len(ranking),
                                   "artifact": "self_influence.jsonl" if out_dir is not None else None}}}, rows


def dense_fields(n_test: int, n_cols: int, n_pairs: int, artifact: str | None) -> dict:
    """The fields of a ``top_k: null`` report: where every score is, and a note when the lists leave it out."""
    out: dict = {"notes": []}
    if artifact is not None:
        out["scores"] = {"artifact": artifact, "shape": [n_test, n_cols], "rows": "test_triples in request order",
                         "columns": "candidates.tsv"}
    if n_pairs > LIST_ALL_MAX_PAIRS:
        out["notes"].append(f"top_k null asks for all {n_pairs} scores, more than the {LIST_ALL_MAX_PAIRS} listed "
                            "in a result: they are in the scores artifact")
    return out


def tracin_report(bundle: KGBundle, test_triples: Sequence[Sequence[str]] | None,
                  train_triples: Sequence[Sequence[str]] | None = None, options: TracInOptions | None = None, *,
                  device: torch.device | str | None = None, progress: ProgressFn | None = None,
                  out_dir: Path | None = None, **fields: Any) -> tuple[dict, list[dict]]:
    """Run TracIn on ``bundle`` (``options``, or :class:`TracInOptions`' fields as keywords); returns ``(result,
    csv_rows)``. Names are looked up in the bundle's vocabularies. ``train_triples``: mode ``single``'s.

    Mode ``test`` streams over the candidates (memory does not grow with test × train). With ``top_k`` None every
    score is kept: in ``out_dir/scores.npy`` (``[n_test, n_candidates]``, NaN where a column is not that test
    triple's candidate; its columns in ``candidates.tsv``) or, without ``out_dir``, in memory; the per-triple
    lists then hold every candidate when there are at most ``LIST_ALL_MAX_PAIRS`` pairs.
    """
    return report(plan(bundle, test_triples, options, device, **fields), bundle, train_triples, progress, out_dir)


def report(p: Plan, bundle: KGBundle, train_triples: Sequence[Sequence[str]] | None = None,
           progress: ProgressFn | None = None, out_dir: Path | None = None) -> tuple[dict, list[dict]]:
    """``tracin_report`` for an already built ``plan``: the result's fields (the plan's settings, the mode's
    report, ``n_candidates``, ``seconds``) and the CSV rows (empty when written under ``out_dir``)."""
    mode, top_k = p.settings["mode"], p.settings["top_k"]
    ds = bundle.dataset
    t0 = time.perf_counter()

    def prog(done: int, total: int) -> None:
        if progress is not None:
            progress(done, total, f"{mode}: batch {done}/{total}")

    if mode == "self":
        idx, si = score_self(p, bundle, progress=prog)
        fields, rows = self_report(ds, p.train, idx, si, top_k, out_dir)
        return {**p.settings, **fields, "n_candidates": len(p.union), "seconds": time.perf_counter() - t0}, rows

    engine, test_ids = p.engine, p.test_ids
    out = TestReport(bundle, test_ids, top_k, out_dir)
    if mode == "single":
        if not train_triples:
            raise ValueError("mode 'single' needs train_triples")
        tr_ids = ds.encode(train_triples)
        scores, test_self, tr_self = engine.influence(test_ids, tr_ids, progress=prog, train_self=True)
        _check_finite(ds, test_ids, torch.cat([scores, test_self[:, None]], 1), "influence")
        _check_finite(ds, tr_ids, torch.cat([scores.t(), tr_self[:, None]], 1), "influence")
        tr_names = ds.decode(tr_ids)
        for i, te in enumerate(ds.decode(test_ids)):
            pairs = [{"train_triple": tr_names[j], "influence": float(scores[i, j]),
                      "train_self_influence": float(tr_self[j])} for j in range(len(tr_ids))]
            out.add({"test_triple": te, "self_influence": float(test_self[i]), "pairs": pairs,
                     "n_candidates": len(tr_ids)})
        return {**p.settings, **out.finish(), "n_candidates": len(tr_ids),
                "seconds": time.perf_counter() - t0}, out.rows

    # mode == "test": every test triple against its candidates, streamed
    dense = None
    n_pairs = pair_count(p)
    extra: dict = {"notes": []}
    if top_k is None:
        import numpy as np

        shape = (len(test_ids), len(p.union))
        dense = (np.lib.format.open_memmap(out_dir / "scores.npy", mode="w+", dtype=np.float32, shape=shape)
                 if out_dir is not None else np.zeros(shape, dtype=np.float32))
        extra = dense_fields(*shape, n_pairs, "scores.npy" if out_dir is not None else None)
    entries = score_test(p, bundle, top_k, progress=prog, dense=dense, list_all=n_pairs <= LIST_ALL_MAX_PAIRS)
    if dense is not None and out_dir is not None:
        dense.flush()
        write_candidates(ds, p.train, p.union, out_dir / "candidates.tsv")
    for e in entries:
        out.add(e)
    return {**p.settings, **out.finish(), **extra, "n_candidates": len(p.union),
            "seconds": time.perf_counter() - t0}, out.rows


def write_candidates(ds, train: torch.Tensor, union: torch.Tensor, path: Path) -> None:
    """The scores artifact's columns: one candidate training triple per line (head, relation, tail)."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = TableWriter(fh, delimiter="\t", lineterminator="\n")
        for i in range(0, len(union), 65_536):
            out.rows(ds.decode(train[union[i:i + 65_536]]))


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        TableWriter(fh, CSV_COLUMNS).rows(rows)
