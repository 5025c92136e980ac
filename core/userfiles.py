"""Resolving user-supplied paths inside the configured data roots (no torch)."""

from __future__ import annotations

from pathlib import Path

from core.settings import Settings


class PathError(ValueError):
    """A user path that is empty, escapes the data roots, or does not exist when it must."""


def resolve_data_path(settings: Settings, raw: str, must_exist: bool = True) -> Path:
    """Resolve ``raw`` to a real path inside one of ``settings.data_roots``.

    Relative paths are taken relative to each root in turn (first existing match wins, else the first root).
    Symlinks are resolved before the containment check, so a link pointing out of the roots is rejected, and so
    is any ``..`` that climbs out.
    """
    if not isinstance(raw, str) or not raw.strip():
        raise PathError("path must be a non-empty string")
    if "\x00" in raw:
        raise PathError("path contains a NUL byte")
    roots = settings.data_roots
    given = Path(raw).expanduser()
    candidates = [given] if given.is_absolute() else [root / given for root in roots]
    for cand in candidates:
        resolved = cand.resolve()
        inside = any(resolved == root or resolved.is_relative_to(root) for root in roots)
        if not inside:
            continue
        if must_exist and not resolved.exists():
            continue
        return resolved
    for cand in candidates:
        resolved = cand.resolve()
        if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
            raise PathError(f"{raw!r} is outside the data roots ({', '.join(map(str, roots))})")
    raise PathError(f"{raw!r} does not exist under the data roots ({', '.join(map(str, roots))})")
