"""The worker's model cache: registered models loaded once, handed to every job that names them.

Models are kept in least-recently-used order under a memory budget (``EXPLAINQ_MODEL_CACHE_BYTES``): a worker that
has served a hundred training jobs does not hold a hundred models. Only models registered with ``preload`` (the demo
models) are loaded at start; others load on first use. A model replaced in the registry (a new store version) is
reloaded on its next use; the files come from the shared store (in place, or this host's cached copy).
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

from core import registry
from core.settings import Settings

log = logging.getLogger("explainq.models")


class UnknownModel(KeyError):
    pass


def import_object(path: str) -> Any:
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"expected 'module.path:name', got {path!r}")
    return getattr(importlib.import_module(module), attr)


def estimate_nbytes(obj: Any, _seen: set[int] | None = None, _depth: int = 0) -> int:
    """Bytes held by the tensors of a loaded model object (modules, tensors, and containers of them)."""
    import torch

    seen = _seen if _seen is not None else set()
    if id(obj) in seen or _depth > 4:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, torch.nn.Module):
        tensors = {id(t): t for t in [*obj.parameters(), *obj.buffers()]}
        seen.update(tensors)
        return sum(t.numel() * t.element_size() for t in tensors.values())
    if isinstance(obj, dict):
        return sum(estimate_nbytes(v, seen, _depth + 1) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(estimate_nbytes(v, seen, _depth + 1) for v in obj)
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return sum(estimate_nbytes(v, seen, _depth + 1) for v in vars(obj).values())
    return 0


class ModelCache:
    """name -> loaded object, least recently used first out when the budget is exceeded."""

    def __init__(self, settings: Settings, device: Any, budget_bytes: int | None = None):
        self.settings = settings
        self.device = device
        self.budget = settings.model_cache_bytes if budget_bytes is None else budget_bytes
        self._items: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.load_counts: dict[str, int] = {}

    def preload(self) -> list[str]:
        """Load the models registered with ``preload``; one that fails to load is logged and skipped."""
        loaded = []
        for name, entry in registry.list_models(self.settings).items():
            if not entry.get("preload"):
                continue
            try:
                self.get(name)
                loaded.append(name)
            except Exception:
                log.exception("could not preload model %s", name)
        return loaded

    @staticmethod
    def _version(entry: dict[str, Any]) -> str:
        return f"{entry.get('location') or entry.get('path')}|{entry.get('created_at')}"

    def get(self, name: str) -> Any:
        entry = registry.get_model(self.settings, name)
        if entry is None:
            raise UnknownModel(name)
        version = self._version(entry)
        with self._lock:
            item = self._items.get(name)
            if item is not None and item["version"] == version:
                self._items.move_to_end(name)
                return item["obj"]
            loader = import_object(entry["loader"])
            t0 = time.perf_counter()
            try:
                path = registry.local_path(self.settings, entry)
            except FileNotFoundError:
                raise UnknownModel(name) from None
            obj = loader(path, self.device)
            load_s = time.perf_counter() - t0
            self.load_counts[name] = self.load_counts.get(name, 0) + 1
            self._items[name] = {
                "obj": obj,
                "version": version,
                "nbytes": estimate_nbytes(obj),
                "loaded_at": datetime.now(UTC).isoformat(),
                "load_s": round(load_s, 3),
            }
            self._items.move_to_end(name)
            self._enforce_budget(keep=name)
            log.info("loaded model %s on %s in %.2fs", name, self.device, load_s)
            self._record_load(name, load_s)
            return obj

    def _record_load(self, name: str, seconds: float) -> None:
        """Count the load for ``GET /metrics`` (never raises: a metrics failure never fails a load)."""
        from core.metrics import record_model_load

        record_model_load(registry.connection(self.settings), name, seconds)

    def _enforce_budget(self, keep: str) -> None:
        total = sum(item["nbytes"] for item in self._items.values())
        for name in list(self._items):
            if total <= self.budget:
                break
            if name == keep:  # the model just asked for stays even when it alone exceeds the budget
                continue
            total -= self._items.pop(name)["nbytes"]
            log.info("dropped model %s from memory (cache budget %d bytes)", name, self.budget)

    def evict(self, name: str) -> None:
        with self._lock:
            self._items.pop(name, None)

    def loaded_names(self) -> list[str]:
        with self._lock:
            return list(self._items)

    def describe(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {"name": name, "device": str(self.device), "loaded_at": item["loaded_at"],
                 "load_s": item["load_s"], "loads": self.load_counts.get(name, 0), "bytes": item["nbytes"]}
                for name, item in self._items.items()
            ]
