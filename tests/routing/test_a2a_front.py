"""The inbound A2A door on a live gateway node, driven by the a2a-sdk client: a registered (plain HTTP) agent and
the semantic router served as A2A agents (send, return-immediately, stream, subscribe, get, list, cancel, push)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.types import (
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import UnsupportedOperationError
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct, Value
from rest_framework.authtoken.models import Token

from routing.models import A2APushConfig, CallbackDelivery, Task
from tests.helpers import run_async, wait_until
from tests.routing.test_async import Receiver

pytestmark = pytest.mark.django_db(transaction=True)


def _rpc(url: str, token: str, method: str, params: dict) -> dict:
    r = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, timeout=30,
                   headers={"Authorization": f"Bearer {token}", "A2A-Version": "1.0"})
    assert r.status_code == 200, r.text
    return r.json()


def _message(message_id: str, text: str, data: dict | None = None, **fields) -> Message:
    parts = [Part(text=text)]
    if data is not None:
        parts.append(Part(data=json_format.ParseDict(data, Value())))
    return Message(role=Role.ROLE_USER, message_id=message_id, parts=parts, **fields)


async def _client(url: str, token: str, *, streaming: bool):
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    return await create_client(url, client_config=ClientConfig(streaming=streaming, httpx_client=http)), http


async def _session(url: str, token: str, work, *, streaming: bool = False):
    client, http = await _client(url, token, streaming=streaming)
    try:
        return await work(client)
    finally:
        await client.close()
        await http.aclose()


def _kinds(events) -> list[str]:
    return [e.WhichOneof("payload") for e in events]


@pytest.fixture
def door(user, running_agents, gateway_nodes, celery_worker_proc):
    """A live gateway node serving the order agent (a plain HTTP agent) and the router over A2A."""
    agents = running_agents(["order-agent", "doc-summary-agent"])
    (node,) = gateway_nodes(1)
    token = Token.objects.create(user=user).key
    return node, token, agents


def test_agent_card_send_message_and_get_task(door):
    node, token, agents = door
    card = httpx.get(f"{node.url}/a2a/order-agent/.well-known/agent-card.json", timeout=10).json()
    url = f"{node.url}/a2a/order-agent"
    assert card["supportedInterfaces"][0]["url"] == url
    assert card["capabilities"] == {"streaming": True, "pushNotifications": True}
    assert [s["id"] for s in card["skills"]] == ["order.query"]
    message = {"role": "ROLE_USER", "messageId": "a2a-in-1", "contextId": "ctx-9",
               "parts": [{"text": "where is my order"}, {"data": {"order_id": "5"}}]}
    sent = _rpc(url, token, "SendMessage", {"message": message})["result"]["task"]
    assert sent["id"] == "a2a-in-1" and sent["status"]["state"] == "TASK_STATE_COMPLETED"
    assert sent["artifacts"][0]["parts"][0]["data"]["answer"].endswith('{"order_id": "5"}')
    task = Task.objects.get(request_id="a2a-in-1")
    assert task.caller_id and task.user_key == "ctx-9" and task.status == "succeeded"
    got = _rpc(url, token, "GetTask", {"id": "a2a-in-1"})["result"]
    assert got["status"]["state"] == "TASK_STATE_COMPLETED" and got["status"]["timestamp"].endswith("Z")
    assert _rpc(url, token, "GetTask", {"id": "nope"})["error"]["code"] == -32001
    # a completed task cannot be cancelled, nor take another message
    assert _rpc(url, token, "CancelTask", {"id": "a2a-in-1"})["error"]["code"] == -32002
    again = {**message, "messageId": "a2a-in-1b", "taskId": "a2a-in-1"}
    assert _rpc(url, token, "SendMessage", {"message": again})["error"]["code"] == -32004
    second = {**message, "messageId": "a2a-in-2"}
    _rpc(url, token, "SendMessage", {"message": second})
    page = _rpc(url, token, "ListTasks", {"pageSize": 1})["result"]
    assert [t["id"] for t in page["tasks"]] == ["a2a-in-2"] and page["totalSize"] == 2
    assert "artifacts" not in page["tasks"][0]  # includeArtifacts is false by default
    rest = _rpc(url, token, "ListTasks", {"pageSize": 1, "pageToken": page["nextPageToken"],
                                          "includeArtifacts": True})["result"]
    assert [t["id"] for t in rest["tasks"]] == ["a2a-in-1"] and rest["nextPageToken"] == ""
    assert rest["tasks"][0]["artifacts"]
    # an idempotency key (metadata.requestId): the same message again is the same task, not a second execution
    keyed = {**message, "messageId": "a2a-key-m1", "metadata": {"requestId": "a2a-key-1"}}
    assert _rpc(url, token, "SendMessage", {"message": keyed})["result"]["task"]["id"] == "a2a-key-1"
    again = {**keyed, "messageId": "a2a-key-m2"}
    assert _rpc(url, token, "SendMessage", {"message": again})["result"]["task"]["id"] == "a2a-key-1"
    assert agents.stats("order-agent")["executions"]["a2a-key-1"] == 1
    # a message id used again once its task has settled is a new message: a task of its own, its id the prefix
    reused = _rpc(url, token, "SendMessage", {"message": message})["result"]["task"]
    assert reused["id"].startswith("a2a-in-1-") and reused["status"]["state"] == "TASK_STATE_COMPLETED"
    assert agents.stats("order-agent")["executions"]["a2a-in-1"] == 1


BAD = [
    ("ListTasks", {"pageSize": 500}, -32602), ("ListTasks", {"pageToken": "x"}, -32602),
    ("NoSuchMethod", {}, -32601), ("SendMessage", {"message": {"messageId": "m"}}, -32602),
    ("SendMessage", {"message": {"messageId": 5, "parts": [{"text": "x"}]}}, -32602),
    ("SendMessage", {"message": {"messageId": "m", "parts": [{"raw": "eA==", "mediaType": "image/png"}]}}, -32005),
    ("SendMessage", {"message": {"messageId": "m", "parts": [{"text": "x"}]}, "configuration": []}, -32602),
    ("SendMessage", {"message": {"messageId": "m", "parts": [{"text": "x"}]},
                     "configuration": {"returnImmediately": "yes"}}, -32602),
    ("SendMessage", {"message": {"messageId": "m", "parts": [{"text": "x"}], "taskId": "nope"}}, -32001),
    ("GetTask", {"id": ["x"]}, -32602), ("GetTask", {"id": "x", "historyLength": -1}, -32602),
    ("SubscribeToTask", {"id": "nope"}, -32001),
    ("CreateTaskPushNotificationConfig", {"taskId": "nope", "url": "https://example.invalid/h"}, -32001),
    ("ListTaskPushNotificationConfigs", {}, -32602), ("GetExtendedAgentCard", {}, -32004),
    ("SendMessage", {"message": {"messageId": "bad id/1", "parts": [{"text": "x"}]}}, -32602),
    ("SendMessage", {"message": "x"}, -32602), ("SendMessage", {"message": {"messageId": "m", "parts": [1]}}, -32602),
    ("SendMessage", {"message": {"messageId": "m", "parts": [{"text": 5}]}}, -32602),
    ("SendMessage", {"message": {"messageId": "m", "parts": [{"data": [1]}]}}, -32602),
    ("ListTasks", {"status": "TASK_STATE_NOPE"}, -32602), ("ListTasks", {"statusTimestampAfter": "x"}, -32602),
    ("ListTasks", {"contextId": 5}, -32602),
    ("SendMessage", {"message": {"messageId": "m", "parts": [{"text": "x"}], "metadata": {"skill": "nope"}}},
     -32602)]


def test_bad_requests_are_json_rpc_errors(door):
    node, token, _ = door
    for method, params, code in BAD:
        answer = _rpc(f"{node.url}/a2a/order-agent", token, method, params)
        assert answer.get("error", {}).get("code") == code, (method, params, answer)
    assert not Task.objects.exists()  # nothing was invoked


def test_unauthenticated_and_malformed(door):
    node, token, _ = door
    url = f"{node.url}/a2a/order-agent"
    assert httpx.post(url, json={}, timeout=10).status_code == 401
    assert httpx.get(f"{node.url}/a2a/nobody/.well-known/agent-card.json", timeout=10).status_code == 404
    auth = {"Authorization": f"Bearer {token}"}
    for raw in (b"{not json", b"[]", b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": 3}'):
        r = httpx.post(url, content=raw, headers={**auth, "Content-Type": "application/json"}, timeout=10)
        assert r.status_code == 200 and r.json()["error"]["code"] in (-32700, -32600, -32602)
    r = httpx.post(url, content=b"x", headers={**auth, "Content-Type": "text/plain"}, timeout=10)
    assert r.json()["error"]["code"] == -32005
    assert r.json()["error"]["data"][0]["reason"] == "CONTENT_TYPE_NOT_SUPPORTED"
    r = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}, timeout=10,
                   headers={**auth, "A2A-Version": "99.0"})
    assert r.json()["error"]["code"] == -32009
    # ProtoJSON's snake_case spelling is read as well
    assert _rpc(url, token, "ListTasks", {"page_size": 500})["error"]["code"] == -32602


def test_return_immediately_runs_the_task_in_the_background(door):
    node, token, agents = door
    agents.set_faults("order-agent", latency_ms=1500)
    url = f"{node.url}/a2a/order-agent"

    async def work(client):
        request = SendMessageRequest(message=_message("a2a-bg-1", "where is my order", {"order_id": "8"}),
                                     configuration=SendMessageConfiguration(return_immediately=True))
        first = [e async for e in client.send_message(request)]
        return first[-1].task

    task = run_async(_session(url, token, work))
    assert task.id == "a2a-bg-1" and task.status.state in (TaskState.TASK_STATE_SUBMITTED,
                                                          TaskState.TASK_STATE_WORKING)
    assert Task.objects.get(request_id="a2a-bg-1").mode == "async"
    # a blocking repeat of the message while its task runs joins it: the answer at its end, one execution
    joined = _rpc(url, token, "SendMessage", {"message": {"role": "ROLE_USER", "messageId": "a2a-bg-1",
                                                          "parts": [{"data": {"order_id": "8"}}]}})["result"]
    assert joined["task"]["id"] == "a2a-bg-1" and joined["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    wait_until(lambda: Task.objects.get(request_id="a2a-bg-1").status == "succeeded", timeout=30,
               message="the background task to finish")

    async def get(client):
        return await client.get_task(GetTaskRequest(id="a2a-bg-1"))

    done = run_async(_session(url, token, get))
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    assert json_format.MessageToDict(done.artifacts[0].parts[0].data)["answer"].endswith('{"order_id": "8"}')
    assert agents.stats("order-agent")["executions"]["a2a-bg-1"] == 1


def test_streaming_message_and_subscribe(door):
    node, token, agents = door
    agents.set_faults("order-agent", latency_ms=1500)
    url = f"{node.url}/a2a/order-agent"

    async def stream(client):
        request = SendMessageRequest(message=_message("a2a-st-1", "where is my order", {"order_id": "3"}))
        return [e async for e in client.send_message(request)]

    events = run_async(_session(url, token, stream, streaming=True))
    # from the task's creation: submitted, working, the result, completed
    assert _kinds(events) == ["task", "status_update", "artifact_update", "status_update"]
    assert events[0].task.status.state == TaskState.TASK_STATE_SUBMITTED
    assert events[1].status_update.status.state == TaskState.TASK_STATE_WORKING
    answer = json_format.MessageToDict(events[2].artifact_update.artifact.parts[0].data)["answer"]
    assert answer.endswith('{"order_id": "3"}')
    assert events[3].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert {e.status_update.task_id for e in events[1::2]} == {"a2a-st-1"}

    # subscribing to a task that runs: its state now, then its changes, until it ends; two streams see the same
    _rpc(url, token, "SendMessage", {"message": {"role": "ROLE_USER", "messageId": "a2a-sub-1",
                                                 "parts": [{"text": "where is order 4"}, {"data": {"order_id": "4"}}]},
                                     "configuration": {"returnImmediately": True}})

    async def subscribe(client):
        async def one():
            return [e async for e in client.subscribe(SubscribeToTaskRequest(id="a2a-sub-1"))]

        return await asyncio.gather(one(), one())

    first, second = run_async(_session(url, token, subscribe, streaming=True))
    for events in (first, second):
        assert _kinds(events)[0] == "task" and _kinds(events)[-1] == "status_update"
        assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert [e.status_update.status.state for e in first[1:] if e.status_update.task_id] == \
        [e.status_update.status.state for e in second[1:] if e.status_update.task_id]

    # a finished task has nothing to subscribe to: UnsupportedOperationError
    async def late(client):
        return [e async for e in client.subscribe(SubscribeToTaskRequest(id="a2a-sub-1"))]

    with pytest.raises(UnsupportedOperationError):
        run_async(_session(url, token, late, streaming=True))
    assert _rpc(url, token, "SubscribeToTask", {"id": "a2a-sub-1"})["error"]["code"] == -32004
    assert agents.stats("order-agent")["executions"] == {"a2a-st-1": 1, "a2a-sub-1": 1}


def test_push_configs_deliver_every_change_signed_with_the_token(door, admin_client):
    node, token, agents = door
    hook = Receiver(failures=1)  # the first try fails: the outbox retries it
    url = f"{node.url}/a2a/order-agent"
    try:
        config = {"id": "cfg-1", "url": hook.url, "token": "tok-123",
                  "authentication": {"scheme": "Bearer", "credentials": "hook-secret"}}
        sent = _rpc(url, token, "SendMessage", {
            "message": {"role": "ROLE_USER", "messageId": "a2a-push-1", "parts": [{"data": {"order_id": "6"}}]},
            "configuration": {"returnImmediately": True, "taskPushNotificationConfig": config}})["result"]["task"]
        assert sent["id"] == "a2a-push-1"
        wait_until(lambda: Task.objects.get(request_id="a2a-push-1").status == "succeeded", timeout=30,
                   message="the task to finish")
        wait_until(lambda: not CallbackDelivery.objects.filter(push_config__config_id="cfg-1",
                                                               status="pending").exists(), timeout=30,
                   message="every push delivered")
        bodies = [json.loads(raw) for raw, _ in hook.received]
        states = [b.get("statusUpdate", b.get("task", {})).get("status", {}).get("state") for b in bodies]
        assert "TASK_STATE_WORKING" in states and states.count("TASK_STATE_COMPLETED") == 1
        final = next(b["task"] for b in bodies if "task" in b)
        assert final["artifacts"][0]["parts"][0]["data"]["answer"].endswith('{"order_id": "6"}')
        for raw, headers in hook.received:
            assert headers["X-A2A-Notification-Token"] == "tok-123"
            assert headers["Authorization"] == "Bearer hook-secret"
            assert headers["X-Reach-Signature"].startswith("sha256=")
            assert len(json.loads(raw)) == 1  # a StreamResponse: exactly one of task / statusUpdate / ...
        assert hook.calls == len(hook.received) + 1
    finally:
        hook.close()

    # the config methods, through the a2a-sdk client
    async def crud(client):
        made = await client.create_task_push_notification_config(TaskPushNotificationConfig(
            task_id="a2a-push-1", id="cfg-2", url="https://hooks.example.invalid/a2a", token="t2"))
        got = await client.get_task_push_notification_config(GetTaskPushNotificationConfigRequest(
            task_id="a2a-push-1", id="cfg-2"))
        listed = await client.list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest(
            task_id="a2a-push-1"))
        await client.delete_task_push_notification_config(DeleteTaskPushNotificationConfigRequest(
            task_id="a2a-push-1", id="cfg-2"))
        await client.delete_task_push_notification_config(DeleteTaskPushNotificationConfigRequest(
            task_id="a2a-push-1", id="cfg-2"))  # deleting again succeeds
        return made, got, listed

    made, got, listed = run_async(_session(url, token, crud))
    assert made.id == got.id == "cfg-2" and got.url == "https://hooks.example.invalid/a2a" and got.token == "t2"
    assert sorted(c.id for c in listed.configs) == ["cfg-1", "cfg-2"]
    assert list(A2APushConfig.objects.filter(task_request_id="a2a-push-1").values_list("config_id", flat=True)) \
        == ["cfg-1"]
    assert _rpc(url, token, "GetTaskPushNotificationConfig", {"taskId": "a2a-push-1", "id": "cfg-2"})[
        "error"]["code"] == -32001
    # the address guard callbacks use: no internal targets
    refused = _rpc(url, token, "CreateTaskPushNotificationConfig", {"taskId": "a2a-push-1",
                                                                    "url": "http://169.254.169.254/x"})
    assert refused["error"]["code"] == -32602
    # a webhook that never answers 2xx: retried, then dead-lettered into the review queue
    dead = Receiver(failures=10**6)
    try:
        _rpc(url, token, "SendMessage", {"message": {"role": "ROLE_USER", "messageId": "a2a-push-dead",
                                                     "parts": [{"data": {"order_id": "7"}}]},
                                         "configuration": {"taskPushNotificationConfig": {"url": dead.url}}})
        wait_until(lambda: CallbackDelivery.objects.filter(task__request_id="a2a-push-dead", status="dead").exists(),
                   timeout=40, message="a dead letter")
        assert Task.objects.get(request_id="a2a-push-dead").review_reason == "dead_letter"
        assert dead.calls >= 4 and not dead.received
    finally:
        dead.close()
    # the admin lists the configs, never their secrets
    listed_page = admin_client.get("/admin/routing/a2apushconfig/")
    assert listed_page.status_code == 200 and b"cfg-1" in listed_page.content
    detail = admin_client.get(f"/admin/routing/a2apushconfig/{A2APushConfig.objects.get(config_id='cfg-1').pk}/"
                              "change/")
    assert detail.status_code == 200 and b"tok-123" not in detail.content and b"hook-secret" not in detail.content


def test_router_routes_a_text_across_agents(door):
    node, token, agents = door
    card = httpx.get(f"{node.url}/a2a/router/.well-known/agent-card.json", timeout=10).json()
    assert card["supportedInterfaces"][0]["url"] == f"{node.url}/a2a/router"
    assert {"order.query", "document.summarize"} <= {s["id"] for s in card["skills"]}
    url = f"{node.url}/a2a/router"

    async def work(client):
        request = SendMessageRequest(message=_message("a2a-rt-1", "where is my order 12345",
                                                      {"order_id": "12345"}))
        return [e async for e in client.send_message(request)][-1].task

    task = run_async(_session(url, token, work))
    assert task.status.state == TaskState.TASK_STATE_COMPLETED, task
    row = Task.objects.get(request_id="a2a-rt-1")
    assert row.agent_endpoint == "order-agent" and row.capability_requested == ""
    assert agents.stats("order-agent")["executions"]["a2a-rt-1"] == 1

    # metadata.skill names the capability instead of routing
    metadata = Struct()
    metadata.update({"skill": "order.query"})

    async def named(client):
        request = SendMessageRequest(message=_message("a2a-rt-2", "status", {"order_id": "1"}, metadata=metadata))
        return [e async for e in client.send_message(request)][-1].task

    assert run_async(_session(url, token, named)).status.state == TaskState.TASK_STATE_COMPLETED
    assert Task.objects.get(request_id="a2a-rt-2").capability_requested == "order.query"
    # the router needs a text (or a skill)
    empty = _rpc(url, token, "SendMessage", {"message": {"role": "ROLE_USER", "messageId": "a2a-rt-3",
                                                         "parts": [{"data": {"x": 1}}]}})
    assert empty["error"]["code"] == -32602


def test_router_confirmation_is_input_required_answered_by_a_message_or_cancelled(user, running_agents,
                                                                                    gateway_nodes):
    running_agents(["order-agent", "doc-summary-agent"])
    # a node whose bands make every routed request a CONFIRM decision
    (node,) = gateway_nodes(1, REACH_EXECUTE_AT="1.01", REACH_CONFIRM_AT="0")
    token = Token.objects.create(user=user).key
    url = f"{node.url}/a2a/router"

    async def ask(client, message_id):
        request = SendMessageRequest(message=_message(message_id, "where is my order 12345", {"order_id": "9"}))
        return [e async for e in client.send_message(request)][-1].task

    async def work(client):
        asked = await ask(client, "a2a-cf-1")
        answer = _message("a2a-cf-1-answer", "order.query", task_id=asked.id, context_id=asked.context_id)
        done = [e async for e in client.send_message(SendMessageRequest(message=answer))][-1].task
        other = await ask(client, "a2a-cf-2")
        cancelled = await client.cancel_task(CancelTaskRequest(id=other.id))
        return asked, done, cancelled

    asked, done, cancelled = run_async(_session(url, token, work))
    assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    candidates = json_format.MessageToDict(asked.status.message.parts[1].data)["candidates"]
    assert candidates[0]["capability"] == "order.query"
    assert done.id == "a2a-cf-1" and done.status.state == TaskState.TASK_STATE_COMPLETED
    assert Task.objects.get(request_id="a2a-cf-1").capability_requested == "order.query"
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
    # bands that no score reaches: the router leaves it to a person (manual review), submitted for A2A
    (strict,) = gateway_nodes(1, REACH_EXECUTE_AT="1.01", REACH_CONFIRM_AT="1.01")
    waiting = _rpc(f"{strict.url}/a2a/router", token, "SendMessage", {"message": {
        "role": "ROLE_USER", "messageId": "a2a-mr-1", "parts": [{"text": "where is my order 12345"}]}})["result"]
    assert waiting["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert Task.objects.get(request_id="a2a-mr-1").status == "manual_review"
    # a wrong context for the task is refused
    wrong = _rpc(url, token, "SendMessage", {"message": {"role": "ROLE_USER", "messageId": "a2a-cf-x",
                                                         "taskId": "a2a-cf-1", "contextId": "other",
                                                         "parts": [{"text": "order.query"}]}})
    assert wrong["error"]["code"] == -32602
