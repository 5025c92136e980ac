"""The dashboard's sign-in session: a signed cookie naming an API key by its fingerprint, never the key itself.

The cookie holds ``{"f": fingerprint, "c": csrf}`` signed with itsdangerous under a server secret that is
generated once and kept in Redis (``explainq:ui:secret``, behind Redis's password), so every API process on every
host accepts the same cookies. The fingerprint is an HMAC of the key under that secret: removing a key from
``EXPLAINQ_API_KEYS`` ends its sessions. ``csrf`` is the synchronizer token every dashboard form (and any
non-GET API call made with the cookie) must echo back.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import HTTPConnection

from core import keys
from core.settings import Settings

COOKIE = "explainq_session"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
MAX_AGE_S = 12 * 3600
_SALT = "explainq-ui-session"


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


class Sessions:
    """Issue and verify session cookies for one app (its settings and secret)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.secret = load_secret(settings)
        self.serializer = URLSafeTimedSerializer(self.secret, salt=_SALT)

    def fingerprint(self, key: str) -> str:
        return hmac.new(self.secret, key.encode(), hashlib.sha256).hexdigest()[:32]

    def key_for(self, supplied: str) -> str | None:
        """The configured key equal to ``supplied`` (by digest: constant-time), or None."""
        return self.settings.api_key_for(supplied)

    def issue(self, key: str | None) -> tuple[str, Session]:
        """A new cookie value for ``key`` (None when auth is off) with a fresh CSRF token."""
        csrf = secrets.token_urlsafe(24)
        value = self.serializer.dumps({"f": self.fingerprint(key) if key else "", "c": csrf})
        owner = self.settings.api_keys[key] if key else "anonymous"
        return value, Session(owner=owner, key=key, csrf=csrf)

    def read(self, conn: HTTPConnection) -> Session | None:
        """The session of the request's cookie, or None when absent, forged, expired or for a removed key."""
        value = conn.cookies.get(COOKIE)
        if not value:
            return None
        try:
            data = self.serializer.loads(value, max_age=MAX_AGE_S)
        except BadSignature:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("c"), str):
            return None
        keys = self.settings.api_keys
        if not keys:
            return Session(owner="anonymous", key=None, csrf=data["c"])
        fp = data.get("f")
        for key, name in keys.items():
            if isinstance(fp, str) and hmac.compare_digest(self.fingerprint(key), fp):
                return Session(owner=name, key=key, csrf=data["c"])
        return None


def sessions(conn: HTTPConnection) -> Sessions:
    """The app's ``Sessions`` (created on first use so an app that never serves the dashboard writes no secret)."""
    state = conn.app.state
    found = getattr(state, "ui_sessions", None)
    if found is None:
        found = state.ui_sessions = Sessions(state.settings)
    return found


def csrf_ok(session: Session, token: str | None) -> bool:
    return bool(token) and hmac.compare_digest(session.csrf.encode(), token.encode())
