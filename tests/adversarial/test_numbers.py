"""Adversarial numbers, sizes and names: every bad input is a 4xx naming the field with a JSON body, never a 500.

Runs against the real app over a private Redis (no worker: accepted jobs stay queued).
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from core.redis_server import EmbeddedRedis
from core.settings import Settings

NON_FINITE = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity", "1e999": "Infinity",
              "-1e999": "-Infinity"}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("numbers")
    (home / "data").mkdir()
    return home


@pytest.fixture(scope="module")
def client(home):
    server = EmbeddedRedis(home / "redis", appendonly=False).start()
    try:
        from app.main import create_app

        app = create_app(Settings(EXPLAINQ_HOME=str(home), REDIS_URL=server.url))
        with TestClient(app, raise_server_exceptions=False) as c:
            yield c
    finally:
        server.stop()


def strict_json(text: str):
    """The body as JSON, refusing the non-standard NaN / Infinity tokens Python's json module would accept."""

    def refuse(token: str):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def post_raw(client: TestClient, route: str, raw: str):
    return client.post(route, content=raw.encode(), headers={"content-type": "application/json"})


def errors_at(response, loc: tuple) -> list[dict]:
    body = strict_json(response.text)
    return [d for d in body["detail"] if tuple(d["loc"]) == loc]


# ------------------------------------------------------------------------------ 1. non-finite numbers in errors


@pytest.mark.parametrize("token", sorted(NON_FINITE))
@pytest.mark.parametrize("route, template, loc", [
    ("/tracin", '{"model": "m", "top_k": %s}', ("body", "top_k")),                      # int field
    ("/tracin", '{"model": "m", "filter": {"n_hops": %s}}', ("body", "filter", "n_hops")),  # nested model
    ("/tracin", '{"model": "m", "no_such_field": %s}', ("body", "no_such_field")),      # extra_forbidden
    ("/tracin", '{"model": "m", "no_such_field": [1, {"x": %s}]}', ("body", "no_such_field")),
    ("/tracin", '{"model": %s}', ("body", "model")),                                  # string field
    ("/datasets", '{"name": "d", "path": %s}', ("body", "path")),                     # a plain route
])
def test_non_finite_input_is_echoed_as_a_string_in_a_json_422(client, route, template, loc, token):
    r = post_raw(client, route, template % token)
    assert r.status_code == 422, r.text
    found = errors_at(r, loc)
    assert found, r.text
    assert {"type", "loc", "msg", "input"} <= set(found[0])  # FastAPI's error shape, kept
    assert NON_FINITE[token] in json.dumps(found[0]["input"]), found


@pytest.mark.parametrize("token", sorted(NON_FINITE))
def test_a_non_finite_body_is_a_json_422(client, token):
    r = post_raw(client, "/tracin", token)
    assert r.status_code == 422, r.text
    assert errors_at(r, ("body",))[0]["input"] == NON_FINITE[token]
