"""Per-tenant budgets, checked when a job is submitted (no torch).

- **Store bytes** (``EXPLAINQ_TENANT_STORE_BYTES``): what ``GET /usage`` counts as the tenant's stored bytes
  (models, datasets copied into the store, artifacts and stored results of their newest jobs). Sizing lists the
  store, so the figure is measured at most once per ``EXPLAINQ_USAGE_CACHE_S`` per tenant and kept in Redis;
  deleting a job or a model clears it. A tenant at or over the budget gets 413 ``store_budget_exceeded`` with the
  figures until they delete something: no new job can add to it.
- **Compute in flight** (``EXPLAINQ_TENANT_COMPUTE_S``): the estimated seconds of the tenant's queued and running
  jobs plus the new one's, each at its kind's mean run time on this service (``EXPLAINQ_BACKLOG_UNKNOWN_COST_S``
  for a kind that never ended, as the backlog's cost counts it: :mod:`core.backlog`). Past it, 429
  ``compute_budget_exceeded`` with the figures and a ``Retry-After`` of the excess (at least 5 s, at most an hour).

``0`` (the default of both) is no budget. The checks read only the caller's own records.
"""

from __future__ import annotations

import json
import math
from typing import Any

from core import keys, usage
from core.settings import Settings

MIN_RETRY_S, MAX_RETRY_S = 5, 3600


class BudgetExceeded(Exception):
    def __init__(self, code: str, status: int, limit: float, value: float, message: str, retry_after_s: int | None):
        super().__init__(message)
        self.code, self.status, self.limit, self.value = code, status, limit, value
        self.message, self.retry_after_s = message, retry_after_s

    def detail(self) -> dict[str, Any]:
        return {"code": self.code, "limit": self.limit, "value": self.value, "message": self.message}


def usage_cache_key(owner: str) -> str:
    return keys.usage_stored(owner)


def stored_bytes(settings: Settings, redis: Any, owner: str) -> int:
    """The tenant's stored bytes as ``GET /usage`` counts them, measured at most ``usage_cache_s`` ago."""
    raw = redis.get(usage_cache_key(owner))
    if raw is not None:
        try:
            return int(json.loads(raw)["bytes"])
        except (ValueError, KeyError, TypeError):
            pass
    measured = usage.stored(settings, redis, owner)
    remember(settings, redis, owner, measured)
    return int(measured["bytes"])


def remember(settings: Settings, redis: Any, owner: str, measured: dict[str, Any]) -> None:
    if settings.usage_cache_s > 0:
        redis.set(usage_cache_key(owner), json.dumps({"bytes": int(measured["bytes"])}), ex=settings.usage_cache_s)


def forget(redis: Any, owner: str) -> None:
    """Drop the cached figure (after a deletion: the next check measures again)."""
    redis.delete(usage_cache_key(owner))


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def check(settings: Settings, redis: Any, owner: str, kind: str) -> None:
    """Raise :class:`BudgetExceeded` when the tenant is past a budget (see the module's text)."""
    if settings.tenant_store_bytes > 0:
        used = stored_bytes(settings, redis, owner)
        if used >= settings.tenant_store_bytes:
            raise BudgetExceeded(
                "store_budget_exceeded", 413, settings.tenant_store_bytes, used,
                f"you store {_mib(used)}, at or over your budget of {_mib(settings.tenant_store_bytes)} "
                "(EXPLAINQ_TENANT_STORE_BYTES; GET /usage itemises it): delete finished jobs (DELETE /jobs/{id}), "
                "models or datasets you no longer need, then submit again", None)
    if settings.tenant_compute_s > 0:
        seconds, mean = usage.compute_in_flight(settings, redis, owner)
        own = mean.get(kind, settings.backlog_unknown_cost_s)
        total = seconds + own
        if total > settings.tenant_compute_s:
            excess = total - settings.tenant_compute_s
            retry = int(min(max(math.ceil(excess), MIN_RETRY_S), MAX_RETRY_S))
            raise BudgetExceeded(
                "compute_budget_exceeded", 429, settings.tenant_compute_s, round(total, 1),
                f"your queued and running jobs come to about {seconds:,.0f} s of work and this {kind} job to about "
                f"{own:,.0f} s more, over your budget of {settings.tenant_compute_s:,.0f} s in flight "
                "(EXPLAINQ_TENANT_COMPUTE_S): wait for some to end, or cancel one", retry)
