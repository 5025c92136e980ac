"""Rate limits: one token bucket per tenant (the owner an API key names: a tenant's several keys and its dashboard
sessions share it, so more keys never mean more requests), and one per client address for dashboard sign-ins, kept
in Redis.

A bucket holds up to ``burst`` tokens and gains ``rate`` tokens a second; each request takes one. Taking is one
Lua script (:data:`TAKE`), so every API process shares the bucket and two requests never take the same token. The
clock is Redis's own (``TIME``), so API hosts with skewed clocks agree. A request that finds the bucket empty is
refused with the seconds until a token is there (the caller answers ``429`` with ``Retry-After``).

The buckets (``explainq:ratelimit:<scope>:<who>``) expire once they would be full again, so an idle key costs
nothing. No torch, no FastAPI.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from core.keys import RATELIMIT_PREFIX as PREFIX

log = logging.getLogger("explainq.ratelimit")

# KEYS[1]: the bucket. ARGV: rate (tokens/s), burst, cost, now (seconds; empty: Redis's clock).
# Returns {allowed (0/1), seconds until `cost` tokens are there (string), tokens left (string)}.
TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1])
local ts = tonumber(b[2])
if tokens == nil or ts == nil then
  tokens = burst
  ts = now
end
if now > ts then
  tokens = math.min(burst, tokens + (now - ts) * rate)
  ts = now
end
local allowed = 0
local wait = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  wait = (cost - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(ts))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return {allowed, tostring(wait), tostring(tokens)}
"""


@dataclass(frozen=True)
class Limit:
    """A bucket's shape: ``rate`` tokens a second, at most ``burst``; ``setting`` names the variables that set it."""

    scope: str
    rate: float
    burst: int
    setting: str

    @property
    def enabled(self) -> bool:
        return self.rate > 0 and self.burst > 0


@dataclass(frozen=True)
class Taken:
    allowed: bool
    retry_after_s: float
    tokens: float

    @property
    def retry_after_header(self) -> str:
        """``Retry-After``: whole seconds, at least 1."""
        return str(max(1, math.ceil(self.retry_after_s)))


def bucket_key(scope: str, who: str) -> str:
    return f"{PREFIX}{scope}:{who}"


def _parse(raw: Any) -> Taken:
    allowed, wait, tokens = raw
    return Taken(bool(int(allowed)), float(wait), float(tokens))


# A Redis that refuses the bucket's write (out of memory, a read-only replica, unreachable) lets the request
# through: the request's own writes then fail as they would without a limit (503 redis_unavailable), and its
# reads keep working, so an outage of the limiter never takes down more than the outage itself does.
OPEN = Taken(True, 0.0, float("nan"))


async def atake(aredis: Any, limit: Limit, who: str, now: float | None = None, cost: int = 1) -> Taken:
    """Take ``cost`` tokens from ``who``'s bucket of ``limit`` (asyncio Redis client); fails open (``OPEN``)."""
    try:
        raw = await aredis.eval(TAKE, 1, bucket_key(limit.scope, who), limit.rate, limit.burst, cost,
                                "" if now is None else repr(now))
    except RedisError as exc:
        log.warning("rate limit not applied: redis error (%s)", type(exc).__name__)
        return OPEN
    return _parse(raw)


def take(redis: Any, limit: Limit, who: str, now: float | None = None, cost: int = 1) -> Taken:
    """:func:`atake` on a synchronous client."""
    raw = redis.eval(TAKE, 1, bucket_key(limit.scope, who), limit.rate, limit.burst, cost,
                     "" if now is None else repr(now))
    return _parse(raw)


def refusal(limit: Limit, taken: Taken, who_label: str) -> dict[str, Any]:
    """The JSON detail of a 429: the limit by name and figures, and when to retry."""
    return {"code": "rate_limited",
            "message": f"more than {limit.burst} requests at once or {limit.rate:g} a second for {who_label} "
                       f"({limit.setting}); retry in {taken.retry_after_header} s",
            "limit": limit.setting, "rate_per_s": limit.rate, "burst": limit.burst,
            "retry_after_s": round(taken.retry_after_s, 3)}
