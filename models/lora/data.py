"""LoRA datasets: format 1 (a directory of ``.safetensors`` + ``labels.csv``) and format 2 (a Hugging Face
``datasets`` ``save_to_disk`` directory), seeded stratified splits and a content fingerprint.

Tensors are read per layer for all adapters at once (``load_layers``), stacked as ``down [N, r, in]`` and
``up [N, out, r]`` in their stored dtype. Conv LoRA factors (``[r, in, k, k]`` / ``[out, r, 1, 1]``) are
flattened to matrices.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models.lora.keys import (
    LABEL_COLUMN,
    LAYER_SETS,
    DatasetFormatError,
    LayerKeys,
    detect_format,
    hf_split_dir,
    pair_layers,
    read_labels_csv,
    read_safetensors_header,
    select_layers,
)

FINGERPRINT_VERSION = 1


@dataclass
class LayerFactors:
    """Stacked factors of one layer for all adapters. ``scale`` is alpha / r per adapter (1 without alpha)."""

    down: torch.Tensor  # [N, r, in]
    up: torch.Tensor  # [N, out, r]
    scale: torch.Tensor  # [N]


def _as_matrix(t: torch.Tensor, which: str) -> torch.Tensor:
    """Flatten a (possibly conv) factor to a matrix: down -> [r, in*k*k], up -> [out, r*k*k]."""
    if t.dim() == 2:
        return t
    if t.dim() == 4:
        return t.reshape(t.shape[0], -1)
    if t.dim() == 1 and which == "down":
        return t.reshape(1, -1)
    raise DatasetFormatError(f"unsupported LoRA factor of shape {tuple(t.shape)}")


def _read_memo(memo_path: Path | None) -> dict[str, list]:
    """A JSON memo of per-file results keyed by path (with size and mtime), or empty when missing or unreadable."""
    if memo_path is None or not memo_path.is_file():
        return {}
    try:
        memo = json.loads(memo_path.read_text())
    except json.JSONDecodeError:
        return {}
    return memo if isinstance(memo, dict) else {}


class LoraDataset:
    """A labelled collection of LoRA adapters that share one set of layers.

    Attributes: ``root``, ``format``, ``names`` (one id per adapter), ``labels`` (int64 numpy), ``classes``
    (label names, index = class id), ``layers`` (``LayerKeys`` present in every adapter, sorted),
    ``shapes`` (layer name -> (down shape, up shape) as matrices).
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise DatasetFormatError(f"dataset directory {str(root)!r} does not exist")
        self.format = detect_format(self.root)
        if self.format == "safetensors_dir":
            self._init_safetensors_dir()
        else:
            self._init_hf_disk()
        if len(self.classes) < 2:
            raise DatasetFormatError(f"the dataset has {len(self.classes)} class(es); at least 2 are needed")
        if not self.layers:
            raise DatasetFormatError("no LoRA layers (down/up factor pairs) were found in the dataset")
        self._fingerprint: str | None = None

    @property
    def synthetic(self) -> bool:
        """True for datasets made by ``models.lora.synthetic`` (their files carry ``explainq_synthetic``)."""
        if self.format != "safetensors_dir" or not getattr(self, "files", None):
            return False
        from safetensors import safe_open

        with safe_open(str(self.files[0]), framework="pt") as fh:
            return "explainq_synthetic" in (fh.metadata() or {})

    # -- format 1 --------------------------------------------------------------------------------------
    def _init_safetensors_dir(self) -> None:
        rows = read_labels_csv(self.root, groups=True)
        self.files = [self.root / f for f, _, _ in rows]
        missing = [str(f.name) for f in self.files if not f.is_file()]
        if missing:
            raise DatasetFormatError(f"{len(missing)} file(s) listed in labels.csv are missing, e.g. {missing[0]!r}")
        self.names = [f for f, _, _ in rows]
        label_names = [lab for _, lab, _ in rows]
        self.groups = [g or None for _, _, g in rows]  # None: the adapter is its own group
        self.classes = sorted(set(label_names))
        index = {c: i for i, c in enumerate(self.classes)}
        self.labels = np.array([index[lab] for lab in label_names], dtype=np.int64)
        # Layers present in every adapter with one shape each; read from the JSON headers only.
        common: dict[str, LayerKeys] | None = None
        shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        for f in self.files:
            table = read_safetensors_header(f)
            layers, _ = pair_layers(table.keys())
            here = {layer.name: layer for layer in layers}
            if common is None:
                common = here
                for layer in layers:
                    shapes[layer.name] = (tuple(table[layer.down]["shape"]), tuple(table[layer.up]["shape"]))
            else:
                common = {k: v for k, v in common.items() if k in here}
                for name in common:
                    layer = here[name]
                    got = (tuple(table[layer.down]["shape"]), tuple(table[layer.up]["shape"]))
                    if got != shapes[name]:
                        raise DatasetFormatError(
                            f"layer {name!r} has shape {got} in {f.name} but {shapes[name]} in {self.files[0].name};"
                            " all adapters must share layer shapes (same base model and rank)"
                        )
        self.layers = sorted((common or {}).values(), key=lambda layer: layer.name)
        self.shapes = {layer.name: _matrix_shapes(*shapes[layer.name]) for layer in self.layers}

    # -- format 2 --------------------------------------------------------------------------------------
    def _init_hf_disk(self) -> None:
        try:
            import datasets  # optional extra
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise DatasetFormatError("format 2 needs the optional `datasets` package (pip install explainq[datasets])") from exc
        ds = datasets.load_from_disk(str(hf_split_dir(self.root)))
        if isinstance(ds, datasets.DatasetDict):
            ds = ds["train"] if "train" in ds else ds[next(iter(ds))]
        if LABEL_COLUMN not in ds.column_names:
            raise DatasetFormatError(f"datasets directory without a {LABEL_COLUMN!r} column")
        self._hf = ds.with_format("torch")
        raw = ds[LABEL_COLUMN][:]
        feature = ds.features[LABEL_COLUMN]
        label_names = [feature.int2str(int(v)) if hasattr(feature, "int2str") else str(v) for v in raw]
        self.classes = sorted(set(label_names))
        index = {c: i for i, c in enumerate(self.classes)}
        self.labels = np.array([index[lab] for lab in label_names], dtype=np.int64)
        self.names = [str(i) for i in range(len(ds))]
        self.groups = [str(g) or None for g in ds["group"]] if "group" in ds.column_names else [None] * len(ds)
        self.layers, _ = pair_layers(ds.column_names)
        self.shapes = {}
        if self.layers:
            row = self._hf[0]
            for layer in self.layers:
                self.shapes[layer.name] = _matrix_shapes(tuple(row[layer.down].shape), tuple(row[layer.up].shape))

    # -- access ----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def layer_set(self, layer_set: str) -> list[LayerKeys]:
        return select_layers(self.layers, layer_set)

    def num_layers(self) -> dict[str, int]:
        return {ls: len(self.layer_set(ls)) for ls in LAYER_SETS}

    def load_layers(self, layers: Sequence[LayerKeys]) -> dict[str, LayerFactors]:
        """Stack the factors of ``layers`` over all adapters (stored dtype, CPU)."""
        out: dict[str, LayerFactors] = {}
        if self.format == "safetensors_dir":
            from safetensors import safe_open

            downs: dict[str, list[torch.Tensor]] = {layer.name: [] for layer in layers}
            ups: dict[str, list[torch.Tensor]] = {layer.name: [] for layer in layers}
            scales: dict[str, list[float]] = {layer.name: [] for layer in layers}
            for f in self.files:
                with safe_open(str(f), framework="pt") as fh:
                    keys = set(fh.keys())
                    for layer in layers:
                        down = _as_matrix(fh.get_tensor(layer.down), "down")
                        downs[layer.name].append(down)
                        ups[layer.name].append(_as_matrix(fh.get_tensor(layer.up), "up"))
                        alpha_key = f"{layer.name}.alpha"
                        if alpha_key in keys:
                            scales[layer.name].append(float(fh.get_tensor(alpha_key).float()) / down.shape[0])
                        else:
                            scales[layer.name].append(1.0)
            for layer in layers:
                out[layer.name] = LayerFactors(
                    down=torch.stack(downs[layer.name]),
                    up=torch.stack(ups[layer.name]),
                    scale=torch.tensor(scales[layer.name], dtype=torch.float32),
                )
        else:
            cols = set(self._hf.column_names)
            wanted = [k for layer in layers for k in (layer.down, layer.up, layer.alpha) if k and k in cols]
            batch = self._hf.select_columns(wanted)[:]  # dict of stacked tensors
            for layer in layers:
                down = torch.as_tensor(batch[layer.down])
                up = torch.as_tensor(batch[layer.up])
                n = down.shape[0]
                down = down.reshape(n, *self.shapes[layer.name][0])
                up = up.reshape(n, *self.shapes[layer.name][1])
                if layer.alpha and layer.alpha in cols:
                    scale = torch.as_tensor(batch[layer.alpha]).float().reshape(n) / down.shape[1]
                else:
                    scale = torch.ones(n)
                out[layer.name] = LayerFactors(down=down, up=up, scale=scale)
        return out

    def content_digests(self, memo_path: Path | None = None) -> list[str]:
        """One SHA-256 per adapter over its tensors (sorted keys, dtype, shape and bytes), so two adapters with the
        same weights have the same digest whatever their file names or safetensors metadata. Format 1 digests are
        memoised in ``memo_path`` (JSON) by (path, size, mtime_ns), as ``fingerprint`` does."""
        if getattr(self, "_digests", None) is not None:
            return self._digests
        digests: list[str] = []
        if self.format == "safetensors_dir":
            from safetensors import safe_open

            memo = _read_memo(memo_path)
            changed = False
            for f in self.files:
                key, st = str(f.resolve()), f.stat()
                stamp = [st.st_size, st.st_mtime_ns]
                entry = memo.get(key)
                if entry is None or entry[:2] != stamp:
                    with safe_open(str(f), framework="pt") as fh:
                        entry = memo[key] = [*stamp, _tensor_digest((k, fh.get_tensor(k)) for k in sorted(fh.keys()))]
                    changed = True
                digests.append(entry[2])
            if memo_path is not None and changed:
                memo_path.parent.mkdir(parents=True, exist_ok=True)
                tmp = memo_path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(memo))
                tmp.replace(memo_path)
        else:
            cols = sorted(c for c in self._hf.column_names if c not in (LABEL_COLUMN, "group"))
            table = self._hf.select_columns(cols)
            for i in range(len(self)):
                row = table[i]
                digests.append(_tensor_digest((k, torch.as_tensor(row[k])) for k in cols))
        self._digests = digests
        return digests

    def duplicates(self, memo_path: Path | None = None) -> list[list[int]]:
        """Groups of adapter indices with identical tensors (each of two or more, in dataset order)."""
        by_digest: dict[str, list[int]] = {}
        for i, d in enumerate(self.content_digests(memo_path)):
            by_digest.setdefault(d, []).append(i)
        return [idx for idx in by_digest.values() if len(idx) > 1]

    def fingerprint(self, memo_path: Path | None = None) -> str:
        """SHA-256 over the content of every file that defines the dataset (labels and tensors).

        File digests are memoised in ``memo_path`` (JSON) by (path, size, mtime_ns) so an unchanged dataset is
        not re-read; any content change changes size or mtime and so is re-hashed.
        """
        if self._fingerprint is not None:
            return self._fingerprint
        if self.format == "safetensors_dir":
            files = [self.root / "labels.csv", *self.files]
        else:
            files = sorted(p for p in self.root.rglob("*") if p.is_file())
        memo = _read_memo(memo_path)
        h = hashlib.sha256(f"lora-dataset-v{FINGERPRINT_VERSION}:{self.format}".encode())
        changed = False
        for f in files:
            st = f.stat()
            key = str(f.resolve())
            stamp = [st.st_size, st.st_mtime_ns]
            entry = memo.get(key)
            if entry is not None and entry[:2] == stamp:
                digest = entry[2]
            else:
                with f.open("rb") as fh:
                    digest = hashlib.file_digest(fh, "sha256").hexdigest()
                memo[key] = [*stamp, digest]
                changed = True
            h.update(str(f.relative_to(self.root)).encode() + b"\0" + digest.encode())
        if memo_path is not None and changed:
            memo_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo_path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(memo))
            tmp.replace(memo_path)
        self._fingerprint = h.hexdigest()
        return self._fingerprint


def _tensor_digest(items) -> str:  # noqa: ANN001 - an iterable of (key, tensor)
    h = hashlib.sha256(b"lora-adapter-v1")
    for key, t in items:
        t = t.detach().cpu().contiguous()
        h.update(f"{key}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _matrix_shapes(down: tuple[int, ...], up: tuple[int, ...]) -> tuple[tuple[int, int], tuple[int, int]]:
    def mat(shape: tuple[int, ...], which: str) -> tuple[int, int]:
        if len(shape) == 2:
            return shape[0], shape[1]
        if len(shape) == 4:
            return shape[0], int(np.prod(shape[1:]))
        if len(shape) == 1 and which == "down":
            return 1, shape[0]
        raise DatasetFormatError(f"unsupported LoRA factor of shape {shape}")

    return mat(down, "down"), mat(up, "up")


@dataclass(frozen=True)
class Splits:
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


def stratified_split(labels: np.ndarray, seed: int, fractions: tuple[float, float, float] = (0.7, 0.1, 0.2)) -> Splits:
    """Seeded stratified train/val/test split.

    Each class c with n_c items is shuffled (``numpy.random.default_rng(seed)``) and cut into
    round(f_val·n_c) validation items, round(f_test·n_c) test items and the rest for training (at least one
    training item per class). Raises when the validation or test split would be empty.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    train, val, test = [], [], []
    _, f_val, f_test = fractions
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        idx = idx[rng.permutation(len(idx))]
        n = len(idx)
        n_val = int(round(f_val * n))
        n_test = int(round(f_test * n))
        while n_val + n_test >= n and (n_val or n_test):
            if n_val >= n_test and n_val:
                n_val -= 1
            else:
                n_test -= 1
        val.append(idx[:n_val])
        test.append(idx[n_val:n_val + n_test])
        train.append(idx[n_val + n_test:])
    out = Splits(*(np.sort(np.concatenate(parts)) for parts in (train, val, test)))
    if len(out.val) == 0 or len(out.test) == 0:
        raise DatasetFormatError(
            f"the dataset has too few items ({len(labels)}) for a 70/10/20 split with non-empty validation and test"
        )
    return out


def group_split(labels: np.ndarray, groups: Sequence, seed: int,
                fractions: tuple[float, float, float] = (0.7, 0.1, 0.2)) -> Splits:
    """Seeded train/val/test split that keeps every group on one side, stratified where possible.

    ``groups[i]`` names item i's group (``None``: its own group). Each group gets the label most of its items
    have (ties: the smallest class id); the groups of each such class are shuffled (``default_rng(seed)``) and
    dealt to test until the class's test share reaches round(f_test·n_c) items, then to validation, the rest to
    training; a class keeps at least one group for training. Groups of mixed labels make the split only
    approximately stratified. With every item its own group this is ``stratified_split``. Raises when the
    validation or test split would be empty.
    """
    labels = np.asarray(labels)
    if all(g is None for g in groups):
        return stratified_split(labels, seed, fractions)
    members: dict[object, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(("group", g) if g is not None else ("item", i), []).append(i)
    keys = list(members)
    group_label = np.array([np.bincount(labels[members[k]]).argmax() for k in keys])
    rng = np.random.default_rng(seed)
    _, f_val, f_test = fractions
    train, val, test = [], [], []
    for c in np.unique(group_label):
        gidx = np.flatnonzero(group_label == c)
        gidx = gidx[rng.permutation(len(gidx))]
        n = sum(len(members[keys[g]]) for g in gidx)
        want_test, want_val = int(round(f_test * n)), int(round(f_val * n))
        n_test = n_val = 0
        trained = False
        for k, g in enumerate(gidx):
            items = members[keys[g]]
            if k == len(gidx) - 1 and not trained:
                train.extend(items)  # the class's last group trains when none has yet
            elif n_test < want_test:
                test.extend(items)
                n_test += len(items)
            elif n_val < want_val:
                val.extend(items)
                n_val += len(items)
            else:
                train.extend(items)
                trained = True
    out = Splits(*(np.sort(np.asarray(part, dtype=np.int64)) for part in (train, val, test)))
    if len(out.val) == 0 or len(out.test) == 0:
        raise DatasetFormatError(
            f"the dataset has too few groups ({len(keys)}) for a 70/10/20 split with non-empty validation and test"
        )
    return out


def sample_layers(layers: Sequence[LayerKeys], fraction: float, seed: int) -> list[LayerKeys]:
    """A seeded random subset of ``max(1, floor(fraction·L))`` layers, kept in name order."""
    if not 0 < fraction <= 1:
        raise ValueError(f"sample_layers must be in (0, 1], got {fraction}")
    if fraction >= 1:
        return list(layers)
    k = max(1, int(len(layers) * fraction))
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(len(layers), size=k, replace=False))
    return [layers[i] for i in chosen]
