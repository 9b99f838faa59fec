"""Secrets stay out of cookies and logs (issue 12, item 13)."""

from __future__ import annotations

import re

import pytest
from django.db import IntegrityError, transaction

from reach_platform import local_services
from registry.models import AllowlistEntry, Environment, Team, hash_key
from routing.models import Task

pytestmark = pytest.mark.django_db


def test_issued_agent_keys_are_shown_once_on_a_page_not_in_the_messages_cookie(admin_client):
    team = Team.objects.create(slug="commerce", name="Commerce")
    entry = AllowlistEntry.objects.create(environment=Environment.objects.get(name="dev"), endpoint_id="order-agent",
                                          team=team)
    response = admin_client.post("/admin/registry/allowlistentry/", {"action": "issue_keys",
                                                                       "_selected_action": [entry.pk]})
    assert response.status_code == 200
    raw = re.search(r'class="agent-key">(ar_[^<]+)<', response.content.decode()).group(1)
    entry.refresh_from_db()
    assert entry.key_hash == hash_key(raw)
    assert "no-store" in response["Cache-Control"]
    assert all(raw not in morsel.value for morsel in response.cookies.values())
    assert all(raw not in morsel.value for morsel in admin_client.cookies.values())
    assert raw not in admin_client.get("/admin/registry/allowlistentry/").content.decode()


def test_postgresql_logs_no_values_of_a_failed_statement(user):
    """A duplicate request_id (a normal, idempotent repeat) made PostgreSQL log the INSERT with its payload."""
    log = local_services.DATA_DIR / "pg" / "log"
    before = log.stat().st_size
    Task.objects.create(request_id="dup-secret", caller=user, payload={"iban": "DE89370400440532013000"})
    with pytest.raises(IntegrityError), transaction.atomic():
        Task.objects.create(request_id="dup-secret", caller=user, payload={"iban": "DE89370400440532013000"})
    with log.open("rb") as handle:
        handle.seek(before)
        written = handle.read().decode(errors="replace")
    assert "duplicate key value violates unique constraint" in written  # the error itself is still logged
    assert "DE89370400440532013000" not in written and "dup-secret" not in written
