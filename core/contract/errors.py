"""A request field that is well-formed but wrong for this server: 422, or 404 / 409 / 503 by what it names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class FieldError(ValueError):
    """A request field that is well-formed but wrong for this server (unknown model, path outside roots...).

    Rendered as a 422 in FastAPI's error shape, with ``loc`` naming the field. ``related`` names other fields the
    same problem involves, as ``(loc, value)`` pairs (a size that is the product of two fields): each gets an entry
    with the same message.
    """

    def __init__(self, loc: tuple[str | int, ...] | list[str | int], message: str, value: Any = None,
                 related: Sequence[tuple[tuple[str | int, ...], Any]] = ()):
        super().__init__(message)
        self.loc = tuple(loc)
        self.message = message
        self.value = value
        self.related = [(tuple(rloc), rvalue) for rloc, rvalue in related]

    status_code = 422
    code = "invalid"

    def detail(self) -> dict[str, Any]:
        return {"loc": list(self.loc), "msg": self.message, "type": "value_error", "input": self.value}

    def body(self) -> dict[str, Any]:
        """The response body: FastAPI's validation shape for 422, ``{"detail": {code, message, loc}}`` otherwise."""
        if self.status_code == 422:
            return {"detail": [self.detail()] + [{**self.detail(), "loc": list(rloc), "input": rvalue}
                                                 for rloc, rvalue in self.related]}
        return {"detail": {"code": self.code, "message": self.message, "loc": list(self.loc)}}


class FieldNotFound(FieldError):
    """A field naming something the caller may not see: another owner's job answers exactly as a missing one."""

    status_code = 404
    code = "not_found"


class FieldConflict(FieldError):
    """A field naming something that exists but belongs to another owner (a model name, say)."""

    status_code = 409
    code = "owned_by_other"


class FieldReserved(FieldConflict):
    """A field naming, for something the caller would register, a name the service keeps for its own shipped data
    or demo models."""

    code = "reserved_name"


class FieldTooLarge(FieldError):
    """A field naming a file too large to read within the service's bounds (a parse past its memory limit): 413."""

    status_code = 413
    code = "too_large"


class FieldUnavailable(FieldError):
    """A field naming something that is being prepared (a demo model not registered yet): 503 with
    ``Retry-After``, the seconds until it should be ready."""

    status_code = 503
    code = "preparing"

    def __init__(self, loc: tuple[str | int, ...] | list[str | int], message: str, value: Any = None,
                 retry_after_s: int = 30):
        super().__init__(loc, message, value=value)
        self.retry_after_s = retry_after_s




class FieldBusy(FieldUnavailable):
    """A field naming a file the server cannot read now: every bounded parser is busy (503, ``Retry-After``)."""

    code = "busy"
