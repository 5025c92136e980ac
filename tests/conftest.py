from __future__ import annotations

from fnmatch import fnmatchcase

import pytest

from tests.browser import browser  # noqa: F401 (the browser tests' fixture: one Chromium per module)
from tests.heavy import HEAVY
from tests.jobkinds import register_test_kinds

# Test-only kinds must exist before any app is created in this process.
register_test_kinds()


def pytest_collection_modifyitems(config, items):
    """The tests tests/heavy.py lists are marked ``slow``: ``make test`` leaves them to ``make test-slow``."""
    unmatched = set(HEAVY)
    for item in items:
        matched = {pattern for pattern in HEAVY if fnmatchcase(item.nodeid, pattern)}
        if matched:
            item.add_marker(pytest.mark.slow)
            unmatched -= matched
    # a whole run (no paths given) names every listed test: a renamed or deleted one is an error, not a silent gap
    if unmatched and config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.keyword:
        raise pytest.UsageError(f"tests/heavy.py names no collected test: {sorted(unmatched)}")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """A running service (private Redis + one worker on both queues) shared by a test module."""
    from tests.service import Service

    home = tmp_path_factory.mktemp("home")
    with Service(home, heartbeat_ttl_s=10) as svc:
        yield svc


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One private redis-server for tests that need only Redis (no workers)."""
    from core.redis_server import EmbeddedRedis

    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), appendonly=False).start()
    yield server
    server.stop()


@pytest.fixture
def redis_settings(tmp_path, redis_server):
    """Settings with a home under tmp_path and an empty Redis database."""
    import redis

    from core.settings import Settings

    redis.Redis.from_url(redis_server.url).flushdb()
    return Settings(EXPLAINQ_HOME=str(tmp_path), REDIS_URL=redis_server.url)
