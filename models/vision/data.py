"""Image classification data for Vision-BDH: scikit-learn digits, CIFAR-10 and CIFAR-100.

Nothing is downloaded. ``digits`` is scikit-learn's bundled 8×8 handwritten digits (1797 images), upscaled to
32×32 RGB. CIFAR comes from the standard python-pickle batch directories (``cifar-10-batches-py`` with
``data_batch_1..5``/``test_batch``/``batches.meta``; ``cifar-100-python`` with ``train``/``test``/``meta``), read
with a restricted unpickler that only rebuilds numpy arrays and plain containers.

Augmentation is deterministic given ``(seed, epoch, sample)``: the :class:`EpochSampler` draws the order and one
seed per sample in the main process, and the dataset derives the crop and flip from that seed. This makes runs
reproducible with any number of DataLoader workers (persistent or not) and lets a resumed run see exactly the
batches the uninterrupted run would have seen.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

DATASETS = ("digits", "cifar10", "cifar100")
# Directory names of the official python-pickle archives (cifar-10-python.tar.gz, cifar-100-python.tar.gz).
DEFAULT_DIRS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}
# Hold-out of the digits data used as its test set: fixed, independent of the training seed.
DIGITS_TEST_FRACTION = 0.2
DIGITS_TEST_SEED = 20251122


class DatasetNotFoundError(FileNotFoundError):
    """A dataset directory or file is missing; the message says where to put it."""


@dataclass
class ImageArrays:
    """A dataset in memory: uint8 images ``[N, 3, H, W]`` and int64 labels."""

    name: str
    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    classes: list[str]
    # Horizontal flips change a digit's identity, so they are an augmentation only for natural images.
    allow_flip: bool = True

    @property
    def num_classes(self) -> int:
        return len(self.classes)


# -- loading -------------------------------------------------------------------------------------------------------


def load_digits_arrays() -> ImageArrays:
    """scikit-learn's 8×8 digits, bilinearly upscaled to 32×32 and repeated to RGB, with a fixed 20% test split."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.from_numpy(bunch.images.astype(np.float32) * (255.0 / 16.0)).unsqueeze(1)  # [N, 1, 8, 8]
    images = F.interpolate(images, size=(32, 32), mode="bilinear", align_corners=False)
    images = images.clamp(0, 255).round().to(torch.uint8).expand(-1, 3, -1, -1).contiguous()
    labels = torch.from_numpy(bunch.target.astype(np.int64))
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(DIGITS_TEST_SEED))
    n_test = int(round(DIGITS_TEST_FRACTION * len(labels)))
    test, train = order[:n_test], order[n_test:]
    return ImageArrays(
        name="digits",
        train_images=images[train],
        train_labels=labels[train],
        test_images=images[test],
        test_labels=labels[test],
        classes=[str(i) for i in range(10)],
        allow_flip=False,
    )


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickler that only rebuilds numpy arrays (the CIFAR batches hold a uint8 array and lists)."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        # Python 3 protocol-2 pickles rebuild the array's raw bytes with codecs.encode(str, "latin1").
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str):  # noqa: ANN201 - pickle API
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a dataset pickle")


def _read_pickle(path: Path) -> dict:
    with open(path, "rb") as fh:
        data = _ArrayUnpickler(fh, encoding="bytes").load()
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in data.items()}


def _decode_names(names: list) -> list[str]:
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


def resolve_cifar_dir(dataset: str, data_dir: str | Path) -> Path:
    """The batch directory itself, or ``data_dir/<official name>`` when ``data_dir`` is its parent."""
    root = Path(data_dir)
    marker = "data_batch_1" if dataset == "cifar10" else "train"
    if (root / marker).is_file():
        return root
    nested = root / DEFAULT_DIRS[dataset]
    if (nested / marker).is_file():
        return nested
    archive = "cifar-10-python.tar.gz" if dataset == "cifar10" else "cifar-100-python.tar.gz"
    raise DatasetNotFoundError(
        f"{dataset} not found: expected {root / marker} or {nested / marker}. Download {archive} from "
        f"https://www.cs.toronto.edu/~kriz/cifar.html on a machine with internet access and extract it under "
        f"{root} so that {nested / marker} exists (nothing is downloaded at run time)."
    )


def _to_images(flat: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(flat, dtype=np.uint8).reshape(-1, 3, 32, 32))


def load_cifar_arrays(dataset: str, data_dir: str | Path) -> ImageArrays:
    """CIFAR-10 or CIFAR-100 (fine labels) from the official python-pickle batches."""
    root = resolve_cifar_dir(dataset, data_dir)
    if dataset == "cifar10":
        train_files = [root / f"data_batch_{i}" for i in range(1, 6)]
        test_file, meta_file, label_key, names_key = root / "test_batch", root / "batches.meta", "labels", "label_names"
    else:
        train_files = [root / "train"]
        test_file, meta_file, label_key, names_key = root / "test", root / "meta", "fine_labels", "fine_label_names"
    missing = [p for p in (*train_files, test_file, meta_file) if not p.is_file()]
    if missing:
        raise DatasetNotFoundError(f"{dataset} directory {root} is incomplete: missing {', '.join(map(str, missing))}")
    batches = [_read_pickle(p) for p in train_files]
    test = _read_pickle(test_file)
    classes = _decode_names(_read_pickle(meta_file)[names_key])
    return ImageArrays(
        name=dataset,
        train_images=torch.cat([_to_images(b["data"]) for b in batches]),
        train_labels=torch.tensor([y for b in batches for y in b[label_key]], dtype=torch.int64),
        test_images=_to_images(test["data"]),
        test_labels=torch.tensor(list(test[label_key]), dtype=torch.int64),
        classes=classes,
    )


def load_arrays(dataset: str, data_dir: str | Path | None = None) -> ImageArrays:
    """Load ``digits``, ``cifar10`` or ``cifar100``; CIFAR needs ``data_dir``."""
    if dataset == "digits":
        return load_digits_arrays()
    if dataset in DEFAULT_DIRS:
        if data_dir is None:
            raise DatasetNotFoundError(f"{dataset} needs data_dir: the directory holding {DEFAULT_DIRS[dataset]}/")
        return load_cifar_arrays(dataset, data_dir)
    raise ValueError(f"unknown dataset {dataset!r}; expected one of {', '.join(DATASETS)}")


# -- splits, sampling, augmentation --------------------------------------------------------------------------------


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded train/validation split of ``range(n)``: (train, val) index tensors, val sorted."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = max(1, int(round(val_fraction * n)))
    return order[n_val:], order[:n_val].sort().values


def _mix(*values: int) -> int:
    """A deterministic 63-bit seed from integers (splitmix64 steps)."""
    x = 0x9E3779B97F4A7C15
    for v in values:
        x = (x ^ (v & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x = (x ^ (x >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return x & 0x7FFFFFFFFFFFFFFF


class EpochSampler(Sampler[tuple[int, int]]):
    """Yields ``(index, augmentation seed)``; the order and seeds depend only on ``(seed, epoch)``.

    ``shuffle=False`` yields the indices in order with seed −1 (no augmentation), for evaluation.
    """

    def __init__(self, n: int, seed: int = 0, shuffle: bool = True) -> None:
        self.n, self.seed, self.shuffle, self.epoch = n, seed, shuffle, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[tuple[int, int]]:
        if not self.shuffle:
            yield from ((i, -1) for i in range(self.n))
            return
        g = torch.Generator().manual_seed(_mix(self.seed, self.epoch))
        order = torch.randperm(self.n, generator=g).tolist()
        seeds = torch.randint(0, 2**62, (self.n,), generator=g).tolist()
        yield from zip(order, seeds, strict=True)


def random_resized_crop_params(
    g: torch.Generator, size: int, scale: tuple[float, float], ratio: tuple[float, float]
) -> tuple[int, int, int, int]:
    """Top, left, height, width of a crop with area fraction in ``scale`` and aspect ratio in ``ratio``
    (log-uniform), torchvision's rejection scheme with a centre-crop fallback."""
    area = size * size
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        u = torch.rand(4, generator=g).tolist()
        target = area * (scale[0] + (scale[1] - scale[0]) * u[0])
        aspect = math.exp(log_lo + (log_hi - log_lo) * u[1])
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= size and 0 < h <= size:
            top = min(int(u[2] * (size - h + 1)), size - h)
            left = min(int(u[3] * (size - w + 1)), size - w)
            return top, left, h, w
    return 0, 0, size, size


class ImageDataset(Dataset):
    """uint8 images to normalised float tensors, with optional random-resized-crop (0.8–1.0) and flip.

    Items are addressed by ``(index, seed)``; a negative seed means no augmentation.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        mean: torch.Tensor,
        std: torch.Tensor,
        augment: bool = False,
        flip: bool = True,
        scale: tuple[float, float] = (0.8, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
    ) -> None:
        self.images, self.labels = images, labels
        self.mean, self.std = mean.view(-1, 1, 1), std.view(-1, 1, 1)
        self.augment, self.flip, self.scale, self.ratio = augment, flip, scale, ratio

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, item: tuple[int, int] | int) -> tuple[torch.Tensor, torch.Tensor]:
        index, seed = item if isinstance(item, tuple) else (item, -1)
        image = self.images[index].float()
        if self.augment and seed >= 0:
            g = torch.Generator().manual_seed(seed)
            size = image.shape[-1]
            top, left, h, w = random_resized_crop_params(g, size, self.scale, self.ratio)
            crop = image[:, top : top + h, left : left + w].unsqueeze(0)
            image = F.interpolate(crop, size=(size, size), mode="bilinear", align_corners=False).squeeze(0)
            if self.flip and torch.rand(1, generator=g).item() < 0.5:
                image = image.flip(-1)
        return (image / 255.0 - self.mean) / self.std, self.labels[index]


@dataclass
class Loaders:
    train: DataLoader
    val: DataLoader
    test: DataLoader
    train_sampler: EpochSampler
    num_classes: int
    classes: list[str]
    mean: list[float]
    std: list[float]
    n_train: int
    n_val: int
    n_test: int


def channel_stats(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std of uint8 images, on the 0–1 scale."""
    x = images.float().div_(255.0)
    return x.mean(dim=(0, 2, 3)), x.std(dim=(0, 2, 3)).clamp_min(1e-3)


def make_loaders(
    data: ImageArrays,
    batch_size: int,
    val_fraction: float = 0.1,
    seed: int = 0,
    augment: bool = True,
    max_train_samples: int | None = None,
    num_workers: int = 0,
    pin_memory: bool = False,
    eval_batch_size: int | None = None,
) -> Loaders:
    """Seeded train/val split of the training set, normalisation from the training split, and the loaders."""
    train_idx, val_idx = split_indices(len(data.train_labels), val_fraction, seed)
    if max_train_samples is not None:
        train_idx = train_idx[:max_train_samples]
    train_images, train_labels = data.train_images[train_idx], data.train_labels[train_idx]
    mean, std = channel_stats(train_images)

    def dataset(images: torch.Tensor, labels: torch.Tensor, aug: bool) -> ImageDataset:
        return ImageDataset(images, labels, mean, std, augment=aug, flip=data.allow_flip)

    # Own generators, so creating loader iterators never draws from the global RNG (which drives dropout).
    common = {"num_workers": num_workers, "pin_memory": pin_memory, "generator": torch.Generator().manual_seed(seed)}
    if num_workers > 0:
        common.update(persistent_workers=True, prefetch_factor=4)
    train_sampler = EpochSampler(len(train_idx), seed=seed, shuffle=True)
    eval_bs = eval_batch_size or batch_size * 2

    def eval_loader(images: torch.Tensor, labels: torch.Tensor) -> DataLoader:
        return DataLoader(
            dataset(images, labels, False), batch_size=eval_bs, sampler=EpochSampler(len(labels), shuffle=False),
            **common,
        )

    return Loaders(
        train=DataLoader(dataset(train_images, train_labels, augment), batch_size=batch_size,
                         sampler=train_sampler, **common),
        val=eval_loader(data.train_images[val_idx], data.train_labels[val_idx]),
        test=eval_loader(data.test_images, data.test_labels),
        train_sampler=train_sampler,
        num_classes=data.num_classes,
        classes=data.classes,
        mean=mean.tolist(),
        std=std.tolist(),
        n_train=len(train_idx),
        n_val=len(val_idx),
        n_test=len(data.test_labels),
    )
