"""The dashboard's pages over HTTP: sign-in and the session cookie, CSRF, the generated forms, the jobs list,
its live rows and ownership. A real service (private Redis, a real worker) behind the real app."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.ui import router as ui_router
from app.ui.session import COOKIE
from core import registry
from core.settings import Settings

KEYS = "alice:pages-key-alice-0123456789,bob:pages-key-bob-0123456789"
ALICE, BOB = "pages-key-alice-0123456789", "pages-key-bob-0123456789"


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    from tests.service import Service

    home = tmp_path_factory.mktemp("ui-pages")
    with Service(home, api_keys=KEYS, heartbeat_ttl_s=20) as s:
        listed = home / "models" / "news-listed"  # listed by GET /models, never loaded by a job here
        listed.mkdir(parents=True)
        (listed / "config.json").write_text("{}")
        registry.register_model(s.settings, "news-listed", kind="news", loader="models.news.checkpoint:load",
                                path=listed, parameters=1234)
        yield s


def _client(svc, key: str | None) -> TestClient:
    """The service's client as a browser signed in with ``key`` (None: signed out). One client for all users:
    the app's async Redis pool is bound to its event loop."""
    c = svc.client
    c.cookies.clear()
    if key is not None:
        r = c.post("/ui/login", data={"api_key": key, "next": "/ui/jobs"}, follow_redirects=False)
        assert r.status_code == 303, r.text
    return c


def _csrf(c: TestClient, path: str = "/ui/jobs") -> str:
    r = c.get(path)
    assert r.status_code == 200, r.text
    return re.search(r'name="csrf_token" value="([^"]+)"', r.text).group(1)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _sleep_job(svc, key: str = ALICE, steps: int = 2, step_s: float = 0.0) -> str:
    r = svc.client.post("/test/sleep", json={"steps": steps, "step_s": step_s}, headers=_bearer(key))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def test_pages_need_sign_in_and_the_cookie_is_signed_httponly_and_strict(svc) -> None:
    c = _client(svc, None)
    r = c.get("/ui/jobs?status=running", follow_redirects=False)
    assert r.status_code == 303
    assert parse_qs(urlsplit(r.headers["location"]).query)["next"] == ["/ui/jobs?status=running"]
    r = c.post("/ui/login", data={"api_key": "wrong", "next": "/ui/models"}, follow_redirects=False)
    assert r.status_code == 401 and "unknown API key" in r.text and COOKIE not in r.headers.get("set-cookie", "")
    r = c.post("/ui/login", data={"api_key": ALICE, "next": "//evil.example/x"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/jobs"  # never an off-site redirect
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower() and ALICE not in cookie
    assert c.get("/ui/jobs").status_code == 200
    # the signing secret is in Redis, so an API process on another host (another home) accepts the same cookie
    from app.main import create_app
    from core.keys import UI_SECRET
    from core.settings import Settings

    assert len(svc.redis().get(UI_SECRET)) == 64
    other = Settings(EXPLAINQ_HOME=str(svc.home / "other-host"), REDIS_URL=svc.settings.redis_url,
                     EXPLAINQ_API_KEYS=svc.settings.api_keys_raw)
    with TestClient(create_app(other)) as c2:
        c2.cookies.set(COOKIE, c.cookies[COOKIE])
        assert c2.get("/ui/jobs", follow_redirects=False).status_code == 200
    tampered = c.cookies[COOKIE][:-3] + ("abc" if not c.cookies[COOKIE].endswith("abc") else "xyz")
    c.cookies.clear()
    c.cookies.set(COOKIE, tampered)
    assert c.get("/ui/jobs", follow_redirects=False).status_code == 303


def test_sign_in_through_another_site_is_refused(svc) -> None:
    c = _client(svc, None)
    r = c.post("/ui/login", data={"api_key": ALICE}, headers={"Origin": "http://evil.example"},
               follow_redirects=False)
    assert r.status_code == 403 and COOKIE not in r.headers.get("set-cookie", "")


def test_the_cookie_authenticates_api_gets_and_other_methods_only_with_the_csrf_token(svc) -> None:
    job_id = _sleep_job(svc, steps=200, step_s=0.05)
    c = _client(svc, ALICE)
    assert c.get(f"/jobs/{job_id}").json()["id"] == job_id
    with c.stream("GET", f"/jobs/{job_id}/events") as s:  # what a browser's EventSource does
        assert s.status_code == 200
        first = next(line for line in s.iter_lines() if line.startswith("event:"))
        assert first in ("event: queued", "event: running")
    assert c.delete(f"/jobs/{job_id}").status_code == 401
    assert c.delete(f"/jobs/{job_id}", headers={"X-CSRF-Token": "forged"}).status_code == 401
    token = _csrf(c)
    assert c.delete(f"/jobs/{job_id}", headers={"X-CSRF-Token": token}).status_code == 202
    assert svc.wait(job_id, headers=_bearer(ALICE))["status"] == "canceled"


def test_cancel_form_needs_the_csrf_token_and_the_same_origin(svc) -> None:
    job_id = _sleep_job(svc, steps=200, step_s=0.05)
    c = _client(svc, ALICE)
    token = _csrf(c)
    url = f"/ui/jobs/{job_id}/cancel"
    assert c.post(url, data={}).status_code == 403
    assert c.post(url, data={"csrf_token": "forged"}).status_code == 403
    r = c.post(url, data={"csrf_token": token}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "another site" in r.text
    r = c.post(url, data={"csrf_token": token, "next": f"/ui/jobs/{job_id}"}, headers={"Origin": "http://testserver"},
               follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/ui/jobs/{job_id}"
    assert svc.wait(job_id, headers=_bearer(ALICE))["status"] == "canceled"
    # htmx's cancel gets the row back; a finished job cannot be canceled again and shows how it ended
    r = c.post(url, data={"csrf_token": token}, headers={"HX-Request": "true"})
    assert r.status_code == 200 and "st-canceled" in r.text and "Cancel</button>" not in r.text


def test_another_users_job_is_not_found(svc) -> None:
    job_id = _sleep_job(svc, key=ALICE)
    r = _client(svc, BOB).get(f"/ui/jobs/{job_id}")
    assert r.status_code == 404 and "not_found" in r.text and job_id in r.text
    assert _client(svc, ALICE).get(f"/ui/jobs/{job_id}").status_code == 200


def test_form_fields_and_limits_come_from_the_request_schema(svc) -> None:
    c = _client(svc, ALICE)
    html = c.get("/ui/new/test_sleep").text
    assert re.search(r'<input id="f-steps" name="steps" type="number" value="5"[^>]*min="1" max="10000" step="1"',
                     html), html
    bdh = c.get("/ui/new/train_bdh").text
    assert re.search(r'id="f-model-n_layer" name="model.n_layer" type="number" value="6"[^>]*min="1" max="64"', bdh)
    assert re.search(r'<select id="f-dataset" name="dataset"[^>]*>\s*<option value="digits" selected', bdh)
    attributions = c.get("/ui/new/attributions").text
    assert re.search(r'<select id="f-model" name="model" required[^>]*>\s*<option value="news-listed"', attributions)
    assert 'name="sample.candidate"' in attributions and 'name="dataset.__on"' in attributions
    # an optional choice with no default starts unset, so the server's default applies (the rule for a tolerance)
    assert re.search(r'<select id="f-method" name="method"[^>]*>\s*<option value="" selected>', attributions)
    resume = c.get("/ui/new/train_bdh?resume_from=abc123&bogus=1").text
    assert 'name="resume_from" type="text" value="abc123"' in resume and "bogus" not in resume
    job_id = _sleep_job(svc)  # no checkpoint artifact: the form asks for the same architecture
    resume = c.get(f"/ui/new/train_bdh?resume_from={job_id}").text
    assert f'value="{job_id}"' in resume and "Set the same architecture" in resume
    assert c.get("/ui/new/nope").status_code == 404
    index = c.get("/ui/new").text
    for kind in ("attributions", "tracin", "train_bdh", "train_conve", "ablations"):
        assert f'href="/ui/new/{kind}"' in index


def test_submitting_the_form_opens_the_job_and_a_resubmit_is_the_same_job(svc) -> None:
    c = _client(svc, ALICE)
    form = {"csrf_token": _csrf(c, "/ui/new/test_sleep"), "idempotency_key": "ui-test-1", "steps": "2",
            "step_s": "0"}
    r = c.post("/ui/new/test_sleep", data=form, follow_redirects=False)
    assert r.status_code == 303, r.text
    job_id = r.headers["location"].rsplit("/", 1)[1]
    again = c.post("/ui/new/test_sleep", data=form, follow_redirects=False)
    assert again.headers["location"] == r.headers["location"]
    job = svc.wait(job_id, headers=_bearer(ALICE))
    assert job["status"] == "succeeded"
    page = c.get(f"/ui/jobs/{job_id}").text
    assert "st-succeeded" in page and "out.txt" in page and "2 / 2 steps" in page


def test_a_rejected_field_is_marked_on_that_field_and_the_values_are_kept(svc) -> None:
    c = _client(svc, ALICE)
    token = _csrf(c, "/ui/new/test_sleep")
    r = c.post("/ui/new/test_sleep", data={"csrf_token": token, "steps": "0", "step_s": "0.5"})
    assert r.status_code == 422
    assert re.search(r'id="f-steps-err" role="alert">Input should be greater than or equal to 1<', r.text), r.text
    assert 'name="step_s" type="number" value="0.5"' in r.text
    r = c.post("/ui/new/train_bdh", data={"csrf_token": token, "model.n_embd": "30", "model.n_head": "4"})
    assert r.status_code == 422
    assert re.search(r'id="f-model-n_head-err" role="alert">[^<]*divisible', r.text)
    r = c.post("/ui/new/attributions", data={"csrf_token": token, "model": "no-such-model",
                                             "sample.candidate": "Lakers win", "sample.history": "a\nb"})
    assert r.status_code == 422 and re.search(r'id="f-model-err" role="alert">unknown model', r.text)
    r = c.post("/ui/new/attributions", data={"csrf_token": token, "model": "news-listed", "sample.candidate": "x"})
    assert r.status_code == 422 and 'id="f-sample-history-err"' in r.text


def test_jobs_list_filters_pages_and_streams_live_rows(svc, monkeypatch) -> None:
    c = _client(svc, BOB)
    ids = [_sleep_job(svc, key=BOB) for _ in range(3)]
    for job_id in ids:
        svc.wait(job_id, headers=_bearer(BOB))
    monkeypatch.setattr(ui_router, "JOBS_PER_PAGE", 2)
    first = c.get("/ui/jobs?kind=test_sleep").text
    shown = re.findall(r'<tr id="row-([0-9a-f]{32})"', first)
    assert shown == ids[::-1][:2]  # newest first
    older = re.search(r'<a href="([^"]+)" rel="next">', first).group(1).replace("&amp;", "&")
    second = c.get(older).text
    assert re.findall(r'<tr id="row-([0-9a-f]{32})"', second) == [ids[0]]
    newer = re.search(r'<a href="([^"]+)" rel="prev">', second).group(1).replace("&amp;", "&")
    assert re.findall(r'<tr id="row-([0-9a-f]{32})"', c.get(newer).text) == shown
    assert 'rel="next"' not in second
    assert "row-" not in c.get("/ui/jobs?status=failed").text
    assert c.get("/ui/jobs?status=bogus").status_code == 422

    running = _sleep_job(svc, key=BOB, steps=6, step_s=0.1)
    page = c.get("/ui/jobs").text
    assert f'sse-swap="job-{running}"' in page and f"/ui/jobs/live?ids={running}" in page
    events = []
    with c.stream("GET", f"/ui/jobs/live?ids={running},{ids[0]}") as s:
        name = None
        for line in s.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
                events.append([name, ""])
            elif line.startswith("data: "):
                events[-1][1] += line[6:] + "\n"
    names = [e[0] for e in events]
    assert names[-1] == "done" and set(names[:-1]) == {f"job-{running}", f"job-{ids[0]}"}
    last_row = [d for n, d in events if n == f"job-{running}"][-1]
    assert "st-succeeded" in last_row and "6 / 6 steps" in last_row
    assert any("st-running" in d or "st-queued" in d for n, d in events if n == f"job-{running}")


def test_models_page_lists_the_registry(svc) -> None:
    html = _client(svc, ALICE).get("/ui/models").text
    assert "news-listed" in html and "1,234" in html


def test_without_keys_there_is_no_sign_in_but_forms_still_need_the_token(svc) -> None:
    settings = Settings(EXPLAINQ_HOME=str(svc.home), REDIS_URL=svc.redis_server.url)
    with TestClient(create_app(settings)) as c:
        assert c.get("/ui/login", follow_redirects=False).headers["location"] == "/ui/jobs"
        r = c.get("/ui/jobs")
        assert r.status_code == 200 and "Sign out" not in r.text
        assert c.post("/ui/new/test_sleep", data={"steps": "1"}).status_code == 403
        token = re.search(r'name="csrf_token" value="([^"]+)"', c.get("/ui/new/test_sleep").text).group(1)
        r = c.post("/ui/new/test_sleep", data={"csrf_token": token, "steps": "1", "step_s": "0"},
                   follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/jobs/")


def test_static_files_are_vendored_with_their_licences(svc) -> None:
    c = svc.client
    for path in ("htmx-2.0.11/htmx.min.js", "htmx-ext-sse-2.2.4/sse.min.js", "uplot-1.6.32/uPlot.iife.min.js",
                 "htmx-2.0.11/LICENSE", "htmx-ext-sse-2.2.4/LICENSE", "uplot-1.6.32/LICENSE"):
        assert c.get(f"/ui/static/vendor/{path}").status_code == 200, path
    html = _client(svc, ALICE).get("/ui/jobs").text
    assert not re.search(r'(src|href)="(https?:)?//', html), "a page loads something from another site"
