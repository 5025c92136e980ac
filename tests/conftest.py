from __future__ import annotations

import pytest

from tests.jobkinds import register_test_kinds

# Test-only kinds must exist before any app is created in this process.
register_test_kinds()


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """A running service (private Redis + one worker on both queues) shared by a test module."""
    from tests.service import Service

    home = tmp_path_factory.mktemp("home")
    with Service(home, heartbeat_ttl_s=10) as svc:
        yield svc
