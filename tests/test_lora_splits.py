"""Splits without leakage: identical adapters are removed, groups stay on one side, corrected intervals."""

from __future__ import annotations

import csv
import shutil

import numpy as np
import pytest
import torch
from scipy import stats as st

from models.lora.data import LoraDataset, group_split
from models.lora.experiment import AblationConfig, make_splits, mean_ci, run_ablation
from models.lora.synthetic import generate_dataset

CPU = torch.device("cpu")


def _rewrite_labels(root, rows) -> None:  # noqa: ANN001
    with (root / "labels.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(list(rows[0]))
        writer.writerows(rows[1:])


def _rows(root) -> list[list[str]]:  # noqa: ANN001
    return list(csv.reader((root / "labels.csv").open()))


@pytest.fixture(scope="module")
def duplicated(tmp_path_factory) -> LoraDataset:
    """No class signal; every adapter listed twice (one row the same file, the copy a new file name)."""
    root = generate_dataset(tmp_path_factory.mktemp("dup") / "ds", num_classes=4, per_class=15, width_divisor=32,
                            max_blocks=2, signal=(), seed=3)
    rows = _rows(root)
    copies = []
    for i, (name, label) in enumerate(rows[1:]):
        if i % 2:
            copies.append([name, label])
        else:
            shutil.copyfile(root / name, root / f"copy_{name}")
            copies.append([f"copy_{name}", label])
    _rewrite_labels(root, rows + copies)
    return LoraDataset(root)


def test_duplicates_without_class_signal_stay_at_chance(duplicated: LoraDataset) -> None:
    cfg = AblationConfig(representations=["simple_stats"], layer_sets=["all"], num_runs=4, max_epochs=100,
                         patience=30, hidden_dim=128, batch_size=64)
    res = run_ablation(duplicated, cfg, CPU)
    assert res["num_listed"] == 120 and res["num_items"] == 60
    assert len(res["duplicates"]) == 60 and all(len(d["removed"]) == 1 for d in res["duplicates"])
    assert res["warnings"] and "60 duplicate adapter(s)" in res["warnings"][0]
    acc = res["results"]["all"]["simple_stats"]["test_acc"]["mean"]
    assert acc <= 0.45, acc  # chance 0.25; a probe that sees an adapter's twin in training scores ~0.7


def test_splits_hold_no_adapter_twice(duplicated: LoraDataset) -> None:
    splits, dups = make_splits(duplicated, AblationConfig(num_runs=3))
    digests = duplicated.content_digests()
    for s in splits:
        parts = [{digests[i] for i in getattr(s, k)} for k in ("train", "val", "test")]
        assert not (parts[0] & parts[1]) and not (parts[0] & parts[2]) and not (parts[1] & parts[2])
        assert sum(len(getattr(s, k)) for k in ("train", "val", "test")) == 60


def test_groups_stay_on_one_side(tmp_path) -> None:
    root = generate_dataset(tmp_path / "ds", num_classes=2, per_class=20, width_divisor=32, max_blocks=1, seed=4)
    rows = _rows(root)
    _rewrite_labels(root, [["file", "label", "group"]] + [[f, lab, f"g{i // 4}"] for i, (f, lab) in
                                                           enumerate(rows[1:])])
    ds = LoraDataset(root)
    groups = np.array(ds.groups)
    assert len(set(ds.groups)) == 10
    for k in range(5):
        s, _ = make_splits(ds, AblationConfig(num_runs=1, seed=k))
        (s,) = s
        sides = [set(groups[getattr(s, part)]) for part in ("train", "val", "test")]
        assert not (sides[0] & sides[1]) and not (sides[0] & sides[2]) and not (sides[1] & sides[2])
        assert set().union(*sides) == set(groups)
        for part in ("train", "test"):  # stratified: both classes on each side
            assert set(ds.labels[getattr(s, part)]) == {0, 1}
    # without groups it is the stratified split
    plain = group_split(ds.labels, [None] * len(ds), 7)
    from models.lora.data import stratified_split

    ref = stratified_split(ds.labels, 7)
    assert all(np.array_equal(getattr(plain, k), getattr(ref, k)) for k in ("train", "val", "test"))


def test_corrected_interval_is_nadeau_bengio() -> None:
    diffs = [0.10, 0.25, 0.05, 0.20, 0.15]
    n_train, n_test = 84, 24
    out = mean_ci(diffs, test_train_ratio=n_test / n_train)
    j = len(diffs)
    mean = sum(diffs) / j
    var = sum((d - mean) ** 2 for d in diffs) / (j - 1)
    t = st.t.ppf(0.975, j - 1)
    half = t * (var * (1 / j + n_test / n_train)) ** 0.5
    naive = t * (var / j) ** 0.5
    assert out["ci"] == pytest.approx([mean - half, mean + half])
    assert out["ci_naive"] == pytest.approx([mean - naive, mean + naive])
    assert out["ci"][1] - out["ci"][0] > out["ci_naive"][1] - out["ci_naive"][0]
    assert out["ci_method"] == "nadeau_bengio"


def test_adapter_digests_are_memoised(duplicated: LoraDataset, tmp_path, monkeypatch) -> None:
    import models.lora.data as D

    memo = tmp_path / "adapter_digests.json"
    first = LoraDataset(duplicated.root).content_digests(memo)
    assert memo.is_file() and first == duplicated.content_digests()
    monkeypatch.setattr(D, "_tensor_digest", lambda items: pytest.fail("re-read an unchanged adapter"))
    assert LoraDataset(duplicated.root).content_digests(memo) == first
