"""Two gateway nodes (uvicorn process groups on their own ports) and two workers sharing one PostgreSQL and one
Redis behave as one system; repeats of an in-flight request_id wait without holding a node."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from rest_framework.authtoken.models import Token

from registry.models import CapabilityVersion, Instance
from routing import breaker, snapshot
from routing.models import Task
from tests.helpers import WorkerProcess, run_async, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
ORDER = {"capability": "order.query", "payload": {"order_id": "9"}}


def _auth(user) -> dict:
    return {"Authorization": f"Token {Token.objects.get_or_create(user=user)[0].key}"}


async def _post_all(calls: list[tuple[str, dict]], headers: dict) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60, headers=headers) as client:
        return await asyncio.gather(*(client.post(f"{url}/api/v1/invoke", json=body) for url, body in calls))


def test_the_same_request_id_sent_to_two_nodes_at_once_executes_once(user, running_agents, gateway_nodes):
    agents = running_agents(["order-agent"])
    agents.set_faults("order-agent", latency_ms=500)
    a, b = gateway_nodes(2)
    calls = [(node.url, {**ORDER, "request_id": "mn-dup"}) for node in (a, b) for _ in range(5)]
    responses = run_async(_post_all(calls, _auth(user)))
    assert [r.status_code for r in responses] == [200] * 10
    assert len({r.json()["result"]["answer"] for r in responses}) == 1
    assert agents.stats("order-agent")["executions"]["mn-dup"] == 1


def test_an_instances_max_concurrency_holds_across_nodes(user, running_agents, gateway_nodes):
    agents = running_agents(["order-agent"])
    agents.set_faults("order-agent", latency_ms=1500)
    Instance.objects.filter(agent__endpoint_id="order-agent").update(max_concurrency=2)
    snapshot.bump_generation()
    a, b = gateway_nodes(2)
    calls = [((a, b)[i % 2].url, {**ORDER, "request_id": f"mn-cap-{i}"}) for i in range(10)]
    responses = run_async(_post_all(calls, _auth(user)))
    codes = [r.status_code for r in responses]
    assert codes.count(200) >= 2 and codes.count(429) >= 1, codes
    assert {r.json()["error"]["code"] for r in responses if r.status_code == 429} == {"agent_overloaded"}
    assert agents.stats("order-agent")["max_in_flight"] <= 2


def test_a_breaker_tripped_on_one_node_is_honoured_by_the_other(user, running_agents, gateway_nodes):
    agents = running_agents(["order-agent"])
    agents.set_faults("order-agent", fail_rate=1.0, fail_status=503)
    instance = Instance.objects.get(agent__endpoint_id="order-agent", deregistered_at__isnull=True)
    a, b = gateway_nodes(2)
    responses = run_async(_post_all([(a.url, {**ORDER, "request_id": f"mn-trip-{i}"}) for i in range(10)],
                                      _auth(user)))
    assert {r.status_code for r in responses} <= {502, 429}
    assert breaker.state(instance.id) == breaker.OPEN
    before = sum(agents.stats("order-agent")["executions"].values())
    refused = httpx.post(f"{b.url}/api/v1/invoke", json={**ORDER, "request_id": "mn-after-trip"},
                         headers=_auth(user), timeout=30)
    # node B reads the breaker node A opened: the instance is out of routing, and nothing is sent to it
    assert refused.status_code != 200 and "breaker" in json.dumps(refused.json()).lower()
    assert sum(agents.stats("order-agent")["executions"].values()) == before  # node B did not call it


def test_two_workers_share_the_async_queue_and_run_each_task_once(user, running_agents, gateway_nodes,
                                                                   celery_worker_proc):
    agents = running_agents(["order-agent"])
    agents.set_faults("order-agent", latency_ms=200)
    a, b = gateway_nodes(2)
    second = WorkerProcess(concurrency=50).start()
    try:
        calls = [((a, b)[i % 2].url, {**ORDER, "mode": "async", "request_id": f"mn-async-{i}"}) for i in range(30)]
        responses = run_async(_post_all(calls, _auth(user)))
        assert {r.status_code for r in responses} == {202}
        wait_until(lambda: Task.objects.filter(request_id__startswith="mn-async-", status="succeeded").count() == 30,
                   timeout=60, message=lambda: "every async task to succeed: " + str(sorted(
                       Task.objects.filter(request_id__startswith="mn-async-").values_list("status", "error"))))
    finally:
        second.stop()
    executions = agents.stats("order-agent")["executions"]
    assert all(executions[f"mn-async-{i}"] == 1 for i in range(30))


def test_repeats_of_an_in_flight_request_wait_without_holding_the_node(user, running_agents, gateway_nodes):
    agents = running_agents(["order-agent"])
    agents.set_faults("order-agent", latency_ms=3000)
    CapabilityVersion.objects.filter(capability__name="order.query").update(p95_latency_ms=4000)  # timeout 6 s
    (node,) = gateway_nodes(1, REACH_CALLER_MAX_CONCURRENCY="16")
    auth = _auth(user)

    async def scenario():
        async with httpx.AsyncClient(timeout=60, headers=auth) as client:
            original = asyncio.create_task(client.post(f"{node.url}/api/v1/invoke",
                                                       json={**ORDER, "request_id": "mn-wait"}))
            await asyncio.sleep(0.5)
            repeats = [asyncio.create_task(client.post(f"{node.url}/api/v1/invoke",
                                                       json={**ORDER, "request_id": "mn-wait"}))
                       for _ in range(48)]
            await asyncio.sleep(0.5)
            # while 48 repeats wait, the node still answers: the task is read as not yet settled
            meanwhile = await client.get(f"{node.url}/api/v1/tasks/mn-wait")
            return await original, await asyncio.gather(*repeats), meanwhile

    original, repeats, meanwhile = run_async(scenario())
    assert meanwhile.status_code == 200 and meanwhile.json()["status"] not in ("succeeded", "failed")
    assert original.status_code == 200
    codes = [r.status_code for r in repeats]
    # the caller's concurrency quota (16, the original included) applies to repeats: the rest are refused
    assert codes.count(200) == 15 and codes.count(429) == 33, codes
    assert {r.json()["result"]["answer"] for r in repeats if r.status_code == 200} == {
        original.json()["result"]["answer"]}
    assert agents.stats("order-agent")["executions"]["mn-wait"] == 1
