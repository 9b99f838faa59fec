"""The operations dashboard on the admin index: figures per window and per agent, failing agents and open
breakers flagged, tiles linking to the changelists behind them, team members limited to their team, and a query
count that does not grow with the data."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from ledger.services import budget_set
from registry.models import Team
from routing.breaker import _keys
from routing.models import Task
from routing.snapshot import redis_client
from tests.factories import (
    AgentFactory,
    AttemptFactory,
    CapabilityVersionFactory,
    InstanceFactory,
    TaskFactory,
)
from tests.reviews.conftest import person

pytestmark = pytest.mark.django_db


@pytest.fixture
def traffic(db):
    """commerce's order agent fails a third of its calls and one of its two instances has its breaker open;
    platform's notify agent is healthy. One failed order task is two days old (outside every window)."""
    commerce, platform = Team.objects.get_or_create(slug="commerce")[0], Team.objects.get_or_create(slug="platform")[0]
    order = AgentFactory(endpoint_id="order-agent", team=commerce)
    notify = AgentFactory(endpoint_id="notify-agent", team=platform)
    order_v = CapabilityVersionFactory(capability__agent=order, capability__name="order.query", state="active")
    notify_v = CapabilityVersionFactory(capability__agent=notify, capability__name="notify.send", state="active")
    sick, well = InstanceFactory(agent=order), InstanceFactory(agent=order)
    InstanceFactory(agent=notify)
    redis_client().set(_keys(sick.pk)[0], "1", ex=60)
    for i in range(9):
        task = TaskFactory(version=order_v, status="failed" if i % 3 == 0 else "succeeded")
        AttemptFactory(task=task, instance=sick if i % 3 == 0 else well, latency_ms=20 + i,
                       outcome="server_error" if i % 3 == 0 else "success")
    for _ in range(5):
        AttemptFactory(task=TaskFactory(version=notify_v), instance=notify.instances.first(), latency_ms=10)
    old = TaskFactory(version=order_v, status="failed")
    Task.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=2))
    budget_set(team=commerce, monthly_limit=Decimal("100"))
    yield {"sick": sick}
    redis_client().delete(_keys(sick.pk)[0])


def dashboard(user) -> str:
    client = Client()
    client.force_login(user)
    response = client.get("/admin/")
    assert response.status_code == 200
    return response.content.decode()


def row(html: str, agent: str) -> str:
    match = re.search(rf'<tr class="[^"]*" data-agent="{agent}">(.*?)</tr>', html, re.S)
    return match.group(0) if match else ""


def test_operator_sees_failing_agent_open_breaker_and_the_windows(traffic, admin_user):
    html = dashboard(admin_user)
    assert "Agent-Reach" in html and "Django administration" not in html
    order = row(html, "order-agent")
    assert 'class="failing"' in order and "success 67%" in order and "1 breaker open" in order
    assert 'class="failing"' not in row(html, "notify-agent")
    assert html.index('data-agent="order-agent"') < html.index('data-agent="notify-agent"')  # failing first
    day = re.search(r'id="invokes-2">(.*?)</div>\s*<div class="tile"', html, re.S).group(1)
    assert ">14</a>" in day and "3 failed" in day  # the two-day-old task is not in the last day
    assert re.search(r"1 breaker open</a>\s*<div>· <a [^>]*>order-agent/", html)
    assert "team commerce" in html  # its budget


def test_every_tile_links_to_a_changelist_that_answers(traffic, admin_user):
    client = Client()
    client.force_login(admin_user)
    html = client.get("/admin/").content.decode()
    links = set(re.findall(r'href="(/admin/[a-z_]+/[a-z]+/\?[^"]+)"', html))
    assert len(links) >= 8
    for link in links:
        assert client.get(link.replace("&amp;", "&")).status_code == 200, link
    failed = re.search(r'<a href="([^"]+status__exact=failed[^"]*)"', html).group(1).replace("&amp;", "&")
    listed = client.get(failed).content.decode()
    assert listed.count('class="field-status">Failed<') == 3 and "3 tasks" in listed


def test_team_member_sees_only_their_team(traffic, django_user_model):
    member = person(django_user_model, "mia", team="platform", group="agent team member")
    html = dashboard(member)
    assert 'id="dashboard-scope">platform<' in html
    assert row(html, "notify-agent") and not row(html, "order-agent")
    assert "order-agent" not in html and "team commerce" not in html
    day = re.search(r'id="invokes-2">(.*?)</div>\s*<div class="tile"', html, re.S).group(1)
    assert ">5</a>" in day and "0 failed" in day
    assert "0 breakers open" in html


def test_the_page_runs_a_bounded_number_of_queries(traffic, admin_user, django_assert_max_num_queries):
    client = Client()
    client.force_login(admin_user)
    client.get("/admin/")  # warm the session and permission caches
    for _ in range(3):
        extra = AgentFactory()
        for _ in range(3):
            AttemptFactory(task=TaskFactory(version=CapabilityVersionFactory(capability__agent=extra,
                                                                             state="active")),
                           instance=InstanceFactory(agent=extra))
    with django_assert_max_num_queries(40):
        assert client.get("/admin/").status_code == 200
