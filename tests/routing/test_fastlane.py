"""POST /api/v1/invoke under a caller token, served on the event loop by a real gateway node (uvicorn): the same
answers as the DRF view, the same errors."""

from __future__ import annotations

import httpx
import pytest
from rest_framework.authtoken.models import Token

pytestmark = pytest.mark.django_db(transaction=True)
ORDER = {"capability": "order.query", "payload": {"order_id": "5"}}


def test_the_lane_answers_as_the_task_api_reads_the_task(user, running_agents, gateway_nodes):
    agents = running_agents(["order-agent"])
    (node,) = gateway_nodes(1)
    auth = {"Authorization": f"Token {Token.objects.get_or_create(user=user)[0].key}"}
    body = httpx.post(f"{node.url}/api/v1/invoke", json={**ORDER, "request_id": "fl-1"}, headers=auth,
                      timeout=30).json()
    detail = httpx.get(f"{node.url}/api/v1/tasks/fl-1", headers=auth, timeout=30).json()
    assert body["status"] == "succeeded" and body["agent"] == "order-agent"
    assert body == {k: detail[k] for k in body}
    assert [e["to_status"] for e in detail["events"]] == ["pending", "routed", "running", "succeeded"]
    assert agents.stats("order-agent")["executions"]["fl-1"] == 1


def test_the_lane_refuses_bad_requests_with_json(user, running_agents, gateway_nodes):
    running_agents(["order-agent"])
    (node,) = gateway_nodes(1, REACH_MAX_BODY_BYTES="2000")
    url = f"{node.url}/api/v1/invoke"
    auth = {"Authorization": f"Token {Token.objects.get_or_create(user=user)[0].key}"}
    cases = [
        (httpx.post(url, json=ORDER, headers={"Authorization": "Token nope"}), 401, "authentication_failed"),
        (httpx.post(url, content=b"{not json", headers={**auth, "Content-Type": "application/json"}), 400,
         "bad_json"),
        (httpx.post(url, json={"payload": {}}, headers=auth), 400, "invalid"),
        (httpx.post(url, json={**ORDER, "mode": "later"}, headers=auth), 400, "invalid"),
        (httpx.post(url, json={**ORDER, "payload": {"x": "y" * 5000}}, headers=auth), 413, "payload_too_large"),
        (httpx.post(url, json=ORDER, headers={**auth, "X-Reach-Depth": "x"}), 400, "invalid_header"),
        (httpx.post(url, json={"capability": "no.such", "payload": {}}, headers=auth), 404, None),
    ]
    for response, status, code in cases:
        assert response.status_code == status, response.text
        assert response.headers["content-type"] == "application/json"
        if code:
            assert response.json()["error"]["code"] == code


def test_the_invoke_gate_bounds_the_cpu_steps_not_the_calls_in_flight(user, running_agents, gateway_nodes):
    """One gate slot on a one-process node: eight sync invokes of an agent that answers after 1.5 s are all in
    flight at once (a request leaves the gate before it calls its agent), and repeats of an in-flight request_id
    hold no slot while they wait for its outcome (the seven other requests get through meanwhile)."""
    import asyncio

    agents = running_agents(["order-agent"])  # max_concurrency 8
    agents.set_faults("order-agent", latency_ms=1500)
    (node,) = gateway_nodes(1, REACH_INVOKE_GATE="1")
    auth = {"Authorization": f"Token {Token.objects.get_or_create(user=user)[0].key}"}

    async def burst():
        async with httpx.AsyncClient(timeout=60, headers=auth) as client:
            def post(request_id):
                return client.post(f"{node.url}/api/v1/invoke", json={**ORDER, "request_id": request_id})

            first = asyncio.ensure_future(post("gate-0"))
            await asyncio.sleep(0.5)  # gate-0 is at its agent
            repeats = [asyncio.ensure_future(post("gate-0")) for _ in range(4)]
            await asyncio.sleep(0.2)  # the repeats wait on its outcome
            others = await asyncio.gather(*(post(f"gate-{i}") for i in range(1, 8)))
            return [await first, *await asyncio.gather(*repeats), *others]

    from tests.helpers import run_async

    responses = run_async(burst())
    assert [r.status_code for r in responses] == [200] * 12, [r.text for r in responses if r.status_code != 200]
    assert {r.json()["request_id"] for r in responses[:5]} == {"gate-0"}
    stats = agents.stats("order-agent")
    assert stats["max_in_flight"] == 8
    assert all(stats["executions"][f"gate-{i}"] == 1 for i in range(8))


def _connections_named(name: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name])
        return cursor.fetchone()[0]


def test_a_node_opens_its_connections_before_its_first_request(user, running_agents, gateway_nodes):
    """REACH_WARM_CONNECTIONS (on by default): a node's process holds its database threads' and its loop pool's
    connections as soon as it answers, before any invoke (they would otherwise open one by one while the first
    burst of callers waits); a node with it off opens them on demand."""
    running_agents(["order-agent"])
    sizes = {"REACH_DB_THREADS": "3", "REACH_DB_LOOP_CONNECTIONS": "2"}
    (warm,) = gateway_nodes(1, REACH_WARM_CONNECTIONS="1", PGAPPNAME="reach-warm-on", **sizes)
    (cold,) = gateway_nodes(1, REACH_WARM_CONNECTIONS="0", PGAPPNAME="reach-warm-off", **sizes)
    assert _connections_named("reach-warm-on") >= 3 + 2
    assert _connections_named("reach-warm-off") <= 1  # at most the one that served the readiness check's page
    auth = {"Authorization": f"Token {Token.objects.get_or_create(user=user)[0].key}"}
    answer = httpx.post(f"{warm.url}/api/v1/invoke", json={**ORDER, "request_id": "warm-1"}, headers=auth,
                        timeout=30)
    assert answer.status_code == 200 and answer.json()["status"] == "succeeded"
    assert _connections_named("reach-warm-on") <= 1 + 3 + 2  # warming opened no more than the sizes allow


def test_callers_that_miss_the_token_cache_together_share_one_lookup(user, monkeypatch):
    """A burst of requests with a token the process has not seen yet (new connections of one caller, or all
    requests in flight when the cache entry expires) runs one query for the token, not one each."""
    import asyncio

    from routing.api import fastlane
    from tests.helpers import run_async

    key = Token.objects.get_or_create(user=user)[0].key
    looked_up: list[str] = []
    real = fastlane._token_user

    def counting(token_key):
        looked_up.append(token_key)
        return real(token_key)

    monkeypatch.setattr(fastlane, "_token_user", counting)
    monkeypatch.setattr(fastlane, "_users", {})

    async def burst():
        return await asyncio.gather(*(fastlane._caller(k) for k in [key] * 20 + ["no-such-token"] * 5))

    callers = run_async(burst())
    assert [c.pk if c else None for c in callers] == [user.pk] * 20 + [None] * 5
    assert sorted(looked_up) == sorted([key, "no-such-token"])
    assert fastlane._lookups == {}  # nothing left behind once the lookups are done
    run_async(burst())
    assert looked_up.count(key) == 1 and looked_up.count("no-such-token") == 2  # known tokens come from the cache
