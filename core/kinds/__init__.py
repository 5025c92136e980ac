"""Job kinds. Each module in this package registers one or more kinds on import (see docs/PLUGINS.md)."""

from __future__ import annotations

import importlib
import pkgutil

from core.kinds.base import KINDS, FieldError, JobKind, register

__all__ = ["KINDS", "FieldError", "JobKind", "register", "load_all"]

_loaded = False


def load_all() -> dict[str, JobKind]:
    """Import every kind module once; returns the registry."""
    global _loaded
    if not _loaded:
        for info in pkgutil.iter_modules(__path__):
            if info.name != "base":
                importlib.import_module(f"{__name__}.{info.name}")
        _loaded = True
    return KINDS
