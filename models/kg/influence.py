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

A NaN or infinite score fails the report (``NonFiniteError`` naming the triples); it is never dropped.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from models.common import NonFiniteError
from models.explain.tracin import LR_WEIGHTS, TracIn, interval_weights
from models.kg.checkpoint import KGBundle
from models.kg.graph import AdjacencyIndex

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
        names = ds.decode(triples[bad])
        shown = ", ".join("(" + ", ".join(t) + ")" for t in names[:10])
        more = f" and {len(names) - 10} more" if len(names) > 10 else ""
        raise NonFiniteError(f"non-finite {what} for {len(names)} triple(s): {shown}{more}", names)


def tracin_report(bundle: KGBundle, test_triples: Sequence[Sequence[str]] | None, mode: str = "test",
                  top_k: int | None = 10, checkpoints: str | Sequence[str] = "all",
                  layers: str | Sequence[str] = "all", loss: str = "train", projection_dim: int | None = None,
                  precision: str = "auto", batch_size: int = 256, filter: FilterSpec | None = None,
                  train_triples: Sequence[Sequence[str]] | None = None, method: str = "ghost",
                  device: torch.device | str | None = None, lr_weight: str = "last",
                  progress: ProgressFn | None = None) -> tuple[dict, list[dict]]:
    """Run TracIn on ``bundle``; returns ``(result, csv_rows)``. Names are looked up in the bundle's vocabularies."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if top_k is not None and top_k < 0:
        raise ValueError("top_k must be >= 0 or None")
    ds = bundle.dataset
    ckpts = bundle.checkpoints if checkpoints == "all" else [bundle.checkpoint(str(c)) for c in checkpoints]
    weights = checkpoint_weights(bundle, ckpts, lr_weight)
    engine = TracIn(bundle.model, ckpts, layers=layers, loss=loss, method=method, precision=precision,
                    projection_dim=projection_dim, batch_size=batch_size, device=device, weights=weights)
    test_ids = ds.encode(test_triples) if test_triples else torch.empty(0, 3, dtype=torch.long)
    train = ds.train
    t0 = time.perf_counter()
    if filter is not None and len(test_ids) == 0:
        raise ValueError("filter needs test_triples (it is centred on their head and tail)")
    adj = AdjacencyIndex(train, len(ds.entities)) if filter is not None else None

    def cands(row: torch.Tensor) -> torch.Tensor:
        if adj is None:
            return torch.arange(len(train))
        assert filter is not None
        return adj.candidates([int(row[0]), int(row[2])], filter.n_hops, filter.min_degree,
                              filter.preserve_test_entities)

    def prog(done: int, total: int) -> None:
        if progress is not None:
            progress(done, total, f"{mode}: batch {done}/{total}")

    def label_cols(prefix: str, trip: Sequence[str] | None) -> dict:
        if trip is None:
            return {f"{prefix}HeadLabel": "", f"{prefix}RelLabel": "", f"{prefix}TailLabel": ""}
        return {f"{prefix}HeadLabel": ds.entity_label(trip[0]), f"{prefix}RelLabel": ds.relation_label(trip[1]),
                f"{prefix}TailLabel": ds.entity_label(trip[2])}

    def csv_row(test: Sequence[str] | None, tr: Sequence[str], score: float | str, self_inf: float,
                role: str) -> dict:
        te = test if test is not None else ("", "", "")
        return {"TestHead": te[0], "TestRel": te[1], "TestTail": te[2], "TrainHead": tr[0], "TrainRel": tr[1],
                "TrainTail": tr[2], "TracInScore": score, "SelfInfluence": self_inf, "Role": role,
                **label_cols("Test", test), **label_cols("Train", tr)}

    rows: list[dict] = []
    settings = {"mode": mode, "top_k": top_k, "lr_weight": lr_weight,
                "checkpoints": [{"name": c.name, "epoch": c.epoch, "lr": c.lr, "weight": w}
                                for c, w in zip(ckpts, weights, strict=True)],
                "layers": list(engine.names), "loss": loss, "projection_dim": projection_dim,
                "precision": engine.precision, "method": method,
                "filter": None if filter is None else filter.__dict__}
    if mode == "self":
        if adj is not None:
            idx = torch.unique(torch.cat([cands(row) for row in test_ids]))
        else:
            idx = torch.arange(len(train))
        si = engine.self_influence(train[idx], progress=prog)
        _check_finite(ds, train[idx], si, "self-influence")
        order = torch.argsort(si, descending=True, stable=True)
        keep = order if top_k is None else order[:top_k]
        names = ds.decode(train[idx[keep]])
        ranking = [{"train_triple": n, "self_influence": float(si[k])} for n, k in zip(names, keep.tolist(),
                                                                                      strict=True)]
        rows = [csv_row(None, r["train_triple"], "", r["self_influence"], "self") for r in ranking]
        result = {**settings, "n_candidates": len(idx), "returned": len(ranking), "ranking": ranking,
                  "seconds": time.perf_counter() - t0}
        return result, rows

    if len(test_ids) == 0:
        raise ValueError("test_triples is empty")
    if mode == "single":
        if not train_triples:
            raise ValueError("mode 'single' needs train_triples")
        tr_ids = ds.encode(train_triples)
        scores, test_self, tr_self = engine.influence(test_ids, tr_ids, progress=prog, train_self=True)
        _check_finite(ds, test_ids, torch.cat([scores, test_self[:, None]], 1), "influence")
        _check_finite(ds, tr_ids, torch.cat([scores.t(), tr_self[:, None]], 1), "influence")
        tr_names = ds.decode(tr_ids)
        per_test = []
        for i, te in enumerate(ds.decode(test_ids)):
            pairs = [{"train_triple": tr_names[j], "influence": float(scores[i, j]),
                      "train_self_influence": float(tr_self[j])} for j in range(len(tr_ids))]
            rows += [csv_row(te, p["train_triple"], p["influence"], p["train_self_influence"], "single")
                     for p in pairs]
            per_test.append({"test_triple": te, "self_influence": float(test_self[i]), "pairs": pairs,
                             "n_candidates": len(tr_ids)})
        return {**settings, "results": per_test, "seconds": time.perf_counter() - t0}, rows

    # mode == "test": score the union of candidates once, then rank per test triple
    cand = [cands(row) for row in test_ids]
    union = torch.unique(torch.cat(cand)) if cand else torch.empty(0, dtype=torch.long)
    pos_in_union = torch.full((len(train),), -1, dtype=torch.long)
    pos_in_union[union] = torch.arange(len(union))
    scores, test_self, tr_self = engine.influence(test_ids, train[union], progress=prog, train_self=True)
    _check_finite(ds, test_ids, torch.cat([scores, test_self[:, None]], 1), "influence")
    _check_finite(ds, train[union], torch.cat([scores.t(), tr_self[:, None]], 1), "influence")
    per_test = []
    for i, te in enumerate(ds.decode(test_ids)):
        cols = pos_in_union[cand[i]]
        s = scores[i, cols]
        entry: dict = {"test_triple": te, "self_influence": float(test_self[i]), "n_candidates": len(cols),
                       "n_positive": int((s > 0).sum()), "n_negative": int((s < 0).sum())}
        for key, positive in (("proponents", True), ("opponents", False)):
            picked = _ranked(s, top_k, positive)
            names = ds.decode(train[union[cols[picked]]]) if picked else []
            entry[key] = [{"train_triple": n, "influence": float(s[p]), "train_self_influence":
                           float(tr_self[cols[p]])} for n, p in zip(names, picked, strict=True)]
            rows += [csv_row(te, e["train_triple"], e["influence"], e["train_self_influence"], key[:-1])
                     for e in entry[key]]
        entry["truncated"] = (top_k is not None and (entry["n_positive"] > top_k or entry["n_negative"] > top_k))
        per_test.append(entry)
    return {**settings, "results": per_test, "n_candidates_scored": len(union),
            "seconds": time.perf_counter() - t0}, rows


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        w.writeheader()
        w.writerows(rows)
