"""The registry checks kinds share at submission: a model of the right kind, a name the caller may take."""

from __future__ import annotations

from typing import Any

from core.contract.errors import FieldConflict, FieldError, FieldReserved, FieldUnavailable
from core.settings import Settings


def require_name_free(settings: Settings, name: str, owner: str, field: str, section: str = "models") -> None:
    """409 on ``field`` when ``name`` is registered to another owner (only its owner may replace it), or is one
    of the service's reserved names (code ``reserved_name``)."""
    from core import registry

    refuse_reserved(name, owner, field, section)
    try:
        registry.check_owner(settings, section, name, owner)
    except registry.OwnershipError as exc:
        raise FieldConflict(("body", field), str(exc), value=name) from None


def refuse_reserved(name: str, owner: str, field: str, section: str = "models") -> None:
    """409 ``reserved_name`` on ``field`` when ``name`` is one the service keeps for its own shipped data or demo
    models (``core.registry.RESERVED``) and ``owner`` is not the service: checked before anything else a request
    names is read."""
    from core import registry

    if owner != registry.SYSTEM and registry.is_reserved(section, name):
        raise FieldReserved(("body", field), str(registry.ReservedNameError(section, name)), value=name)


def require_new_name(settings: Settings, name: str, owner: str, kind: str, overwrite: bool,
                     field: str = "name") -> None:
    """The model name a job will register: 409 when another owner holds it; 422 when the caller's model of that
    name exists and ``overwrite`` is false, or is of another kind."""
    from core import registry

    require_name_free(settings, name, owner, field)
    existing = registry.get_model(settings, name)
    if existing is not None and not overwrite:
        raise FieldError(("body", field), f"a model named {name!r} exists; pass overwrite=true to replace it",
                         value=name)
    if existing is not None and existing.get("kind") != kind:
        raise FieldError(("body", field), f"{name!r} is a {existing.get('kind')!r} model; overwrite replaces "
                         f"{kind} models only", value=name)


def refuse_if_preparing(settings: Settings, section: str, name: str, loc: tuple[str | int, ...]) -> None:
    """A ``FieldUnavailable`` (503, ``Retry-After``) when the live demo preparation has yet to register ``name`` in
    ``section`` (``models`` or ``datasets``); nothing otherwise (core/demo_status.py)."""
    from core import demo_status, registry

    coming = demo_status.preparing(registry.connection(settings), section, name)
    if coming is not None:
        field = ".".join(str(p) for p in loc[1:])
        raise FieldUnavailable(loc, f"{field}: {section[:-1]} {name!r} is being prepared (demo step "
                               f"{coming['step']!r}, {coming['state']}); retry in about {coming['retry_after_s']} s",
                               value=name, retry_after_s=coming["retry_after_s"])


def require_model(settings: Settings, name: str, kind: str, field: str = "model",
                  kind_label: str | None = None, also: tuple[str, ...] = ()) -> dict[str, Any]:
    """The registry entry of model ``name``, which must be of ``kind`` (or one of ``also``); a FieldError on
    ``field`` otherwise."""
    from core import registry

    entry = registry.get_model(settings, name)
    if entry is None:
        refuse_if_preparing(settings, "models", name, ("body", field))
        raise FieldError(("body", field), f"unknown model {name!r}", value=name)
    if entry.get("kind") != kind and entry.get("kind") not in also:
        wanted = " or ".join([kind_label or kind, *also])
        raise FieldError(("body", field), f"model {name!r} is a {entry.get('kind')!r} model, not {wanted}",
                         value=name)
    return entry
