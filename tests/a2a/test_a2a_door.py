"""An A2A agent registered from its card (the example A2A agent, a real a2a-sdk server) served again through the
gateway's A2A door on a live node, driven by the a2a-sdk client: its behaviours (keyed on message-id prefixes, as
the TCK's are) come through unchanged: a Message answer, text artifacts, a question answered on the same task."""

from __future__ import annotations

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.types import Message, Part, Role, SendMessageRequest, TaskState
from django.core.management import call_command
from rest_framework.authtoken.models import Token

from registry.choices import VersionState
from registry.models import CapabilityVersion
from routing import a2a_transport, snapshot
from routing.models import Task
from tests.helpers import WorkerProcess, run_async

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def door(fresh_a2a_agent, user, gateway_nodes):
    """The example A2A agent registered from its card and ACTIVE (set directly, as ``registry_ready`` does: the
    activation service would enqueue an embedding, which a worker would run while the test does), a gateway node,
    and a worker of this test's own for the async tasks (the session's would outlive it into other modules)."""
    call_command("reach_import_card", fresh_a2a_agent.url, "--team", "commerce", "--environment", "dev",
                 verbosity=0)
    CapabilityVersion.objects.update(state=VersionState.ACTIVE)
    snapshot.bump_generation()
    a2a_transport._registered.clear()
    (node,) = gateway_nodes(1)
    worker = WorkerProcess().start()
    yield f"{node.url}/a2a/order-service-agent", Token.objects.create(user=user).key
    worker.stop()


async def _send(url: str, token: str, message: Message, *, streaming: bool = False) -> list:
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    client = await create_client(url, client_config=ClientConfig(streaming=streaming, httpx_client=http))
    try:
        return [event async for event in client.send_message(SendMessageRequest(message=message))]
    finally:
        await client.close()
        await http.aclose()


def _message(message_id: str, text: str, **ids) -> Message:
    return Message(role=Role.ROLE_USER, message_id=message_id, parts=[Part(text=text)], **ids)


def test_an_a2a_agent_through_the_door_keeps_its_behaviours(door, fresh_a2a_agent):
    url, token = door
    card = httpx.get(f"{url}/.well-known/agent-card.json", timeout=10).json()
    assert [s["id"] for s in card["skills"]] == ["order.query"] and card["supportedInterfaces"][0]["url"] == url

    answer = run_async(_send(url, token, _message("tck-message-response-d1", "hi")))[-1]
    assert answer.WhichOneof("payload") == "message"
    assert answer.message.parts[0].text == "Direct message response"

    text = run_async(_send(url, token, _message("tck-artifact-text-d1", "make text")))[-1].task
    assert text.status.state == TaskState.TASK_STATE_COMPLETED
    assert text.artifacts[0].parts[0].text == "Generated text content"

    asked = run_async(_send(url, token, _message("tck-input-required-d1", "where is it")))[-1].task
    assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert asked.status.message.parts[0].text == "Which order do you mean?"
    done = run_async(_send(url, token, _message("tck-complete-task-d1", "order 12", task_id=asked.id)))[-1].task
    assert done.id == asked.id and done.status.state == TaskState.TASK_STATE_COMPLETED

    streamed = run_async(_send(url, token, _message("tck-stream-001-d1", "stream it"), streaming=True))
    kinds = [e.WhichOneof("payload") for e in streamed]
    assert kinds[0] == "task" and "artifact_update" in kinds and kinds[-1] == "status_update"
    assert streamed[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED

    # a streamed question ends its stream (the client answers); a stream of the answer ends with the task
    asking = run_async(_send(url, token, _message("tck-input-required-d2", "where"), streaming=True))
    assert asking[-1].status_update.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    answered = run_async(_send(url, token, _message("tck-complete-task-d2", "order 3",
                                                    task_id="tck-input-required-d2"), streaming=True))
    assert answered[-1].task.status.state == TaskState.TASK_STATE_COMPLETED

    # the message ids reached the agent unchanged (the answer on the task: the next turn of the same request)
    executions = fresh_a2a_agent.stats()["executions"]
    assert {"tck-message-response-d1", "tck-artifact-text-d1", "tck-input-required-d1",
            "tck-input-required-d1:1", "tck-stream-001-d1"} <= set(executions)
    assert all(n == 1 for n in executions.values())
    assert Task.objects.get(request_id="tck-input-required-d1").agent_endpoint == "order-service-agent"
