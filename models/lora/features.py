"""Batched feature computation over a LoRA dataset, with an on-disk cache.

Layers are read in chunks (all adapters at once), moved to the device, and every matrix of one shape across
the chunk's layers is stacked into a single batch, so a representation runs once per distinct shape rather
than once per adapter and layer.

Cache: ``<cache_dir>/<key>.safetensors`` holding the ``[N, D]`` float32 features of one (layer set,
representation) over every layer of the set, with per-layer column offsets (so ``sample_layers`` selects
columns and never misses). The key is the SHA-256 of the dataset content fingerprint, the representation,
the layer set, its layer names and ``FEATURE_CODE_VERSION``; changing any of them is a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from models.lora.data import LayerFactors, LoraDataset
from models.lora.keys import LayerKeys
from models.lora.representations import FEATURE_CODE_VERSION, REPRESENTATIONS

MAX_BATCH_ELEMENTS = 1 << 24  # entries per representation call: bounds device memory


@dataclass
class LayerSetFeatures:
    """Features of one (layer set, representation): ``features [N, D]`` with layer i in columns
    ``offsets[i]:offsets[i+1]``."""

    features: torch.Tensor
    layer_names: list[str]
    offsets: list[int]

    def select(self, names: Sequence[str]) -> torch.Tensor:
        """The columns of ``names`` (a subset of ``layer_names``), in the given order."""
        pos = {n: i for i, n in enumerate(self.layer_names)}
        if list(names) == self.layer_names:
            return self.features
        cols = [torch.arange(self.offsets[pos[n]], self.offsets[pos[n] + 1]) for n in names]
        return self.features[:, torch.cat(cols)] if cols else self.features[:, :0]


@dataclass
class FeatureStats:
    computed: list[tuple[str, str]] = field(default_factory=list)
    cached: list[tuple[str, str]] = field(default_factory=list)
    compute_s: float = 0.0
    load_s: float = 0.0


class FeatureCache:
    """Feature matrices on disk as safetensors, one file per key; writes are atomic (temp file + rename).

    ``shared`` (optional) is a second tier that other hosts see: any object with ``fetch(name, local_path) ->
    bool`` (copy ``name`` to ``local_path`` if it exists there) and ``put(local_path, name)``. A local miss is
    looked up there, and a new matrix is written there too, so a representation computed once on any host is
    reused everywhere."""

    def __init__(self, directory: str | Path, shared: Any = None) -> None:
        self.directory = Path(directory)
        self.shared = shared

    @staticmethod
    def key(fingerprint: str, representation: str, layer_set: str, layer_names: Sequence[str]) -> str:
        payload = json.dumps(
            {"dataset": fingerprint, "representation": representation, "layer_set": layer_set,
             "layers": hashlib.sha256("\n".join(layer_names).encode()).hexdigest(), "code": FEATURE_CODE_VERSION},
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:32]

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.safetensors"

    def load(self, key: str) -> LayerSetFeatures | None:
        from safetensors import safe_open

        path = self.path(key)
        if not path.is_file():
            if self.shared is None:
                return None
            self.directory.mkdir(parents=True, exist_ok=True)
            if not self.shared.fetch(path.name, path):
                return None
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            # get_tensor maps the file lazily; clone so the read happens (and is timed) here, and the
            # tensor no longer depends on the file
            feats = fh.get_tensor("features").clone()
            offsets = fh.get_tensor("offsets").tolist()
        return LayerSetFeatures(feats, json.loads(meta["layers"]), offsets)

    def save(self, key: str, value: LayerSetFeatures, meta: dict[str, str]) -> Path:
        from safetensors.torch import save_file

        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        save_file(
            {"features": value.features.contiguous(), "offsets": torch.tensor(value.offsets, dtype=torch.int64)},
            str(tmp),
            metadata={**meta, "layers": json.dumps(value.layer_names), "code": FEATURE_CODE_VERSION},
        )
        tmp.replace(path)
        if self.shared is not None:
            self.shared.put(path, path.name)
        return path


def _run_batched(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    per_row = max(1, x[0].numel())
    step = max(1, MAX_BATCH_ELEMENTS // per_row)
    return torch.cat([fn(x[i:i + step]) for i in range(0, x.shape[0], step)])


def layer_features(
    factors: dict[str, LayerFactors],
    representation: str,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    method: str = "exact",
) -> dict[str, torch.Tensor]:
    """``{layer: [N, f]}`` (on ``device``) for the given stacked factors, batching equal shapes together."""
    rep = REPRESENTATIONS[representation]
    names = list(factors)
    n = next(iter(factors.values())).down.shape[0] if factors else 0
    out: dict[str, torch.Tensor] = {}
    if rep.on == "delta":
        groups: dict[tuple, list[str]] = {}
        for name in names:
            f = factors[name]
            groups.setdefault((tuple(f.down.shape[1:]), tuple(f.up.shape[1:])), []).append(name)
        for members in groups.values():
            down = torch.cat([factors[m].down for m in members]).to(device, dtype)
            up = torch.cat([factors[m].up for m in members]).to(device, dtype)
            scale = torch.cat([factors[m].scale for m in members]).to(device, dtype)
            # the reference methods materialise ΔW (out x in) per row; the exact one only reads the factors
            per_row = down[0].numel() + up[0].numel() if method == "exact" else up.shape[1] * down.shape[2]
            per_row = max(1, per_row)
            step = max(1, MAX_BATCH_ELEMENTS // per_row)
            feats = torch.cat([rep.fn(down[i:i + step], up[i:i + step], scale[i:i + step], method=method)
                               for i in range(0, down.shape[0], step)])
            for j, m in enumerate(members):
                out[m] = feats[j * n:(j + 1) * n]
        return out
    # factor representations: rep(down) ++ rep(up) per layer; batch every matrix of one shape together
    groups_f: dict[tuple[int, ...], list[tuple[str, str]]] = {}
    for name in names:
        for which in ("down", "up"):
            groups_f.setdefault(tuple(getattr(factors[name], which).shape[1:]), []).append((name, which))
    parts: dict[tuple[str, str], torch.Tensor] = {}
    for members in groups_f.values():
        x = torch.cat([getattr(factors[m], w) for m, w in members]).to(device, dtype)
        feats = _run_batched(rep.fn, x)
        for j, member in enumerate(members):
            parts[member] = feats[j * n:(j + 1) * n]
    for name in names:
        out[name] = torch.cat([parts[(name, "down")], parts[(name, "up")]], dim=1)
    return out


def compute_features(
    dataset: LoraDataset,
    requests: dict[str, Sequence[LayerKeys]],
    representations: Sequence[str],
    device: torch.device,
    cache: FeatureCache | None = None,
    chunk_layers: int = 16,
    progress: Callable[[int, int], None] | None = None,
    memo_path: Path | None = None,
) -> tuple[dict[tuple[str, str], LayerSetFeatures], FeatureStats]:
    """Features for every (layer set, representation), ``requests`` mapping a layer set to its layers.

    Cached entries are loaded; the rest are computed in one pass over the union of their layers (each layer
    read once, each (layer, representation) computed once even when it belongs to several layer sets), then
    saved. Returns CPU float32 features and what was cached or computed.
    """
    stats = FeatureStats()
    result: dict[tuple[str, str], LayerSetFeatures] = {}
    missing: list[tuple[str, str]] = []
    fingerprint = dataset.fingerprint(memo_path) if cache is not None else ""
    t0 = time.perf_counter()
    for ls, layers in requests.items():
        names = [layer.name for layer in layers]
        for rep in representations:
            hit = cache.load(FeatureCache.key(fingerprint, rep, ls, names)) if cache is not None else None
            if hit is not None and hit.layer_names == names:
                result[(ls, rep)] = hit
                stats.cached.append((ls, rep))
            else:
                missing.append((ls, rep))
    stats.load_s = time.perf_counter() - t0
    if not missing:
        return result, stats
    t0 = time.perf_counter()
    need: dict[str, set[str]] = {}  # layer -> representations needed
    by_name: dict[str, LayerKeys] = {}
    for ls, rep in missing:
        for layer in requests[ls]:
            need.setdefault(layer.name, set()).add(rep)
            by_name[layer.name] = layer
    ordered = sorted(need)
    per_layer: dict[tuple[str, str], torch.Tensor] = {}
    for start in range(0, len(ordered), chunk_layers):
        chunk = ordered[start:start + chunk_layers]
        factors = dataset.load_layers([by_name[n] for n in chunk])
        for rep in sorted({r for n in chunk for r in need[n]}):
            sub = {n: factors[n] for n in chunk if rep in need[n]}
            for name, feats in layer_features(sub, rep, device).items():
                per_layer[(name, rep)] = feats.float().cpu()
        del factors
        if progress is not None:
            progress(min(start + chunk_layers, len(ordered)), len(ordered))
    for ls, rep in missing:
        names = [layer.name for layer in requests[ls]]
        blocks = [per_layer[(n, rep)] for n in names]
        offsets = [0]
        for b in blocks:
            offsets.append(offsets[-1] + b.shape[1])
        value = LayerSetFeatures(torch.cat(blocks, dim=1), names, offsets)
        result[(ls, rep)] = value
        stats.computed.append((ls, rep))
        if cache is not None:
            cache.save(FeatureCache.key(fingerprint, rep, ls, names), value,
                       {"dataset": fingerprint, "representation": rep, "layer_set": ls})
    stats.compute_s = time.perf_counter() - t0
    return result, stats
