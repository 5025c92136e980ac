"""Image data for Vision-BDH: digits, CIFAR pickle directories (real format, generated), splits, augmentation."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from models.vision.data import (
    DatasetNotFoundError,
    EpochSampler,
    ImageDataset,
    load_arrays,
    make_loaders,
    random_resized_crop_params,
    split_indices,
)


def write_cifar_dir(root: Path, dataset: str = "cifar10", per_batch: int = 20, seed: int = 0) -> Path:
    """Write a tiny dataset in the official python-pickle layout (protocol 2, bytes keys, uint8 rows of 3072)."""
    rng = np.random.default_rng(seed)
    n_classes = 10 if dataset == "cifar10" else 100
    directory = root / ("cifar-10-batches-py" if dataset == "cifar10" else "cifar-100-python")
    directory.mkdir(parents=True, exist_ok=True)

    def batch(n: int, name: str) -> dict:
        labels = [int(v) for v in rng.integers(0, n_classes, n)]
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        # Make the label visible in the red channel so tiny models can learn it.
        data[:, :1024] = (np.array(labels, dtype=np.int64)[:, None] * (255 // n_classes)).astype(np.uint8)
        out = {b"batch_label": name.encode(), b"data": data, b"filenames": [f"{i}.png".encode() for i in range(n)]}
        if dataset == "cifar10":
            out[b"labels"] = labels
        else:
            out[b"fine_labels"] = labels
            out[b"coarse_labels"] = [v // 5 for v in labels]
        return out

    def dump(obj: dict, name: str) -> None:
        with open(directory / name, "wb") as fh:
            pickle.dump(obj, fh, protocol=2)

    if dataset == "cifar10":
        for i in range(1, 6):
            dump(batch(per_batch, f"training batch {i} of 5"), f"data_batch_{i}")
        dump(batch(per_batch, "testing batch 1 of 1"), "test_batch")
        dump({b"label_names": [f"class{i}".encode() for i in range(10)], b"num_cases_per_batch": per_batch},
             "batches.meta")
    else:
        dump(batch(per_batch * 5, "training"), "train")
        dump(batch(per_batch, "testing"), "test")
        dump({b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
              b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)]}, "meta")
    return directory


def test_digits_are_32x32_rgb_with_a_fixed_test_split() -> None:
    data = load_arrays("digits")
    assert data.train_images.shape[1:] == (3, 32, 32) and data.train_images.dtype == torch.uint8
    assert len(data.train_labels) + len(data.test_labels) == 1797
    assert len(data.test_labels) == 359
    assert torch.equal(data.train_images[:, 0], data.train_images[:, 2])  # gray repeated to RGB
    assert data.train_images.max() > 200 and not data.allow_flip
    again = load_arrays("digits")
    assert torch.equal(again.test_labels, data.test_labels)


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_cifar_pickle_directory(tmp_path: Path, dataset: str) -> None:
    directory = write_cifar_dir(tmp_path, dataset)
    for where in (tmp_path, directory):  # the parent or the batch directory itself
        data = load_arrays(dataset, where)
        assert data.train_images.shape == (100, 3, 32, 32) and data.test_images.shape == (20, 3, 32, 32)
        assert data.num_classes == (10 if dataset == "cifar10" else 100)
        assert data.classes[3] == ("class3" if dataset == "cifar10" else "fine3")
    # the row layout is channel-major: the first 1024 bytes are the red plane
    with open(directory / ("data_batch_1" if dataset == "cifar10" else "train"), "rb") as fh:
        raw = pickle.load(fh, encoding="bytes")
    assert torch.equal(data.train_images[0], torch.from_numpy(raw[b"data"][0].reshape(3, 32, 32)))


def test_missing_cifar_says_where_to_put_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="cifar-10-batches-py/data_batch_1") as info:
        load_arrays("cifar10", tmp_path / "nowhere")
    assert "cifar-10-python.tar.gz" in str(info.value)
    with pytest.raises(DatasetNotFoundError, match="data_dir"):
        load_arrays("cifar100", None)
    with pytest.raises(ValueError, match="unknown dataset"):
        load_arrays("imagenet")


def test_incomplete_cifar_dir_lists_missing_files(tmp_path: Path) -> None:
    directory = write_cifar_dir(tmp_path, "cifar10")
    (directory / "data_batch_4").unlink()
    with pytest.raises(DatasetNotFoundError, match="data_batch_4"):
        load_arrays("cifar10", directory)


def test_dataset_pickles_cannot_run_code(tmp_path: Path) -> None:
    directory = write_cifar_dir(tmp_path, "cifar10")

    class Evil:
        def __reduce__(self):  # noqa: ANN204
            return (print, ("owned",))

    with open(directory / "test_batch", "wb") as fh:
        pickle.dump({b"data": Evil(), b"labels": []}, fh)
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        load_arrays("cifar10", directory)


def test_split_is_seeded_and_disjoint() -> None:
    a_train, a_val = split_indices(100, 0.2, seed=3)
    b_train, b_val = split_indices(100, 0.2, seed=3)
    c_train, c_val = split_indices(100, 0.2, seed=4)
    assert torch.equal(a_val, b_val) and not torch.equal(a_val, c_val)
    assert len(a_val) == 20 and set(a_train.tolist()).isdisjoint(a_val.tolist())
    assert sorted(a_train.tolist() + a_val.tolist()) == list(range(100))


def test_sampler_depends_only_on_seed_and_epoch() -> None:
    s1, s2 = EpochSampler(50, seed=1), EpochSampler(50, seed=1)
    s1.set_epoch(3)
    s2.set_epoch(3)
    assert list(s1) == list(s2)
    s2.set_epoch(4)
    assert list(s1) != list(s2)
    assert sorted(i for i, _ in s1) == list(range(50))
    assert list(EpochSampler(4, shuffle=False)) == [(0, -1), (1, -1), (2, -1), (3, -1)]


def test_augmentation_is_deterministic_per_seed_and_in_range() -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        top, left, h, w = random_resized_crop_params(g, 32, (0.8, 1.0), (3 / 4, 4 / 3))
        assert 0 <= top <= 32 - h and 0 <= left <= 32 - w
        assert 0.8 * 1024 * 0.9 <= h * w <= 1024  # area within the scale range (up to rounding)
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    ds = ImageDataset(images, torch.arange(4), torch.zeros(3), torch.ones(3), augment=True)
    x1, _ = ds[(1, 123)]
    x2, _ = ds[(1, 123)]
    x3, _ = ds[(1, 124)]
    plain, _ = ds[(1, -1)]
    assert torch.equal(x1, x2) and not torch.equal(x1, x3)
    torch.testing.assert_close(plain, images[1].float() / 255.0)
    # without flips, no seed produces a mirrored image of a left-right asymmetric input
    ramp = torch.arange(32, dtype=torch.uint8).mul(8).expand(1, 3, 32, 32).contiguous()
    no_flip = ImageDataset(ramp, torch.zeros(1, dtype=torch.long), torch.zeros(3), torch.ones(3), True, flip=False)
    assert all(no_flip[(0, s)][0][0, 0, -1] > no_flip[(0, s)][0][0, 0, 0] for s in range(20))


def test_make_loaders_normalises_and_limits(tmp_path: Path) -> None:
    data = load_arrays("cifar10", write_cifar_dir(tmp_path, "cifar10"))
    loaders = make_loaders(data, batch_size=16, val_fraction=0.2, seed=0, max_train_samples=50)
    assert (loaders.n_train, loaders.n_val, loaders.n_test) == (50, 20, 20)
    images, labels = next(iter(loaders.train))
    assert images.shape == (16, 3, 32, 32) and images.dtype == torch.float32 and labels.dtype == torch.int64
    val = torch.cat([x for x, _ in loaders.val])
    assert val.shape[0] == 20
