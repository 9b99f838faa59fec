from __future__ import annotations

import pytest
from rest_framework.authtoken.models import Token

from reach_platform.client import InvalidRequestError, NotFoundError, ReachClient

pytestmark = pytest.mark.django_db(transaction=True)


def test_client_invokes_resolves_and_reads_tasks_over_http(live_server, running_agents, user):
    running_agents(["order-agent"])
    token = Token.objects.get_or_create(user=user)[0].key
    with ReachClient(live_server.url, token) as client:
        resolved = client.resolve(task="where is my order 12345")
        assert resolved["candidates"][0]["capability"] == "order.query"
        task = client.invoke(capability="order.query", payload={"order_id": "1"}, request_id="c-1")
        assert task["status"] == "succeeded"
        assert [e["to_status"] for e in client.task("c-1")["events"]][-1] == "succeeded"
        with pytest.raises(NotFoundError):
            client.invoke(capability="no.such.capability")
        with pytest.raises(InvalidRequestError):
            client.resolve()
