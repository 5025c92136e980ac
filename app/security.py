"""Security headers on every response, API and dashboard alike: a raw ASGI middleware adding precomputed bytes.

- ``Content-Security-Policy``: scripts from this origin only (no inline script, no event-handler attributes, no
  eval: the dashboard's templates have none, and htmx is configured in ``base.html`` to need neither), styles from
  this origin only. Inline ``style=""`` attributes are allowed (``style-src 'self' 'unsafe-inline'`` with
  ``style-src-elem 'self'``): the heatmap's colours and the bars' widths are computed per value on the server and
  written as ``style`` attributes. No ``<style>`` element and no stylesheet from elsewhere is allowed (browsers
  without ``style-src-elem`` fall back to ``style-src`` and allow inline ``<style>`` too). Nothing may frame a page
  (``frame-ancestors 'none'``), forms post only here, ``<base>`` and plugins are refused.
- ``X-Frame-Options: DENY`` for browsers that predate ``frame-ancestors``; ``X-Content-Type-Options: nosniff``.
- ``Referrer-Policy: same-origin``: other sites get no referrer. Not ``no-referrer``: under it a browser sends
  ``Origin: null`` with same-origin form posts, and the dashboard's same-origin check would refuse its own forms.

FastAPI's API docs (``/docs``, its OAuth2 redirect page, ``/redoc``) load Swagger UI and ReDoc from
cdn.jsdelivr.net and start them with an inline script, so those paths only get :data:`DOCS_POLICY`, which allows
that CDN, inline scripts and styles, Google's fonts (ReDoc) and blob: workers (ReDoc's search). They show nothing
but the OpenAPI document, and they cannot be framed either.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

POLICY = "; ".join((
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self' 'unsafe-inline'",  # for style="" attributes: heatmap colours, bar widths
    "style-src-elem 'self'",
    "img-src 'self' data:",  # data: for the empty favicon (<link rel=icon href="data:,">)
    "connect-src 'self'",
    "font-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
))

_CDN = "https://cdn.jsdelivr.net"
DOCS_POLICY = "; ".join((
    "default-src 'self'",
    f"script-src 'self' 'unsafe-inline' {_CDN}",
    f"style-src 'self' 'unsafe-inline' {_CDN} https://fonts.googleapis.com",
    "img-src 'self' data: https://fastapi.tiangolo.com https://cdn.redoc.ly",
    "font-src 'self' https://fonts.gstatic.com",
    "worker-src 'self' blob:",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
))

_COMMON = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}

HEADERS: dict[str, str] = {"Content-Security-Policy": POLICY, **_COMMON}
DOCS_HEADERS: dict[str, str] = {"Content-Security-Policy": DOCS_POLICY, **_COMMON}


def _raw(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]


class SecurityHeaders:
    """Add :data:`HEADERS` to every HTTP response (:data:`DOCS_HEADERS` on ``docs_paths``).

    The headers are encoded once; a response costs one list concatenation. Register it last (outermost) so that
    responses of the other middleware (413 from ``BodySizeLimit``) get them too; a 500 from Starlette's
    outermost error handler is sent around every middleware, so that handler adds :data:`HEADERS` itself.
    """

    def __init__(self, app: ASGIApp, docs_paths: Iterable[str | None] = ()):
        self.app = app
        self.docs_paths = frozenset(p for p in docs_paths if p)
        self.headers = _raw(HEADERS)
        self.docs_headers = _raw(DOCS_HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        extra = self.docs_headers if path in self.docs_paths else self.headers

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)
