"""The worker's model cache: registered models loaded once, handed to every job that names them."""

from __future__ import annotations

import importlib
import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

from app import registry
from app.settings import Settings

log = logging.getLogger("explainq.models")


class UnknownModel(KeyError):
    pass


def import_object(path: str) -> Any:
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"expected 'module.path:name', got {path!r}")
    return getattr(importlib.import_module(module), attr)


class ModelCache:
    """name -> loaded object. Reloads when the registry entry changes (a model re-trained under the same name)."""

    def __init__(self, settings: Settings, device: Any):
        self.settings = settings
        self.device = device
        self._items: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.load_counts: dict[str, int] = {}

    def preload(self) -> list[str]:
        """Load every registered model; a model that fails to load is logged and skipped, not fatal."""
        loaded = []
        for name in registry.list_models(self.settings):
            try:
                self.get(name)
                loaded.append(name)
            except Exception:
                log.exception("could not preload model %s", name)
        return loaded

    def get(self, name: str) -> Any:
        entry = registry.get_model(self.settings, name)
        if entry is None:
            raise UnknownModel(name)
        with self._lock:
            item = self._items.get(name)
            if item is not None and item["created_at"] == entry.get("created_at"):
                return item["obj"]
            loader = import_object(entry["loader"])
            t0 = time.perf_counter()
            obj = loader(registry.absolute_path(self.settings, entry), self.device)
            self.load_counts[name] = self.load_counts.get(name, 0) + 1
            self._items[name] = {
                "obj": obj,
                "created_at": entry.get("created_at"),
                "loaded_at": datetime.now(UTC).isoformat(),
                "load_s": round(time.perf_counter() - t0, 3),
            }
            log.info("loaded model %s on %s in %.2fs", name, self.device, self._items[name]["load_s"])
            return obj

    def evict(self, name: str) -> None:
        with self._lock:
            self._items.pop(name, None)

    def describe(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {"name": name, "device": str(self.device), "loaded_at": item["loaded_at"],
                 "load_s": item["load_s"], "loads": self.load_counts.get(name, 0)}
                for name, item in self._items.items()
            ]
