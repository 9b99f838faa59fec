"""Audit and visibility (issue 12, item 11): audit rows carry the request id; team members read only their own
teams' trail; admin edits of budgets, capabilities, agents, schedules, caller secrets and callback replays
write audit rows through services."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command
from rest_framework.test import APIClient

from ledger.models import Budget
from registry.models import Agent, AuditLog, Capability, Team
from registry.services import allowlist_entry_issue
from routing.models import CallbackDelivery, CallerSecret, Schedule, Task

pytestmark = pytest.mark.django_db


@pytest.fixture
def member(django_user_model):
    call_command("reach_import", "examples/descriptors", verbosity=0)
    user = django_user_model.objects.create_user("member", password="pw-member-123", is_staff=True)
    user.groups.add(Group.objects.get(name="agent team member"))
    Team.objects.get(slug="commerce").members.add(user)
    return user


def test_audit_rows_carry_the_request_id(member):
    client = APIClient()
    client.force_authenticate(member)
    response = client.patch("/api/v1/agents/order-agent/", {"description": "d1"}, HTTP_X_REQUEST_ID="req-42")
    assert response.status_code == 200 and response["X-Request-Id"] == "req-42"
    assert AuditLog.objects.get(action="agent.changed").request_id == "req-42"
    client.patch("/api/v1/agents/order-agent/", {"description": "d2"}, HTTP_X_REQUEST_ID="bad id\u00e9")
    second = AuditLog.objects.filter(action="agent.changed").order_by("-id").first()
    assert len(second.request_id) == 32 and second.request_id != "req-42"  # generated for an unusable header


def test_team_members_read_only_their_teams_audit_rows(member, client):
    allowlist_entry_issue(endpoint_id="order-agent", environment="dev", team="commerce")
    allowlist_entry_issue(endpoint_id="notify-agent", environment="prod", team="platform")
    client.force_login(member)
    page = client.get("/admin/registry/auditlog/").content.decode()
    assert "order-agent@dev" in page and "notify-agent@prod" not in page


def test_admin_edits_write_audit_rows(admin_client, admin_user, user):
    call_command("reach_import", "examples/descriptors", verbosity=0)
    team = Team.objects.get(slug="commerce")
    response = admin_client.post("/admin/ledger/budget/add/", {"team": team.pk, "monthly_limit": "12.5",
                                                               "warn_ratio": "0.8"})
    assert response.status_code == 302, response.content[:1500]
    budget = Budget.objects.get()
    row = AuditLog.objects.get(action="budget.created")
    assert row.actor == admin_user and Decimal(row.after["monthly_limit"]) == Decimal("12.5") and row.request_id
    assert budget.monthly_limit == Decimal("12.5")

    capability = Capability.objects.get(name="order.query")
    other = Agent.objects.get(endpoint_id="notify-agent")
    response = admin_client.post(f"/admin/registry/capability/{capability.pk}/change/", {
        "name": "order.query", "agent": other.pk, "versions-TOTAL_FORMS": 0, "versions-INITIAL_FORMS": 0})
    assert response.status_code == 302, response.content[:1500]
    row = AuditLog.objects.get(action="capability.changed")
    assert row.before["agent"] != row.after["agent"] == other.pk

    response = admin_client.post("/admin/routing/schedule/add/", {
        "name": "nightly", "enabled": "on", "cron": "0 3 * * *", "capability": "order.query",
        "payload": '{"order_id": "1"}', "caller": user.pk})
    assert response.status_code == 302, response.content[:1500]
    assert AuditLog.objects.filter(action="schedule.created", target_id=str(Schedule.objects.get().pk)).exists()

    secret = CallerSecret.objects.create(caller=user, secret="s3cr3t-value")
    admin_client.post(f"/admin/routing/callersecret/{secret.pk}/delete/", {"post": "yes"})
    row = AuditLog.objects.get(action="callersecret.deleted")
    assert "s3cr3t-value" not in str(row.before)

    task = Task.objects.create(request_id="dead-1", caller=user, status="succeeded", callback_url="http://x/")
    dead = CallbackDelivery.objects.create(task=task, url="http://x/", body={}, status=CallbackDelivery.Status.DEAD)
    admin_client.post("/admin/routing/callbackdelivery/", {"action": "replay", "_selected_action": [dead.pk]})
    assert AuditLog.objects.filter(action="callback.replayed", target_id=str(dead.pk), actor=admin_user).exists()
