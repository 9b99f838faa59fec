from tests.routing.conftest import registry_ready, running_agents  # noqa: F401  (shared fixtures)
