"""Ledger: entries per attempt, token sources, the weekly report, CSV, budgets, metrics and the finance role."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from ledger.models import Budget, CostEntry
from ledger.services import cost_entries_record, iso_week
from registry.models import Team

ORDER = {"capability": "order.query", "payload": {"order_id": "3"}}


@pytest.mark.django_db(transaction=True)
def test_every_attempt_has_an_entry_with_retries_and_fallback(api, running_agents, settings):
    settings.REACH = {**settings.REACH, "BACKOFF_BASE_S": 0.01}
    agents = running_agents(["order-agent", "doc-summary-agent", "notify-agent", "codegen-agent",
                             "weekly-report-agent"])
    agents.set_faults("order-agent", fail_rate=1.0, fail_status=503)
    api.post("/api/v1/invoke", {**ORDER, "request_id": "l-retry"}, format="json")
    entries = list(CostEntry.objects.filter(request_id="l-retry").order_by("attempt_number"))
    assert [(e.attempt_number, e.is_retry, e.outcome) for e in entries] == [
        (1, False, "server_error"), (2, True, "server_error"), (3, True, "server_error")]
    # no usage in a 5xx answer: the declared 300 tokens (70/30) at order.query's prices, marked estimated
    assert all(e.tokens_estimated and e.cost == Decimal("0.000348") and e.team_slug == "commerce" for e in entries)

    agents.set_faults("doc-summary-agent", bad_output_rate=1.0)
    api.post("/api/v1/invoke", {"task": "summarize this article for me", "request_id": "l-fb",
                                "payload": {"text": "An article."}}, format="json")
    fb = list(CostEntry.objects.filter(request_id="l-fb").order_by("attempt_number"))
    assert fb[0].agent_endpoint == "doc-summary-agent" and fb[0].outcome == "bad_output"
    assert len(fb) == 1 or fb[-1].is_fallback


@pytest.mark.django_db(transaction=True)
def test_tokens_come_from_usage_else_the_declared_profile(api, running_agents, settings):
    settings.REACH = {**settings.REACH, "MIN_TIMEOUT_S": 0.3}
    agents = running_agents(["order-agent"])
    api.post("/api/v1/invoke", {**ORDER, "request_id": "l-usage"}, format="json")
    real = CostEntry.objects.get(request_id="l-usage")
    assert not real.tokens_estimated and real.output_tokens == 50 and real.input_tokens > 100
    # order.query prices per 1k tokens: 0.0008 in, 0.002 out
    expected = (Decimal(real.input_tokens) * Decimal("0.0008") + 50 * Decimal("0.002")) / 1000
    assert real.cost == expected.quantize(Decimal("0.000001"))
    agents.set_faults("order-agent", latency_ms=1500)
    api.post("/api/v1/invoke", {**ORDER, "request_id": "l-est"}, format="json")
    estimated = CostEntry.objects.filter(request_id="l-est").first()
    assert estimated.tokens_estimated and estimated.input_tokens + estimated.output_tokens == 300  # declared


def _entry(week_start: datetime, day: int, agent: str, team: str, latency: float, outcome: str, cost: str,
           tin: int = 100, tout: int = 50, retry: bool = False) -> CostEntry:
    at = week_start + timedelta(days=day)
    return CostEntry(created_at=at, week=iso_week(at), request_id=f"r{day}{latency}", agent_endpoint=agent,
                     team_slug=team, latency_ms=latency, outcome=outcome, cost=Decimal(cost), input_tokens=tin,
                     output_tokens=tout, is_retry=retry)


@pytest.fixture
def known_weeks(db):
    monday = datetime(2026, 11, 16, 9, tzinfo=UTC)  # 2026-W47
    CostEntry.objects.bulk_create([
        _entry(monday, 0, "a", "t1", 10, "success", "0.10"),
        _entry(monday, 1, "a", "t1", 20, "success", "0.10"),
        _entry(monday, 2, "a", "t1", 30, "server_error", "0.10", retry=True),
        _entry(monday, 3, "a", "t1", 40, "success", "0.20"),
        _entry(monday, 0, "b", "t2", 100, "success", "1.00", tin=1000, tout=10),
        _entry(monday - timedelta(days=7), 0, "a", "t1", 5, "success", "0.05"),
    ])


def test_weekly_numbers_for_a_known_data_set(api, known_weeks, admin_user):
    client = APIClient()
    client.force_authenticate(admin_user)
    body = client.get("/api/v1/ledger/weekly", {"week": "2026-W47"}).json()
    assert body["count"] == 2
    a, b = body["results"]
    assert a == {"agent": "a", "team": "t1", "week": "2026-W47", "calls": 4, "success_rate": 0.75,
                 "p50_latency_ms": 25.0, "p95_latency_ms": 38.5, "tokens_in": 400, "tokens_out": 200, "cost": 0.5,
                 "retries": 1, "fallbacks": 0, "calls_change": 3, "cost_change": 0.45}
    assert (b["agent"], b["calls"], b["cost"], b["calls_change"]) == ("b", 1, 1.0, None)
    teams = client.get("/api/v1/ledger/weekly", {"week": "2026-W47", "by": "team", "team": "t2"}).json()
    assert [(t["team"], t["calls"]) for t in teams["results"]] == [("t2", 1)]


def test_weekly_csv(known_weeks, admin_user):
    client = APIClient()
    client.force_authenticate(admin_user)
    response = client.get("/api/v1/ledger/weekly", {"week": "2026-W47", "agent": "a", "export": "csv"})
    assert response["Content-Type"] == "text/csv"
    assert response.content.decode() == (
        "agent,team,week,calls,success_rate,p50_latency_ms,p95_latency_ms,tokens_in,tokens_out,cost,retries,"
        "fallbacks,calls_change,cost_change\n"
        "a,t1,2026-W47,4,0.75,25.0,38.5,400,200,0.5,1,0,3,0.45\n")


def test_bad_week_is_a_400(known_weeks, admin_user):
    client = APIClient()
    client.force_authenticate(admin_user)
    assert client.get("/api/v1/ledger/weekly", {"week": "2026-48"}).status_code == 400


def test_only_finance_and_staff_read_the_ledger(api, user, known_weeks, django_user_model):
    assert api.get("/api/v1/ledger/weekly", {"week": "2026-W47"}).status_code == 403
    finance = django_user_model.objects.create_user("fin", password="pw-fin-12345")
    finance.groups.add(Group.objects.get(name="finance"))
    client = APIClient()
    client.force_authenticate(finance)
    assert client.get("/api/v1/ledger/weekly", {"week": "2026-W47"}).status_code == 200
    client.force_login(finance)
    finance.is_staff = True  # finance reaches the admin, and there the report only
    finance.save()
    page = client.get("/admin/ledger/costentry/weekly/?week=2026-W47")
    assert page.status_code == 200 and b"<svg" in page.content and b"per-agent" in page.content
    assert b"<polyline" in page.content and b"2026-W46: 0.0500" in page.content  # the weekly trend
    assert client.get("/admin/registry/agent/").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_budget_refuses_past_the_cap_and_warns_at_80_percent(api, running_agents, user):
    running_agents(["order-agent"])
    team = Team.objects.get(slug="commerce")
    Budget.objects.create(team=team, monthly_limit=Decimal("1.00"))
    now = datetime.now(UTC)
    cost_entries_record(entries=[CostEntry(created_at=now, week=iso_week(now), request_id="seed",
                                           agent_endpoint="order-agent", team_slug="commerce", outcome="success",
                                           cost=Decimal("0.85"))])
    warned = api.post("/api/v1/invoke", {**ORDER, "request_id": "b-warn"}, format="json").json()
    assert warned["status"] == "succeeded"
    assert "85%" in warned["decision"]["budget_warnings"][0]
    cost_entries_record(entries=[CostEntry(created_at=now, week=iso_week(now), request_id="seed2",
                                           agent_endpoint="order-agent", team_slug="commerce", outcome="success",
                                           cost=Decimal("0.20"))])
    from ledger import services

    services._budgets_cache.clear()
    refused = api.post("/api/v1/invoke", {**ORDER, "request_id": "b-refused"}, format="json")
    assert refused.status_code == 402
    assert refused.json()["error"]["code"] == "budget_exceeded" and "team budget" in refused.json()["error"]["message"]


@pytest.mark.django_db(transaction=True)
def test_metrics_after_traffic(api, running_agents, admin_client, client):
    running_agents(["order-agent"])
    api.post("/api/v1/invoke", ORDER, format="json")
    assert client.get("/metrics").status_code == 403
    text = admin_client.get("/metrics").content.decode()
    assert 'reach_invokes_total{agent="order-agent",outcome="succeeded"}' in text
    assert "reach_resolve_seconds_count" in text and "reach_manual_review_waiting" in text
    assert 'reach_agent_call_seconds_count{agent="order-agent",outcome="success"}' in text


@pytest.mark.django_db(transaction=True)
def test_timeline_page_shows_attempts_callbacks_and_cost_for_a_task_with_fallback(api, admin_client,
                                                                                 running_agents):
    from routing.models import Task

    agents = running_agents(["doc-summary-agent", "order-agent", "notify-agent", "codegen-agent",
                             "weekly-report-agent"])
    agents.set_faults("doc-summary-agent", bad_output_rate=1.0)
    api.post("/api/v1/invoke", {"task": "summarize this article for me", "request_id": "tl-1",
                                "payload": {"text": "An article."}, "callback_url": "http://127.0.0.1:9/hook"},
             format="json")
    task = Task.objects.get(request_id="tl-1")
    page = admin_client.get(f"/admin/routing/task/{task.pk}/change/").content.decode()
    assert "Why this agent" in page and "bad_output" in page
    assert "doc-summary-agent:" in page and "total" in page  # the cost lines
    assert "http://127.0.0.1:9/hook" in page  # the callback delivery


@pytest.mark.django_db(transaction=True)
def test_budget_admin_warns_past_80_percent(admin_client, registry_ready):
    team = Team.objects.get(slug="commerce")
    Budget.objects.create(team=team, monthly_limit=Decimal("2.00"))
    now = datetime.now(UTC)
    cost_entries_record(entries=[CostEntry(created_at=now, week=iso_week(now), request_id="w",
                                           agent_endpoint="order-agent", team_slug="commerce", outcome="success",
                                           cost=Decimal("1.70"))])
    page = admin_client.get("/admin/ledger/budget/").content.decode()
    assert "1.7000 (85%)" in page and "spent this month (85%)" in page


@pytest.mark.django_db(transaction=True)
def test_cost_preference_lets_a_cheaper_candidate_rank_higher(api, running_agents):
    from registry.models import CapabilityVersion

    running_agents(["order-agent", "notify-agent", "doc-summary-agent", "codegen-agent"])
    body = {"task": "email the customer that their order is delayed"}
    plain = api.post("/api/v1/resolve", body, format="json").json()["candidates"]
    assert all(c["breakdown"]["cost_penalty"] == 0 for c in plain)
    # make the plain winner the dearest candidate; asking for cheap routing costs it a penalty
    top = plain[0]
    CapabilityVersion.objects.filter(pk=top["version_id"]).update(cost_per_call=Decimal("5"))
    from routing import snapshot

    snapshot.bump_generation()
    cheap = api.post("/api/v1/resolve", {**body, "cost_preference": 1.0}, format="json").json()["candidates"]
    by_capability = {c["capability"]: c for c in cheap}
    assert by_capability[top["capability"]]["breakdown"]["cost_penalty"] == pytest.approx(0.1)
    assert by_capability[top["capability"]]["score"] < top["score"]
