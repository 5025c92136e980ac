"""The dashboard against a hostile tenant or a stolen cookie: server-side sessions that sign-out and key removal
end at once, and the security headers (a Content-Security-Policy with no inline script, no framing, no sniffing,
no referrer to other sites) on every response. Only Redis and the app are needed (no worker)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from app.main import create_app
from app.ui import session as ui_session
from core import keys
from core.settings import Settings

KEYS = "alice:adv-key-alice-0123456789,bob:adv-key-bob-0123456789"
ALICE, BOB = "adv-key-alice-0123456789", "adv-key-bob-0123456789"
ORIGIN = {"Origin": "http://testserver"}


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("adversarial-dashboard")


@pytest.fixture(scope="module")
def settings(home, redis_server) -> Settings:
    redis.Redis.from_url(redis_server.url).flushdb()
    return Settings(EXPLAINQ_HOME=str(home), REDIS_URL=redis_server.url, EXPLAINQ_API_KEYS=KEYS)


@pytest.fixture(scope="module")
def client(settings):
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture
def c(client) -> TestClient:
    client.cookies.clear()
    return client


def _sign_in(c: TestClient, key: str) -> str:
    c.cookies.clear()
    r = c.post("/ui/login", data={"api_key": key, "next": "/ui/jobs"}, headers=ORIGIN, follow_redirects=False)
    assert r.status_code == 303, r.text
    return c.cookies[ui_session.COOKIE]


def _csrf(c: TestClient) -> str:
    r = c.get("/ui/jobs")
    assert r.status_code == 200, r.text
    return re.search(r'name="csrf_token" value="([^"]+)"', r.text).group(1)


def _with_cookie(c: TestClient, value: str) -> TestClient:
    c.cookies.clear()
    c.cookies.set(ui_session.COOKIE, value)
    return c


def _signed_in(c: TestClient) -> bool:
    r = c.get("/ui/jobs", follow_redirects=False)
    assert r.status_code in (200, 303), r.text
    return r.status_code == 200


def _session_keys(settings: Settings) -> list[bytes]:
    return sorted(redis.Redis.from_url(settings.redis_url).scan_iter(match=keys.ui_session("*")))


# --------------------------------------------------------------------------------------------------- sessions
def test_a_session_lives_in_redis_under_a_random_id_with_a_ttl(c, settings) -> None:
    before = set(_session_keys(settings))
    cookie = _sign_in(c, ALICE)
    assert ALICE not in cookie
    (new,) = set(_session_keys(settings)) - before
    ttl = redis.Redis.from_url(settings.redis_url).ttl(new)
    assert 0 < ttl <= ui_session.MAX_AGE_S
    assert _signed_in(c)
    token = _csrf(c)
    c.post("/ui/logout", data={"csrf_token": token}, headers=ORIGIN, follow_redirects=False)
    assert new not in set(_session_keys(settings))  # sign-out deletes the record at once


def test_a_signed_out_cookie_is_refused_when_replayed(c) -> None:
    old = _sign_in(c, ALICE)
    token = _csrf(c)
    assert c.get("/jobs").status_code == 200  # the cookie authenticates API GETs too
    r = c.post("/ui/logout", data={"csrf_token": token}, headers=ORIGIN, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"

    # The cookie a thief copied before sign-out (or a browser that kept it) is worth nothing now.
    _with_cookie(c, old)
    assert not _signed_in(c)
    assert c.get("/jobs").status_code == 401
    r = c.post("/test/sleep", json={"steps": 1, "step_s": 0}, headers={"X-CSRF-Token": token})
    assert r.status_code == 401
    r = c.post("/ui/new/test_sleep", data={"csrf_token": token, "steps": "1", "step_s": "0"}, headers=ORIGIN,
               follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")


def test_a_session_whose_api_key_was_removed_or_replaced_is_refused(c, settings) -> None:
    alice = _sign_in(c, ALICE)
    bob = _sign_in(c, BOB)
    # The same Redis, the configuration without alice's key (a restart, or another API host already updated),
    # then with a new key for alice.
    for configured in ("bob:adv-key-bob-0123456789", "alice:adv-key-alice-rotated-000,bob:adv-key-bob-0123456789"):
        changed = Settings(EXPLAINQ_HOME=str(settings.home), REDIS_URL=settings.redis_url,
                           EXPLAINQ_API_KEYS=configured)
        with TestClient(create_app(changed)) as other:
            _with_cookie(other, alice)
            assert not _signed_in(other)
            assert other.get("/jobs").status_code == 401
            _with_cookie(other, bob)
            assert _signed_in(other)
            assert other.get("/jobs").status_code == 200


def test_the_csrf_token_is_the_sessions_own(c) -> None:
    _sign_in(c, ALICE)
    alice_token = _csrf(c)
    _sign_in(c, BOB)
    bob_token = _csrf(c)
    assert alice_token != bob_token
    r = c.post("/test/sleep", json={"steps": 1, "step_s": 0}, headers={"X-CSRF-Token": alice_token})
    assert r.status_code == 401  # bob's cookie with alice's token
    r = c.post("/ui/new/test_sleep", data={"csrf_token": alice_token, "steps": "1"}, headers=ORIGIN)
    assert r.status_code == 403
    r = c.post("/test/sleep", json={"steps": 1, "step_s": 0}, headers={"X-CSRF-Token": bob_token})
    assert r.status_code == 202, r.text


def test_signing_in_again_replaces_the_earlier_session(c) -> None:
    first = _sign_in(c, ALICE)
    r = c.post("/ui/login", data={"api_key": ALICE, "next": "/ui/jobs"}, headers=ORIGIN, follow_redirects=False)
    assert r.status_code == 303
    second = c.cookies[ui_session.COOKIE]
    assert second != first
    assert not _signed_in(_with_cookie(c, first))
    assert _signed_in(_with_cookie(c, second))
