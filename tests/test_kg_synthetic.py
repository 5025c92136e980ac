"""The FB15k-237-shaped synthetic graph: exact counts, no leakage between splits, skewed degrees, determinism."""

from __future__ import annotations

import collections
import filecmp

from models.kg.synthetic import generate
from models.kg.triples import load_triples_dir

SMALL = {"entities": 1500, "relations": 40, "train": 20000, "valid": 1000, "test": 1200}


def test_counts_splits_and_skew(tmp_path):
    counts = generate(tmp_path / "a", seed=3, **SMALL)
    assert counts == SMALL
    ds = load_triples_dir(tmp_path / "a")
    assert len(ds.entities) == SMALL["entities"] and len(ds.relations) == SMALL["relations"]
    splits = {s: {tuple(r) for r in (tmp_path / "a" / f"{s}.txt").read_text().splitlines()} for s in
              ("train", "valid", "test")}
    assert not (splits["train"] & splits["valid"]) and not (splits["train"] & splits["test"])
    train_rows = [line.split("\t") for line in (tmp_path / "a" / "train.txt").read_text().splitlines()]
    assert len({tuple(r) for r in train_rows}) == len(train_rows)  # no duplicate triple
    names = {e for h, _, t in train_rows for e in (h, t)}
    for split in ("valid", "test"):
        for line in (tmp_path / "a" / f"{split}.txt").read_text().splitlines():
            h, _, t = line.split("\t")
            assert h in names and t in names
    degree = collections.Counter(e for h, _, t in train_rows for e in (h, t))
    values = sorted(degree.values())
    assert values[-1] > 8 * values[len(values) // 2]  # hubs, as in FB15k-237


def test_same_seed_same_files(tmp_path):
    generate(tmp_path / "a", seed=1, **SMALL)
    generate(tmp_path / "b", seed=1, **SMALL)
    generate(tmp_path / "c", seed=2, **SMALL)
    assert filecmp.cmp(tmp_path / "a" / "train.txt", tmp_path / "b" / "train.txt", shallow=False)
    assert not filecmp.cmp(tmp_path / "a" / "train.txt", tmp_path / "c" / "train.txt", shallow=False)
