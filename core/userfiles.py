"""Resolving user-supplied paths inside the configured data roots (no torch)."""

from __future__ import annotations

import os
from pathlib import Path

from core.settings import Settings

# What Linux's file systems allow: bytes in one path component, and in a whole path (with its terminating NUL).
NAME_MAX = 255
PATH_MAX = 4096


class PathError(ValueError):
    """A user path that is empty, escapes the data roots, does not exist when it must, or that the file system
    cannot name (a component over NAME_MAX, a path over PATH_MAX)."""


def shown(raw: str, limit: int = 120) -> str:
    """``raw`` as a message quotes it: repr, cut to about ``limit`` characters."""
    return repr(raw) if len(raw) <= limit else f"{raw[:limit]!r}... ({len(raw)} characters)"


def check_path_lengths(raw: str, path: Path) -> None:
    """PathError when the file system cannot name ``path`` (every call on it would fail with ENAMETOOLONG)."""
    for part in path.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise PathError(f"{shown(raw)}: a path component is {len(os.fsencode(part))} bytes long; the file "
                            f"system allows {NAME_MAX}")
    if len(os.fsencode(str(path))) >= PATH_MAX:
        raise PathError(f"{shown(raw)}: the path is {len(os.fsencode(str(path)))} bytes long under the data root; "
                        f"the file system allows {PATH_MAX - 1}")


def resolve_data_path(settings: Settings, raw: str, must_exist: bool = True) -> Path:
    """Resolve ``raw`` to a real path inside one of ``settings.data_roots``.

    Relative paths are taken relative to each root in turn (first existing match wins, else the first root).
    Symlinks are resolved before the containment check, so a link pointing out of the roots is rejected, and so
    is any ``..`` that climbs out. A path the file system cannot name (too long) or answer about (a loop of links,
    no permission) is a PathError, as is one that is not text the file system can encode or that names the home
    directory of an unknown user (``~name``).
    """
    if not isinstance(raw, str) or not raw.strip():
        raise PathError("path must be a non-empty string")
    if "\x00" in raw:
        raise PathError("path contains a NUL byte")
    try:
        return _resolve(settings, raw, must_exist)
    except UnicodeEncodeError:
        raise PathError(f"{shown(raw.encode('utf-8', 'backslashreplace').decode())}: not a path the file system "
                        "can encode") from None
    except OSError as exc:
        raise PathError(f"{shown(raw)}: {exc.strerror or exc}") from None
    except RuntimeError as exc:  # expanduser: "~name" of a user this host does not know
        raise PathError(f"{shown(raw)}: {exc}") from None


def _resolve(settings: Settings, raw: str, must_exist: bool) -> Path:
    roots = settings.data_roots
    given = Path(raw).expanduser()
    candidates = [given] if given.is_absolute() else [root / given for root in roots]
    for cand in candidates:
        check_path_lengths(raw, cand)
        resolved = cand.resolve()
        check_path_lengths(raw, resolved)
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
