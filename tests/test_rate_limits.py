"""Rate limits per API key and per sign-in address (core/ratelimit.py): a token bucket in Redis, 429 with
Retry-After and the limit named; another key is unaffected; the bucket refills."""

from __future__ import annotations

import time

import pytest
import redis

from core import ratelimit
from tests.service import api_client

ALICE = {"Authorization": "Bearer key-a"}
BOB = {"Authorization": "Bearer key-b"}
LIMIT = ratelimit.Limit("test", rate=2.0, burst=3, setting="X")


def test_the_bucket_takes_its_burst_refuses_then_refills(redis_settings) -> None:
    r = redis.Redis.from_url(redis_settings.redis_url)
    now = 1_000_000.0
    assert [ratelimit.take(r, LIMIT, "alice", now=now).allowed for _ in range(4)] == [True, True, True, False]
    refused = ratelimit.take(r, LIMIT, "alice", now=now)
    assert not refused.allowed and refused.retry_after_s == pytest.approx(0.5) and refused.retry_after_header == "1"
    assert ratelimit.take(r, LIMIT, "bob", now=now).allowed  # another key's bucket is its own
    assert not ratelimit.take(r, LIMIT, "alice", now=now + 0.25).allowed  # half a token
    again = ratelimit.take(r, LIMIT, "alice", now=now + 0.5)  # one token back, taken
    assert again.allowed and again.tokens == pytest.approx(0.0)
    full = ratelimit.take(r, LIMIT, "alice", now=now + 60)  # refills to the burst, never past it
    assert full.allowed and full.tokens == pytest.approx(LIMIT.burst - 1)
    assert 0 < r.pttl(ratelimit.bucket_key("test", "alice")) <= 2000  # an idle bucket goes once it is full


def test_taking_is_atomic_under_concurrent_callers(redis_settings) -> None:
    """Eight threads race for a bucket of 50 at one instant: exactly 50 requests pass."""
    from concurrent.futures import ThreadPoolExecutor

    limit = ratelimit.Limit("race", rate=0.001, burst=50, setting="X")
    pool = redis.ConnectionPool.from_url(redis_settings.redis_url, max_connections=8)

    def one(_: int) -> bool:
        return ratelimit.take(redis.Redis(connection_pool=pool), limit, "carol", now=5.0).allowed

    with ThreadPoolExecutor(8) as ex:
        assert sum(ex.map(one, range(200))) == 50


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    home = tmp_path_factory.mktemp("rate-home")
    with api_client(home, EXPLAINQ_API_KEYS="alice:key-a,bob:key-b,alice:key-a2", EXPLAINQ_RATE_LIMIT_PER_S="1",
                    EXPLAINQ_RATE_LIMIT_BURST="5", EXPLAINQ_LOGIN_RATE_PER_MIN="1", EXPLAINQ_LOGIN_BURST="3") as client:
        yield client


def test_a_burst_past_the_limit_is_429_with_retry_after_and_another_key_is_unaffected(limited) -> None:
    start = time.monotonic()
    passed = 0
    while (r := limited.get("/jobs", headers=ALICE)).status_code == 200 and passed < 100:
        passed += 1
    elapsed = time.monotonic() - start
    assert r.status_code == 429, r.text
    assert 5 <= passed <= 5 + elapsed * 1 + 1  # the burst, and what refilled meanwhile
    detail = r.json()["detail"]
    assert detail["code"] == "rate_limited" and detail["limit"] == "EXPLAINQ_RATE_LIMIT_PER_S, EXPLAINQ_RATE_LIMIT_BURST"
    assert detail["burst"] == 5 and detail["rate_per_s"] == 1
    retry = int(r.headers["Retry-After"])
    assert 1 <= retry <= 1  # one token at 1 a second
    assert limited.get("/jobs", headers=BOB).status_code == 200
    time.sleep(detail["retry_after_s"] + 0.05)  # the refill the answer announced
    assert limited.get("/jobs", headers=ALICE).status_code == 200


def test_a_tenants_keys_share_one_bucket(limited) -> None:
    """A second key of the same tenant is no way around the limit; another tenant's key is."""
    while limited.get("/jobs", headers=ALICE).status_code == 200:
        pass
    r = limited.get("/jobs", headers={"Authorization": "Bearer key-a2"})
    assert r.status_code == 429 and r.json()["detail"]["code"] == "rate_limited", r.text
    assert limited.get("/jobs", headers=BOB).status_code == 200


def test_sign_in_attempts_are_limited_per_address(limited) -> None:
    codes = [limited.post("/ui/login", data={"api_key": "guess", "next": "/ui/jobs"},
                          follow_redirects=False).status_code for _ in range(4)]
    assert codes == [401, 401, 401, 429]
    r = limited.post("/ui/login", data={"api_key": "key-a", "next": "/ui/jobs"}, follow_redirects=False)
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1  # a right key too: attempts are counted
    assert "too many sign-in attempts" in r.text
