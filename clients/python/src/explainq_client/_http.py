"""What the sync and async clients share and that does no I/O: configuration, the retry rule, the SSE parser."""

from __future__ import annotations

import json
import os
import random
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import httpx

from explainq_client.errors import APIConnectionError, ExplainqError, error_from_response, parse_retry_after

DEFAULT_URL = "http://127.0.0.1:8000"
ENV_URL = "EXPLAINQ_URL"
ENV_API_KEY = "EXPLAINQ_API_KEY"
USER_AGENT = "explainq-client/0.1.0"
TERMINAL = ("succeeded", "failed", "canceled")
# An SSE stream sends a keep-alive comment every 15 s; a read that waits longer than this means a dead link.
STREAM_READ_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RetryPolicy:
    """When to retry: 429 and 503 (after their ``Retry-After``), 409 ``idempotency_in_progress``, and
    connection failures, at most ``max_retries`` times. Without ``Retry-After`` the wait is exponential with
    jitter from ``backoff_s``. A ``Retry-After`` longer than ``max_delay_s`` is not waited out: the error is
    raised at once, carrying ``retry_after``. Retrying a submission is safe: it carries an ``Idempotency-Key``.
    """

    max_retries: int = 5
    backoff_s: float = 0.5
    max_delay_s: float = 60.0

    def backoff(self, attempt: int) -> float:
        base = min(self.backoff_s * 2 ** (attempt - 1), self.max_delay_s)
        return base * (0.5 + random.random() / 2)


NO_RETRY = RetryPolicy(max_retries=0)


def _retryable(response: httpx.Response) -> bool:
    if response.status_code in (429, 503):
        return True
    if response.status_code == 409:
        try:
            detail = response.json().get("detail")
        except (ValueError, AttributeError):
            return False
        return isinstance(detail, dict) and detail.get("code") == "idempotency_in_progress"
    return False


class RetryState:
    """The retry decisions for one logical request; the caller does the sleeping (sync or async)."""

    def __init__(self, policy: RetryPolicy):
        self.policy = policy
        self.attempt = 0

    def reset(self) -> None:
        self.attempt = 0

    def after_error(self, exc: Exception, what: str) -> float:
        """Seconds to wait before the next try after a connection failure (or a stream that ended early), or
        raise :class:`APIConnectionError` when out of tries."""
        if self.attempt >= self.policy.max_retries:
            raise APIConnectionError(f"{what}: {type(exc).__name__}: {exc}") from exc
        self.attempt += 1
        return self.policy.backoff(self.attempt)

    def after_response(self, response: httpx.Response) -> float | None:
        """None for a success; seconds to wait for a retryable error; raises the typed error otherwise.

        The body of an error response must have been read."""
        if response.is_success:
            return None
        if _retryable(response) and self.attempt < self.policy.max_retries:
            delay = parse_retry_after(response.headers.get("retry-after"))
            if delay is None:
                delay = self.policy.backoff(self.attempt + 1)
            if delay <= self.policy.max_delay_s:
                self.attempt += 1
                return delay
        raise error_from_response(response)


@dataclass(frozen=True)
class ClientConfig:
    """Where the server is and how to reach it. Defaults: ``EXPLAINQ_URL``, ``EXPLAINQ_API_KEY``."""

    base_url: str
    api_key: str | None
    timeout: httpx.Timeout
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    @classmethod
    def resolve(cls, base_url: str | None, api_key: str | None, timeout: float | httpx.Timeout,
                max_retries: int | None, retry: RetryPolicy | None) -> ClientConfig:
        url = (base_url or os.environ.get(ENV_URL) or DEFAULT_URL).rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ExplainqError(f"base_url must start with http:// or https://, got {url!r}")
        key = api_key if api_key is not None else (os.environ.get(ENV_API_KEY) or None)
        policy = retry or RetryPolicy()
        if max_retries is not None:
            policy = RetryPolicy(max_retries, policy.backoff_s, policy.max_delay_s)
        return cls(url, key, timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout), policy)

    def headers(self) -> dict[str, str]:
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def stream_timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout.connect, read=STREAM_READ_TIMEOUT_S, write=self.timeout.write,
                             pool=self.timeout.pool)


def new_idempotency_key() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class JobEvent:
    """One server-sent event of ``GET /jobs/{id}/events``.

    ``event`` is a status (``queued``, ``running``, ``succeeded``, ``failed``, ``canceled``) whose ``data`` is
    the job view, or ``end`` (``data`` is ``{"status"}``), or ``gone`` (the job vanished)."""

    event: str
    data: dict[str, Any]

    @property
    def job(self) -> dict[str, Any] | None:
        """The job view for a status event; None for ``end`` and ``gone``."""
        return self.data if self.event not in ("end", "gone") else None

    @property
    def progress(self) -> dict[str, Any] | None:
        return self.job.get("progress") if self.job else None

    @property
    def status(self) -> str | None:
        return self.data.get("status")


class SSEParser:
    """Server-sent events (the WHATWG event-stream format) from text lines, one line at a time."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> JobEvent | None:
        """Take one line (without its end of line); returns an event when a blank line completes one."""
        if line == "":
            if not self._data and not self._event:
                return None
            name, data = self._event or "message", "\n".join(self._data)
            self._event, self._data = "", []
            try:
                payload = json.loads(data) if data else {}
            except ValueError:
                payload = {"text": data}
            return JobEvent(name, payload if isinstance(payload, dict) else {"value": payload})
        if line.startswith(":"):
            return None  # a comment: the server's keep-alive
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


def artifact_target(dest: Path, name: str) -> Path:
    """Where artifact ``name`` (relative, ``/``-separated) goes under ``dest``; refuses names that leave it."""
    rel = PurePosixPath(name)
    if rel.is_absolute() or not rel.parts or any(p in ("..", "") for p in rel.parts) or "\\" in name:
        raise ExplainqError(f"refusing to write artifact {name!r}: not a relative path inside the target")
    target = dest.joinpath(*rel.parts)
    if not target.resolve().is_relative_to(dest.resolve()):
        raise ExplainqError(f"refusing to write artifact {name!r}: it leaves {dest}")
    return target
