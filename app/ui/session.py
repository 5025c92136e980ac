"""The dashboard's sign-in sessions: server-side records in Redis, named by a random id in a signed cookie.

The cookie holds only a random session id, signed with itsdangerous under a server secret that is generated once
and kept in Redis (``explainq:ui:secret``, behind Redis's password), so every API process on every host accepts the
same cookies. The session itself is a Redis record (``explainq:ui:session:<digest of the id>``, expiring with the
session) holding ``{"f": fingerprint, "c": csrf}``:

- ``f`` names the API key by an HMAC under the server secret, never the key itself. A session whose key is no
  longer configured, or was replaced, is refused at once on every host that has the new configuration.
- ``c`` is the synchronizer token every dashboard form (and any non-GET API call made with the cookie) must echo
  back.

Signing out deletes the record, so a copy of the cookie is refused from that moment on, as is an expired one. With
auth off (no API keys), an anonymous session exists only to carry a CSRF token.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import HTTPConnection

from core import keys
from core.settings import Settings

COOKIE = "explainq_session"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
MAX_AGE_S = 12 * 3600
_SALT = "explainq-ui-session-id"  # a cookie of the earlier format (the fingerprint itself) never verifies
_ID_BYTES = 32


def load_secret(settings: Settings) -> bytes:
    """The server secret, created on first use (``SET NX``: concurrent first starts on any host agree)."""
    from core import registry

    r = registry.connection(settings)
    r.set(keys.UI_SECRET, secrets.token_bytes(32).hex(), nx=True)
    return bytes.fromhex(r.get(keys.UI_SECRET).decode())


@dataclass(frozen=True)
class Session:
    owner: str
    key: str | None  # the API key the dashboard calls the API with; None when auth is off
    csrf: str
    id: str = ""  # the random id the cookie carries (its record is ``keys.ui_session(record_name(id))``)


def record_name(session_id: str) -> str:
    """The record's name in Redis: a digest of the id, so that the names Redis lists are not cookies."""
    return hashlib.sha256(session_id.encode()).hexdigest()


class Sessions:
    """Issue, verify and end sessions for one app (its settings, secret and asyncio Redis client)."""

    def __init__(self, settings: Settings, redis: Any):
        self.settings = settings
        self.redis = redis
        self.secret = load_secret(settings)
        self.serializer = URLSafeTimedSerializer(self.secret, salt=_SALT)
        self._key_by_fingerprint = {self.fingerprint(key): key for key in settings.api_keys}

    def fingerprint(self, key: str) -> str:
        return hmac.new(self.secret, key.encode(), hashlib.sha256).hexdigest()[:32]

    def key_for(self, supplied: str) -> str | None:
        """The configured key equal to ``supplied`` (by digest: constant-time), or None."""
        return self.settings.api_key_for(supplied)

    async def issue(self, key: str | None) -> tuple[str, Session]:
        """A new session for ``key`` (None when auth is off): its record in Redis, and the cookie value naming it."""
        session_id = secrets.token_urlsafe(_ID_BYTES)
        csrf = secrets.token_urlsafe(24)
        record = json.dumps({"f": self.fingerprint(key) if key else "", "c": csrf})
        await self.redis.set(keys.ui_session(record_name(session_id)), record, ex=MAX_AGE_S)
        owner = self.settings.api_keys[key] if key else "anonymous"
        return self.serializer.dumps(session_id), Session(owner=owner, key=key, csrf=csrf, id=session_id)

    def session_id(self, conn: HTTPConnection) -> str | None:
        """The id the request's cookie carries, when its signature verifies and it is younger than a session."""
        value = conn.cookies.get(COOKIE)
        if not value:
            return None
        try:
            session_id = self.serializer.loads(value, max_age=MAX_AGE_S)
        except BadSignature:
            return None
        return session_id if isinstance(session_id, str) and 32 <= len(session_id) <= 64 else None

    async def read(self, conn: HTTPConnection) -> Session | None:
        """The session of the request's cookie, or None when absent, forged, expired, ended, or for a key that is
        no longer configured."""
        session_id = self.session_id(conn)
        if session_id is None:
            return None
        raw = await self.redis.get(keys.ui_session(record_name(session_id)))
        if raw is None:
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("c"), str) or not isinstance(data.get("f"), str):
            return None
        if not self.settings.api_keys:
            return Session(owner="anonymous", key=None, csrf=data["c"], id=session_id)
        key = self._key_by_fingerprint.get(data["f"]) if data["f"] else None
        if key is None:  # signed in with a key that was removed or replaced since (or while auth was off)
            return None
        return Session(owner=self.settings.api_keys[key], key=key, csrf=data["c"], id=session_id)

    async def end(self, session_id: str | None) -> None:
        """Delete a session's record: its cookie is refused from now on, wherever it is replayed."""
        if session_id:
            await self.redis.delete(keys.ui_session(record_name(session_id)))


def sessions(conn: HTTPConnection) -> Sessions:
    """The app's ``Sessions`` (created on first use so an app that never serves the dashboard writes no secret)."""
    state = conn.app.state
    found = getattr(state, "ui_sessions", None)
    if found is None:
        found = state.ui_sessions = Sessions(state.settings, state.aredis)
    return found


def csrf_ok(session: Session, token: str | None) -> bool:
    return bool(token) and hmac.compare_digest(session.csrf.encode(), token.encode())
