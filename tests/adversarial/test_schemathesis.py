"""Property-based requests generated from the OpenAPI schema (schemathesis) against the real app, in-process.

Every ``POST`` route (the job kinds, ``/datasets``; not the test-only kinds tests/conftest.py registers) and
``GET /jobs`` get valid and invalid requests (schemathesis' examples, coverage of boundaries, fuzzing; other methods
on the same paths too): none may answer 5xx or a status outside ``EXPECTED``, and every answer is JSON in UTF-8
without NaN or infinities. The run is bounded: ``MAX_EXAMPLES`` generated per operation and phase, a deadline per
request. A private Redis, no worker: accepted jobs stay queued.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402  (after the skip: hypothesis comes with schemathesis)

from core.redis_server import EmbeddedRedis  # noqa: E402
from core.settings import Settings  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MAX_EXAMPLES = int(os.environ.get("EXPLAINQ_SCHEMATHESIS_EXAMPLES", "60"))  # a longer hunt: set it higher
DEADLINE = timedelta(seconds=5)
OPERATIONS = r"^(POST /(?!test/).*|GET /jobs)$"
# 405: schemathesis also tries the methods a path does not serve
EXPECTED = {200, 201, 202, 404, 405, 409, 413, 422, 429}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    home = tmp_path_factory.mktemp("schemathesis")
    (home / "data").mkdir()
    server = EmbeddedRedis(home / "redis", appendonly=False).start()
    try:
        from app.main import create_app

        # quotas high enough that generated requests reach validation rather than 429
        yield create_app(Settings(EXPLAINQ_HOME=str(home), REDIS_URL=server.url, EXPLAINQ_MAX_ACTIVE_JOBS=10**6,
                                  EXPLAINQ_MAX_QUEUE_LENGTH=10**6))
    finally:
        server.stop()


def _schema():
    """The operations, read from the app's own OpenAPI document (building the app connects to nothing; each
    call is sent to the ``app`` fixture's instance, which has a Redis)."""
    from app.main import create_app

    placeholder = create_app(Settings(REDIS_URL="redis://127.0.0.1:9/0"))
    return schemathesis.openapi.from_asgi("/openapi.json", placeholder).include(name_regex=OPERATIONS)


schema = _schema()


def _refuse(token: str):
    raise ValueError(f"non-standard JSON token {token}")


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=DEADLINE, database=None,
          suppress_health_check=list(HealthCheck))
def test_no_server_error_and_json_bodies(app, case):
    response = case.call(app=app)
    where = (case.method, case.path, case.query, repr(case.body)[:2000], response.text[:2000])
    assert response.status_code < 500, where
    assert response.status_code in EXPECTED, where
    json.loads(response.content.decode("utf-8"), parse_constant=_refuse)
