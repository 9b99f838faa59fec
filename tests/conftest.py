from __future__ import annotations

import os

# Celery workers started by the tests inherit these: short callback back-off keeps retry tests quick.
os.environ.setdefault("REACH_CALLBACK_BACKOFF_S", "0.2")
# ... and a short broker visibility timeout and task lease, so that a killed worker's task is redelivered quickly.
os.environ.setdefault("REACH_VISIBILITY_TIMEOUT_S", "4")
os.environ.setdefault("REACH_TASK_LEASE_S", "3")
os.environ.setdefault("REACH_UNACKED_RESTORE_INTERVAL_S", "1")

import pytest
import redis
from django.conf import settings
from rest_framework.test import APIClient

from tests.helpers import AgentProcess, WorkerProcess


def _flush_retrying_on_deadlock() -> None:
    """A transactional test ends with a flush (TRUNCATE of every table), which can deadlock with a write that the
    session's Celery worker or an agent's callback is still making for a test that just ended (PostgreSQL then
    aborts one of them). The flush is tried again then: what the late write wrote is flushed too."""
    import time

    from django.core.management.base import CommandError
    from django.core.management.commands import flush

    handle = flush.Command.handle

    def retrying(self, **options):
        for attempt in range(5):
            try:
                return handle(self, **options)
            except CommandError as exc:
                if "deadlock" not in str(exc.__cause__) or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))

    flush.Command.handle = retrying


_flush_retrying_on_deadlock()


@pytest.fixture(scope="session", autouse=True)
def clean_redis():
    """Tests use their own Redis database (see settings); start each run from an empty one."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    yield client


@pytest.fixture(autouse=True)
def environments(request):
    """Transactional tests flush the data migrations' rows; put environments and groups back for every DB test."""
    marker = request.node.get_closest_marker("django_db")
    names = set(request.fixturenames)
    if marker is None and not names & {"db", "transactional_db", "live_server"}:
        return
    transactional = (marker is not None and marker.kwargs.get("transaction")) or names & {"transactional_db",
                                                                                          "live_server"}
    request.getfixturevalue("transactional_db" if transactional else "db")
    from registry.models import Environment
    from reviews.roles import ensure_roles

    for name in ("dev", "staging", "prod"):
        Environment.objects.get_or_create(name=name)
    ensure_roles()  # the role groups are made by data migrations, flushed likewise


@pytest.fixture(scope="session")
def celery_worker_proc(django_db_setup, django_db_blocker):
    worker = WorkerProcess().start()
    yield worker
    worker.stop()


@pytest.fixture
def agent_procs(tmp_path):
    started: list[AgentProcess] = []

    def start(agents: list[str], **kwargs) -> AgentProcess:
        proc = AgentProcess(agents, tmp=tmp_path, **kwargs).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user(username="caller", password="pw-caller-123")


@pytest.fixture
def api(user):
    from rest_framework.authtoken.models import Token

    token, _ = Token.objects.get_or_create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def gateway_nodes():
    """Start gateway nodes (uvicorn process groups on their own ports) sharing the test PostgreSQL and Redis."""
    from tests.helpers import GatewayProcess

    started: list[GatewayProcess] = []

    def start(n: int = 1, **env: str) -> list[GatewayProcess]:
        nodes = [GatewayProcess(**env).start() for _ in range(n)]
        started.extend(nodes)
        return nodes

    yield start
    for node in started:
        node.stop()
