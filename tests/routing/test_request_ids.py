"""request_ids are per caller (issue 12, item 12): one caller cannot take, read or block another's ids."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from routing.models import Task
from tests.factories import allowlisted
from tests.helpers import as_user, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
ORDER = {"capability": "order.query", "payload": {"order_id": "7"}}


@pytest.fixture
def squatter(db):
    return get_user_model().objects.create_user("squatter", password="x")


def test_a_request_id_taken_by_another_caller_still_runs_for_its_owner(api, user, squatter, running_agents):
    agents = running_agents(["order-agent"])
    # the squatter sends first, with the id the rightful owner will use
    first = as_user(squatter).post("/api/v1/invoke", {**ORDER, "request_id": "order-7"}, format="json")
    assert first.status_code == 200 and first.json()["status"] == "succeeded"
    # the owner's request runs as its own task: no 409, and the squatter's outcome is not handed over
    mine = api.post("/api/v1/invoke", {**ORDER, "payload": {"order_id": "8"}, "request_id": "order-7"},
                    format="json")
    assert mine.status_code == 200, mine.json()
    assert mine.json()["status"] == "succeeded" and mine.json()["request_id"] == "order-7"
    theirs, own = Task.objects.get(caller=squatter, request_id="order-7"), Task.objects.get(caller=user,
                                                                                            request_id="order-7")
    assert theirs.pk != own.pk and own.payload == {"order_id": "8"}
    assert theirs.key == "order-7" and own.key == f"order-7~{user.pk}"
    # the agent was sent each task's own key, once each
    executions = agents.stats("order-agent")["executions"]
    assert executions["order-7"] == 1 and executions[own.key] == 1
    # each caller reads its own task under the same id, and a repeat still never runs twice
    assert api.get("/api/v1/tasks/order-7").json()["result"] == own.result
    assert as_user(squatter).get("/api/v1/tasks/order-7").json()["result"] == theirs.result
    again = api.post("/api/v1/invoke", {**ORDER, "request_id": "order-7"}, format="json")
    assert again.json()["result"] == own.result
    assert agents.stats("order-agent")["executions"][own.key] == 1


def test_another_callers_task_is_not_found_under_its_request_id(api, squatter, running_agents):
    running_agents(["order-agent"])
    api.post("/api/v1/invoke", {**ORDER, "request_id": "private-1"}, format="json")
    # nothing tells the other caller that the id exists
    assert as_user(squatter).get("/api/v1/tasks/private-1").status_code == 404
    assert as_user(squatter).post("/api/v1/tasks/private-1/feedback", {"correct": False},
                                  format="json").status_code == 404


def test_an_async_agent_reports_on_the_suffixed_key(api, user, squatter, live_server, running_agents):
    key = allowlisted("ocr-agent", team="vision")
    running_agents(["ocr-agent"], gateway=live_server.url, keys={"ocr-agent": key})
    body = {"capability": "ocr.extract", "payload": {"image_url": "x.png"}, "request_id": "scan-1"}
    assert as_user(squatter).post("/api/v1/invoke", body, format="json").status_code == 202
    assert api.post("/api/v1/invoke", body, format="json").status_code == 202
    # the agent calls back on each task's key (/api/v1/tasks/<key>/callback): both complete, each its own
    wait_until(lambda: set(Task.objects.filter(request_id="scan-1").values_list("status", flat=True))
               == {"succeeded"}, timeout=20, message="both agent callbacks")
    assert Task.objects.get(caller=user, request_id="scan-1").key == f"scan-1~{user.pk}"
    assert api.get("/api/v1/tasks/scan-1").json()["status"] == "succeeded"
