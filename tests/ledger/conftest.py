import pytest

from tests.routing.conftest import registry_ready, running_agents  # noqa: F401  (shared fixtures)


@pytest.fixture(autouse=True)
def fresh_month_counters():
    """Month-to-date spend lives in Redis; every other test's invokes add to it."""
    from registry.generation import redis_client

    for key in redis_client().scan_iter("reach:spend:*"):
        redis_client().delete(key)
