"""Typed errors. Every failure the SDK reports is an :class:`ExplainqError`.

HTTP errors map by status onto :class:`APIError` subclasses that carry the server's ``code`` and ``message``;
a job that ends badly raises a :class:`JobError` carrying the job's own error code.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import httpx

__all__ = [
    "APIConnectionError", "APIError", "AuthenticationError", "ConflictError", "ExplainqError", "FieldError",
    "JobCanceledError", "JobError", "JobFailedError", "NotFoundError", "PayloadTooLargeError",
    "PermissionDeniedError", "RateLimitError", "ServerError", "ServiceUnavailableError", "ValidationError",
    "WaitTimeoutError", "error_from_response",
]


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds: a number of seconds or an HTTP date (RFC 9110 §10.2.3)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)


class JobLike(Protocol):
    """What an error says of the job it is about (a :class:`explainq_client.jobs.JobBase`)."""

    @property
    def id(self) -> str: ...

    @property
    def kind(self) -> str | None: ...

    @property
    def status(self) -> str: ...


class ExplainqError(Exception):
    """Base class of every error the SDK raises."""


class APIConnectionError(ExplainqError):
    """The server could not be reached (connection refused, reset, timed out), retries included."""


class APIError(ExplainqError):
    """The server answered with an error status.

    ``code`` and ``message`` come from the body's ``{"detail": {"code", "message"}}`` when present.
    """

    def __init__(self, response: httpx.Response, code: str, message: str, detail: Any = None):
        self.response = response
        self.status_code = response.status_code
        self.code = code
        self.message = message
        self.detail = detail
        super().__init__(f"{self.status_code} {code}: {message}")

    @property
    def retry_after(self) -> float | None:
        """The ``Retry-After`` the server sent, in seconds (None when absent or not a number)."""
        return parse_retry_after(self.response.headers.get("retry-after"))


@dataclass(frozen=True)
class FieldError:
    """One entry of a 422 answer: ``loc`` names the field, e.g. ``("body", "n_steps")``."""

    loc: tuple[str | int, ...]
    msg: str
    type: str = "value_error"
    input: Any = None

    @property
    def field(self) -> str:
        """The field as a dotted path without its location prefix: ``samples.0.history``."""
        parts = self.loc[1:] if self.loc and self.loc[0] in ("body", "query", "header", "path") else self.loc
        return ".".join(str(p) for p in parts)

    def __str__(self) -> str:
        return f"{self.field or '<request>'}: {self.msg}"


class ValidationError(APIError):
    """422: the request was refused; ``errors`` name each bad field (``errors[0].field``, ``.loc``)."""

    def __init__(self, response: httpx.Response, errors: list[FieldError]):
        self.errors = errors
        message = "; ".join(str(e) for e in errors) or "invalid request"
        super().__init__(response, "validation_error", message, [e.__dict__ for e in errors])

    @property
    def fields(self) -> list[str]:
        """The dotted names of the bad fields, in the server's order."""
        return [e.field for e in self.errors]


class AuthenticationError(APIError):
    """401: no API key, or an unknown one."""


class PermissionDeniedError(APIError):
    """403."""


class NotFoundError(APIError):
    """404: no such job (or model, or artifact) for this API key."""


class ConflictError(APIError):
    """409: the resource is in the wrong state (``already_finished``, ``not_ready``, another owner's model...)."""


class PayloadTooLargeError(APIError):
    """413: the request body is over the server's limit."""


class RateLimitError(APIError):
    """429 after the retries ran out; ``retry_after`` says when to try again."""


class ServiceUnavailableError(APIError):
    """503 after the retries ran out (for example ``redis_unavailable``)."""


class ServerError(APIError):
    """Any other 5xx."""


_BY_STATUS: dict[int, type[APIError]] = {
    401: AuthenticationError, 403: PermissionDeniedError, 404: NotFoundError, 409: ConflictError,
    413: PayloadTooLargeError, 429: RateLimitError, 503: ServiceUnavailableError,
}


def _field_errors(detail: list[Any]) -> list[FieldError]:
    out = []
    for item in detail:
        if isinstance(item, dict):
            out.append(FieldError(tuple(item.get("loc") or ()), str(item.get("msg", "")),
                                  str(item.get("type", "value_error")), item.get("input")))
        else:
            out.append(FieldError((), str(item)))
    return out


def error_from_response(response: httpx.Response) -> APIError:
    """The typed error for an error response (the body is read already)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    detail = body.get("detail") if isinstance(body, dict) else None
    if response.status_code == 422 and isinstance(detail, list):
        return ValidationError(response, _field_errors(detail))
    if isinstance(detail, dict):
        code = str(detail.get("code") or response.reason_phrase or "error")
        message = str(detail.get("message") or code)
    else:
        code = "http_" + str(response.status_code)
        message = str(detail) if detail is not None else (response.text[:500] or response.reason_phrase)
    cls = _BY_STATUS.get(response.status_code) or (ServerError if response.status_code >= 500 else APIError)
    if cls is APIError and response.status_code == 422:
        return ValidationError(response, [FieldError((), message)])
    return cls(response, code, message, detail)


class JobError(ExplainqError):
    """A job ended without a result. ``code`` and ``message`` are the job's ``error``; ``job`` is the job."""

    def __init__(self, job: JobLike, code: str, message: str):
        self.job = job
        self.code = code
        self.message = message
        super().__init__(f"job {job.id} ({job.kind}) {job.status}: {code}: {message}")


class JobFailedError(JobError):
    """The job failed (``code`` is the pipeline's, or ``worker_lost``, ``timeout``, ``out_of_memory``...)."""


class JobCanceledError(JobError):
    """The job was canceled (``code`` is ``canceled``)."""


class WaitTimeoutError(ExplainqError, TimeoutError):
    """``Job.wait(timeout=...)`` ran out of time; the job itself goes on (cancel it if it should stop)."""

    def __init__(self, job: JobLike, timeout: float):
        self.job = job
        self.timeout = timeout
        super().__init__(f"job {job.id} still {job.status} after {timeout:g}s")
