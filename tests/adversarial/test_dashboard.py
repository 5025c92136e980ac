"""The dashboard against a hostile tenant or a stolen cookie: server-side sessions that sign-out and key removal
end at once, and the security headers (a Content-Security-Policy with no inline script, no framing, no sniffing,
no referrer to other sites) on every response. Only Redis and the app are needed (no worker)."""

from __future__ import annotations

import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from app.main import create_app
from app.ui import router as ui_router
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


# ---------------------------------------------------------------------------------------------- security headers
TEMPLATES = Path(ui_router.HERE) / "templates"


def _policy(value: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for part in value.split(";"):
        name, *sources = part.split()
        assert name not in out, f"{name} given twice"
        out[name] = sources
    return out


def _assert_hardened(r, where: str) -> dict[str, list[str]]:
    for name in ("content-security-policy", "x-frame-options", "x-content-type-options", "referrer-policy"):
        assert len(r.headers.get_list(name)) == 1, f"{where}: {name} is {r.headers.get_list(name)}"
    assert r.headers["x-frame-options"] == "DENY", where
    assert r.headers["x-content-type-options"] == "nosniff", where
    # Not no-referrer: with it a browser sends "Origin: null" on the dashboard's own form posts, which the
    # same-origin check must refuse. same-origin still sends nothing to other sites.
    assert r.headers["referrer-policy"] == "same-origin", where
    policy = _policy(r.headers["content-security-policy"])
    assert policy["frame-ancestors"] == ["'none'"], where
    return policy


def _assert_strict(policy: dict[str, list[str]], where: str) -> None:
    assert policy["default-src"] == ["'self'"], where
    assert policy["script-src"] == ["'self'"], where  # no inline script, no eval, nothing from elsewhere
    assert policy["style-src-elem"] == ["'self'"], where  # no <style> element, no stylesheet from elsewhere
    assert policy["object-src"] == ["'none'"] and policy["base-uri"] == ["'none'"], where
    assert policy["form-action"] == ["'self'"], where
    for name, sources in policy.items():
        # style="" attributes (the heatmap's colours, bars' widths) are the one inline thing allowed
        if name not in ("style-src", "style-src-attr"):
            assert not {"'unsafe-inline'", "'unsafe-eval'", "*", "data:", "https:"} & set(sources) or (
                name == "img-src" and sources == ["'self'", "data:"]), (where, name, sources)


def test_security_headers_on_api_dashboard_static_and_error_responses(c, settings) -> None:
    _sign_in(c, ALICE)
    job = c.post("/test/sleep", json={"steps": 1, "step_s": 0}, headers={"X-CSRF-Token": _csrf(c)}).json()["id"]
    responses = {
        "api": c.get("/health"),
        "api job": c.get(f"/jobs/{job}"),
        "api 404": c.get("/jobs/no-such-job"),
        "api 422": c.post("/test/sleep", json={"steps": "many"}, headers={"X-CSRF-Token": _csrf(c)}),
        "dashboard": c.get("/ui/jobs"),
        "dashboard job": c.get(f"/ui/jobs/{job}"),
        "dashboard fragment": c.get(f"/ui/jobs/{job}/body"),
        "static": c.get(f"{ui_router.STATIC_URL}/app.js"),
        "vendored": c.get(f"{ui_router.STATIC_URL}/vendor/htmx-2.0.11/htmx.min.js"),
        "openapi": c.get("/openapi.json"),
        "no route": c.get("/no/such/route"),
        "body too large": c.post("/test/sleep", content=b"{}",
                                 headers={"Content-Length": str(settings.max_body_bytes + 1)}),
    }
    c.cookies.clear()
    responses["signed out"] = c.get("/ui/jobs", follow_redirects=False)
    responses["login"] = c.get("/ui/login")
    responses["api 401"] = c.get("/jobs")
    expected = {"api 404": 404, "api 422": 422, "no route": 404, "body too large": 413, "signed out": 303,
                "api 401": 401}
    for where, r in responses.items():
        assert r.status_code == expected.get(where, 200), (where, r.status_code, r.text[:200])
        _assert_strict(_assert_hardened(r, where), where)


def test_an_internal_error_has_the_headers_too(settings) -> None:
    app = create_app(settings)

    async def boom() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/boom", boom)
    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.get("/boom")
    assert r.status_code == 500 and r.json()["detail"]["code"] == "internal"
    _assert_strict(_assert_hardened(r, "500"), "500")


class _Tags(HTMLParser):
    """Every start tag of a template, with its attributes (Jinja's tags and expressions are left as text)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.script_text: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag) -> None:
        self._in_script = False

    def handle_data(self, data) -> None:
        if self._in_script and data.strip():
            self.script_text.append(data.strip())


def test_no_template_has_inline_script_or_event_handler() -> None:
    found = sorted(TEMPLATES.glob("**/*.html"))
    assert len(found) >= 10
    for path in found:
        # Jinja's statements and comments go; what they enclose stays (every branch is checked)
        text = re.sub(r"\{%.*?%\}|\{#.*?#\}", " ", path.read_text(), flags=re.S)
        parser = _Tags()
        parser.feed(text)
        parser.close()
        where = path.name
        scripts = [a for t, a in parser.tags if t == "script"]
        assert len(scripts) == text.lower().count("<script"), where
        assert all(a.get("src") for a in scripts), f"{where}: a <script> without src"
        assert not parser.script_text, f"{where}: inline script {parser.script_text}"
        assert "<style" not in text.lower(), f"{where}: a <style> element"
        for tag, attrs in parser.tags:
            for name, value in attrs.items():
                name = name.lower()
                assert not name.startswith("on"), f"{where}: <{tag} {name}>"
                assert not name.startswith(("hx-on", "data-hx-on", "hx-vars", "data-hx-vars")), f"{where}: {name}"
                assert not (value or "").strip().lower().startswith(("javascript:", "js:")), f"{where}: {name}"
                if name == "hx-trigger":
                    assert "[" not in (value or ""), f"{where}: an htmx trigger filter is evaluated JavaScript"
        assert not re.search(r"\son[a-z]+\s*=", re.sub(r"\{\{.*?\}\}", "", text, flags=re.S)), where


def test_htmx_is_configured_to_need_neither_inline_style_nor_eval() -> None:
    """htmx adds a <style> element for its indicators and evaluates hx-on / trigger filters unless told not to."""
    import json

    parser = _Tags()
    parser.feed((TEMPLATES / "base.html").read_text())
    (meta,) = [a for t, a in parser.tags if t == "meta" and a.get("name") == "htmx-config"]
    config = json.loads(meta["content"])
    assert config["includeIndicatorStyles"] is False
    assert config["allowEval"] is False
    assert config["allowScriptTags"] is False


def test_api_docs_get_a_policy_of_their_own_that_lets_them_load(c) -> None:
    """FastAPI's /docs (Swagger UI) and /redoc load their scripts and styles from a CDN and start with an inline
    script: their pages (only) allow exactly that; they still cannot be framed."""
    strict = _policy(c.get("/health").headers["content-security-policy"])
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        r = c.get(path)
        assert r.status_code == 200, path
        policy = _assert_hardened(r, path)
        assert policy != strict and policy["object-src"] == ["'none'"] and policy["base-uri"] == ["'none'"]
        parser = _Tags()
        parser.feed(r.text)
        for tag, attrs in parser.tags:
            url = attrs.get("src") if tag == "script" else attrs.get("href") if tag == "link" else None
            if url and url.startswith("http"):
                origin = "/".join(url.split("/")[:3])
                directive = {"script": "script-src", "link": "style-src"}[tag]
                if tag == "link" and "icon" in (attrs.get("rel") or ""):
                    directive = "img-src"
                assert origin in policy[directive], (path, url, directive, policy[directive])
        if parser.script_text:
            assert "'unsafe-inline'" in policy["script-src"], path
    # the relaxed policy is for those pages only
    for path in ("/docsx", "/docs/x", "/ui/jobs", "/openapi.json"):
        assert _policy(c.get(path).headers["content-security-policy"]) == strict, path


# ----------------------------------------------------------------------------------------- in a real browser
CHROMIUM = next((p for p in (os.environ.get("EXPLAINQ_CHROMIUM"), shutil.which("chromium"),
                             shutil.which("chromium-browser"), "/usr/bin/chromium") if p and Path(p).is_file()), None)


@pytest.fixture(scope="module")
def served(settings):
    """The app over HTTP (uvicorn in a thread), as a browser sees it."""
    from tests.http_server import HttpServer

    with HttpServer(settings) as http:
        yield http.url


# Reports every violation as a console error (Chromium logs most of them anyway; this makes sure).
REPORT_VIOLATIONS = """document.addEventListener("securitypolicyviolation", function (e) {
  console.error("CSP violation: " + e.violatedDirective + " " + e.blockedURI);
});"""


def test_dashboard_pages_raise_no_csp_violation_in_a_browser(served) -> None:
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright)")
    if CHROMIUM is None:
        pytest.skip("no system Chromium found (apt-get install chromium, or set EXPLAINQ_CHROMIUM)")
    import httpx

    with httpx.Client(base_url=served, headers={"Authorization": f"Bearer {ALICE}"}) as api:
        job = api.post("/test/sleep", json={"steps": 1, "step_s": 0}).json()["id"]  # stays queued: no worker
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            context = browser.new_context(base_url=served)
            context.add_init_script(REPORT_VIOLATIONS)
            page = context.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(f"{page.url}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"{page.url}: page error: {e}"))

            first = page.goto("/ui/jobs")
            expect(page).to_have_url(re.compile(r"/ui/login\?next="))
            assert "script-src 'self'" in first.request.redirected_from.response().headers["content-security-policy"]
            page.fill("#api_key", ALICE)
            page.click("button[type=submit]")  # the sign-in form: same-origin check under the Referrer-Policy
            expect(page).to_have_url(re.compile(r"/ui/jobs$"))
            expect(page.locator(f"#row-{job} .badge")).to_have_text("queued")
            for path in ("/ui/new", "/ui/new/test_sleep", "/ui/models", f"/ui/jobs/{job}"):
                r = page.goto(path)
                assert r.ok and "frame-ancestors 'none'" in r.headers["content-security-policy"], path
                if path.startswith("/ui/jobs/"):
                    page.wait_for_timeout(500)  # the job's event stream stays open: the network is never idle
                else:
                    page.wait_for_load_state("networkidle")
            # htmx at work: the jobs list's live row and its cancel button (an htmx post with the CSRF token)
            page.goto("/ui/jobs")
            page.click(f"#row-{job} button[type=submit]")
            expect(page.locator(f"#row-{job} .badge")).to_have_text("canceled")
            assert errors == [], errors

            # What an injection would try is refused; what the pages themselves do is allowed.
            page.evaluate("""() => {
              const main = document.querySelector("main");
              main.insertAdjacentHTML("beforeend", '<img id="inj" src="data:," onerror="window.__pwned = 1">'
                + '<span id="attr" style="color: rgb(1, 2, 3)">x</span>');
              const s = document.createElement("script"); s.textContent = "window.__pwned = 2";
              document.head.appendChild(s);
            }""")
            page.wait_for_timeout(300)
            assert page.evaluate("window.__pwned") is None
            assert page.evaluate("getComputedStyle(document.getElementById('attr')).color") == "rgb(1, 2, 3)"
            assert errors and all("CSP violation: script-src" in e or "Content Security Policy" in e for e in errors), errors
            assert {"script-src-attr", "script-src-elem"} <= {w for e in errors for w in e.split() if w.startswith("script-src")}
            errors.clear()

            # Sign out through the page's own form: back at the sign-in page, with no violation on the way.
            page.goto("/ui/jobs")
            page.click("form.signout button[type=submit]")
            expect(page).to_have_url(re.compile(r"/ui/login"))
            assert errors == [], errors
        finally:
            browser.close()
