"""A deterministic knowledge graph with FB15k-237's shape, in the triples-directory format.

FB15k-237 (Toutanova & Chen 2015) has 14,541 entities, 237 relations and 272,115 / 17,535 / 20,466 train / valid /
test triples. Its degrees are heavily skewed (a few hub entities such as countries take part in thousands of
triples, the median entity in about twenty) and so are its relation frequencies. The generator reproduces those
counts and that skew, and plants learnable structure so that a ConvE trained on it gets far above chance:

- every entity has a latent type (64 types of Zipf-distributed sizes); every relation maps a head type to one of a
  few tail types and prefers some tail entities within a type;
- entity popularity follows a Zipf law (exponent ``entity_skew``) and relation frequency another (``relation_skew``);
- a triple draws its relation, then a head by popularity among the relation's head types, then its tail from the
  relation's mapping of the head's type (``structure`` of the time) or from the relation's tail types at random.

Validation and test triples use only entities and relations seen in training, as in FB15k-237, and no triple appears
twice across the splits. Names are ``/m/e<id>`` and ``/r/r<id>`` so files look like the real ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

FB15K237 = {"entities": 14541, "relations": 237, "train": 272115, "valid": 17535, "test": 20466}


def _zipf_weights(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** exponent
    rng.shuffle(w)
    return w / w.sum()


def generate(
    out_dir: Path | str,
    seed: int = 0,
    entities: int = FB15K237["entities"],
    relations: int = FB15K237["relations"],
    train: int = FB15K237["train"],
    valid: int = FB15K237["valid"],
    test: int = FB15K237["test"],
    types: int = 64,
    entity_skew: float = 1.0,
    relation_skew: float = 1.1,
    structure: float = 0.8,
) -> dict[str, int]:
    """Write ``train.txt``, ``valid.txt``, ``test.txt`` and ``dataset_info.json`` into ``out_dir``; returns counts."""
    rng = np.random.default_rng(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    type_of = rng.choice(types, size=entities, p=_zipf_weights(types, 0.8, rng))
    popularity = _zipf_weights(entities, entity_skew, rng)
    members = [np.flatnonzero(type_of == t) for t in range(types)]
    members = [m if len(m) else rng.choice(entities, 1) for m in members]
    member_p = [popularity[m] / popularity[m].sum() for m in members]
    rel_p = _zipf_weights(relations, relation_skew, rng)
    # each relation: 1-3 head types, and a map head type -> tail type (its "meaning")
    head_types = [rng.choice(types, size=int(rng.integers(1, 4)), replace=False) for _ in range(relations)]
    tail_map = rng.integers(0, types, size=(relations, types))
    tail_types = [np.unique(tail_map[r, head_types[r]]) for r in range(relations)]

    total = int((train + valid + test) * 1.05)  # margin: held-out triples over unseen names are dropped
    seen: set[tuple[int, int, int]] = set()
    rows: list[tuple[int, int, int]] = []
    while len(rows) < total:
        n = int((total - len(rows)) * 1.3) + 1000
        rels = rng.choice(relations, size=n, p=rel_p)
        for r in np.unique(rels):
            k = int((rels == r).sum())
            ht = rng.choice(head_types[r], size=k)
            heads = np.empty(k, dtype=np.int64)
            tails = np.empty(k, dtype=np.int64)
            structured = rng.random(k) < structure
            for t in np.unique(ht):
                idx = np.flatnonzero(ht == t)
                heads[idx] = rng.choice(members[t], size=len(idx), p=member_p[t])
                tt = np.where(structured[idx], tail_map[r, t], rng.choice(tail_types[r], size=len(idx)))
                for u in np.unique(tt):
                    jdx = idx[tt == u]
                    tails[jdx] = rng.choice(members[u], size=len(jdx), p=member_p[u])
            for h, tl in zip(heads.tolist(), tails.tolist(), strict=True):
                trip = (h, int(r), tl)
                if h != tl and trip not in seen:
                    seen.add(trip)
                    rows.append(trip)
    rows = rows[:total]
    order = rng.permutation(len(rows))
    arr = np.asarray(rows, dtype=np.int64)[order]
    # every entity takes part in training at least once: one triple for each that the sampling missed, in place of
    # the last training triples (which move to the held-out pool)
    used = np.zeros(entities, dtype=bool)
    used[arr[:train, 0]] = True
    used[arr[:train, 2]] = True
    extra = []
    for e in np.flatnonzero(~used).tolist():
        candidates = [r for r in range(relations) if type_of[e] in head_types[r]] or list(range(relations))
        while True:
            r = int(rng.choice(candidates))
            u = int(tail_map[r, type_of[e]])
            t = int(rng.choice(members[u], p=member_p[u]))
            if t != e and (e, r, t) not in seen:
                seen.add((e, r, t))
                extra.append((e, r, t))
                break
    if extra:
        arr = np.concatenate([np.asarray(extra, dtype=np.int64), arr])
    train_rows, held = arr[:train], arr[train:]
    # held-out triples only over entities and relations seen in training (as in FB15k-237)
    ent_seen = np.zeros(entities, dtype=bool)
    ent_seen[train_rows[:, 0]] = True
    ent_seen[train_rows[:, 2]] = True
    rel_seen = np.zeros(relations, dtype=bool)
    rel_seen[train_rows[:, 1]] = True
    ok = ent_seen[held[:, 0]] & ent_seen[held[:, 2]] & rel_seen[held[:, 1]]
    held = held[ok]
    valid_rows, test_rows = held[:valid], held[valid:valid + test]
    for name, part in (("train", train_rows), ("valid", valid_rows), ("test", test_rows)):
        with open(out / f"{name}.txt", "w", encoding="utf-8") as fh:
            fh.writelines(f"/m/e{h}\t/r/r{r}\t/m/e{t}\n" for h, r, t in part.tolist())
    counts = {"entities": int(ent_seen.sum()), "relations": int(rel_seen.sum()), "train": len(train_rows),
              "valid": len(valid_rows), "test": len(test_rows)}
    (out / "dataset_info.json").write_text(json.dumps({
        "generator": "explainq models.kg.synthetic", "shape_of": "FB15k-237", "seed": seed, "synthetic": True,
        "counts": counts}, indent=1))
    return counts
