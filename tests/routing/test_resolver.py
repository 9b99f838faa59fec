from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("text, expected", [
    ("could you check whether order 5521 has shipped", "order.query"),
    ("帮我查一下订单 889 的物流到哪了", "order.query"),
    ("can you summarize the main points of this long article", "document.summarize"),
    ("把这篇文章总结成几个要点", "document.summarize"),
])
def test_chinese_and_english_requests_route_to_the_right_agent(api, running_agents, text, expected):
    running_agents(["order-agent", "doc-summary-agent", "notify-agent", "codegen-agent"])
    response = api.post("/api/v1/resolve", {"task": text}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["candidates"][0]["capability"] == expected, body
    assert body["decision"] in ("execute", "confirm")
    # the rule-only fast path computes no embedding, so it reports no semantic score
    computed = {"rule", "keyword_hits", "confidence", "health"} | (set() if body["fast_path"] else {"semantic"})
    assert set(body["candidates"][0]["breakdown"]) >= computed


def test_request_matching_a_negative_case_is_not_routed_there(api, running_agents):
    running_agents(["order-agent", "codegen-agent", "notify-agent"])
    # "send an email to the customer about the delay" is a negative case of order.query (and an example of notify)
    body = api.post("/api/v1/resolve", {"task": "send an email to the customer about the order delay"},
                    format="json").json()
    assert "order.query" not in [c["capability"] for c in body["candidates"]]
    assert any(f["capability"] == "order.query" and "negative" in f["reason"] for f in body["filtered"])


def test_unrelated_request_lands_in_manual_review(api, running_agents):
    running_agents(["order-agent", "doc-summary-agent", "notify-agent"])
    response = api.post("/api/v1/invoke", {"task": "what is the boiling point of mercury on mars"}, format="json")
    assert response.status_code == 202
    assert response.json()["status"] == "manual_review"


def test_resolve_is_a_dry_run(api, running_agents):
    from routing.models import Task

    running_agents(["order-agent"])
    api.post("/api/v1/resolve", {"task": "where is my order 1"}, format="json")
    assert Task.objects.count() == 0


def test_resolve_refuses_bad_input(api, registry_ready):
    assert api.post("/api/v1/resolve", {}, format="json").status_code == 400
    assert api.post("/api/v1/resolve", {"capability": "no.such"}, format="json").status_code == 404
    r = api.post("/api/v1/resolve", {"capability": "document.summarize", "payload": {"text": 5}}, format="json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_payload"
