"""What a ``dataset`` field names: a registered dataset or a directory under the data roots (no torch).

Registered names are shared (anyone may use one), and tenants also name their own directories under the data roots.
A name must never silently change meaning when someone registers something, so the rule is:

1. A value with a ``/`` in it (``./alice-kg``, ``team/alice-kg``) is always a directory under the data roots.
2. A bare name registered by the caller, or by the service itself (the demos), is that dataset.
3. Otherwise a bare name resolves to whichever of the two exists: a directory of that name, or a dataset another
   owner registered. When both exist the request is refused (409) and the message says how to write each: a
   tenant registering a name that matches somebody's directory cannot redirect that somebody's jobs.

``POST /datasets`` also refuses to register a name that is an existing directory under the data roots other than
the one being registered. A job's payload keeps the value as validated, and the worker resolves it by the same
rule for the same owner, so the worker trains on what the caller was shown, or fails naming the conflict.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core import registry
from core.contract.checks import refuse_if_preparing
from core.contract.errors import FieldConflict, FieldError
from core.settings import Settings
from core.userfiles import PathError, resolve_data_path


@dataclass(frozen=True)
class DatasetRef:
    """A resolved dataset field: a registry record (``entry``) or a user directory (``path``), never both."""

    entry: dict[str, Any] | None = None
    path: Path | None = None


def is_path(value: str) -> bool:
    """A value the rule reads as a directory only (rule 1)."""
    return "/" in value or value.startswith(".")


def _user_dir(settings: Settings, value: str) -> Path | None:
    try:
        path = resolve_data_path(settings, value)
    except PathError:
        return None
    return path if path.is_dir() else None


def is_user_dir(settings: Settings, value: str) -> bool:
    """Whether ``value`` names a directory under the data roots (rule 3's other half)."""
    return _user_dir(settings, value) is not None


def resolve(settings: Settings, value: str, owner: str, kind: str, field: str = "dataset",
            kind_label: str | None = None) -> DatasetRef:
    """The dataset ``value`` names for ``owner`` (module rule); FieldError on ``field`` when none, FieldConflict when
    a bare name is both a directory and another owner's registered dataset."""
    loc = ("body", *field.split("."))
    if is_path(value):
        try:
            path = resolve_data_path(settings, value)
        except PathError as exc:
            raise FieldError(loc, str(exc), value=value) from None
        if not path.is_dir():
            raise FieldError(loc, f"{value!r} is not a directory", value=value)
        return DatasetRef(path=path)
    entry = registry.get_dataset(settings, value)
    if entry is not None and entry.get("owner") in (owner, registry.SYSTEM):
        return DatasetRef(entry=_of_kind(entry, value, kind, loc, kind_label))
    directory = _user_dir(settings, value)
    if entry is not None and directory is not None:
        raise FieldConflict(loc, f"{value!r} is both a directory under the data roots and a dataset registered by "
                            f"another owner: write './{value}' for the directory; ask its owner to register the "
                            "dataset under another name to use it", value=value)
    if directory is not None:
        return DatasetRef(path=directory)
    if entry is not None:
        return DatasetRef(entry=_of_kind(entry, value, kind, loc, kind_label))
    refuse_if_preparing(settings, "datasets", value, loc)
    raise FieldError(loc, f"unknown dataset {value!r}: neither a registered dataset nor a directory under the data "
                     "roots", value=value)


def _of_kind(entry: dict[str, Any], value: str, kind: str, loc: tuple, kind_label: str | None) -> dict[str, Any]:
    if entry.get("kind") != kind:
        raise FieldError(loc, f"dataset {value!r} is a {entry.get('kind')!r} dataset, not {kind_label or kind}",
                         value=value)
    return entry


def local_dir(settings: Settings, ref: DatasetRef, value: str, field: str = "dataset") -> Path:
    """This host's directory of a resolved dataset (a registered one's files, copied from the store if need be)."""
    if ref.path is not None:
        return ref.path
    assert ref.entry is not None
    try:
        return registry.local_path(settings, ref.entry)
    except FileNotFoundError:
        raise FieldError(("body", *field.split(".")), f"the files of dataset {value!r} are missing",
                         value=value) from None


def check_registrable(settings: Settings, name: str, path: Path) -> None:
    """A name may be registered unless it is an existing directory under the data roots other than ``path``."""
    directory = _user_dir(settings, name)
    if directory is not None and directory != Path(path):
        raise FieldConflict(("body", "name"), f"{name!r} is a directory under the data roots: registering it would "
                            "change what jobs naming that directory read; choose another name", value=name)
