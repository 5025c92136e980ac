"""The model and dataset registry: ``$EXPLAINQ_HOME/registry.json`` (no torch).

Entries name what to load and how::

    {"models":   {"conve-nations-demo": {"kind": "conve", "loader": "models.kg.checkpoint:load",
                                          "path": "models/conve-nations-demo", "parameters": 2090000,
                                          "meta": {...}, "created_at": "..."}},
     "datasets": {"lora-demo": {"kind": "lora", "path": "data/lora-demo", "meta": {...}}}}

``path`` is relative to ``EXPLAINQ_HOME``. Writes take an exclusive file lock and replace the file atomically,
so a training job registering a model never corrupts a concurrent reader.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.settings import Settings

SECTIONS = ("models", "datasets")


def _empty() -> dict[str, dict]:
    return {s: {} for s in SECTIONS}


def load(settings: Settings) -> dict[str, dict]:
    path = settings.registry_path
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return _empty()
    for s in SECTIONS:
        data.setdefault(s, {})
    return data


@contextlib.contextmanager
def _locked(settings: Settings) -> Iterator[dict[str, dict]]:
    path = settings.registry_path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = load(settings)
        yield data
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".registry-", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
        os.replace(tmp, path)


def _register(settings: Settings, section: str, name: str, entry: dict[str, Any]) -> dict[str, Any]:
    path = Path(entry["path"])
    if path.is_absolute():
        entry["path"] = os.path.relpath(path, settings.home)
    entry.setdefault("meta", {})
    entry["created_at"] = datetime.now(UTC).isoformat()
    with _locked(settings) as data:
        data[section][name] = entry
    return entry


def register_model(
    settings: Settings,
    name: str,
    *,
    kind: str,
    loader: str,
    path: str | Path,
    parameters: int | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    entry = {"kind": kind, "loader": loader, "path": str(path), "parameters": parameters, "meta": meta or {}}
    return _register(settings, "models", name, entry)


def register_dataset(
    settings: Settings, name: str, *, kind: str, path: str | Path, meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    return _register(settings, "datasets", name, {"kind": kind, "path": str(path), "meta": meta or {}})


def unregister(settings: Settings, section: str, name: str) -> None:
    with _locked(settings) as data:
        data[section].pop(name, None)


def get_model(settings: Settings, name: str) -> dict[str, Any] | None:
    return load(settings)["models"].get(name)


def get_dataset(settings: Settings, name: str) -> dict[str, Any] | None:
    return load(settings)["datasets"].get(name)


def list_models(settings: Settings) -> dict[str, dict[str, Any]]:
    return load(settings)["models"]


def list_datasets(settings: Settings) -> dict[str, dict[str, Any]]:
    return load(settings)["datasets"]


def absolute_path(settings: Settings, entry: dict[str, Any]) -> Path:
    return (settings.home / entry["path"]).resolve()
