"""Bad input gets a clear 4xx JSON error, never a 500 (issue 12, item 3): every case below was a 500 (Django's
debug page with DEBUG on) before."""

from __future__ import annotations

import json
import logging

import pytest
from rest_framework.test import APIClient

from tests.factories import agent_client, allowlisted, registration

pytestmark = pytest.mark.django_db

ORDER = {"capability": "order.query", "payload": {"order_id": "A-1"}}


def _error(response, status: int | tuple = (400,)) -> dict:
    statuses = (status,) if isinstance(status, int) else status
    assert response.status_code in statuses, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    return response.json()["error"]


def _raw(client, path: str, body: bytes, **extra):
    return client.post(path, data=body, content_type="application/json", **extra)


@pytest.fixture
def registered(db):
    key = allowlisted("order-agent")
    assert agent_client(key).post("/api/v1/agents/register", registration("order-agent")).status_code == 201
    return key


@pytest.mark.parametrize("body", [
    b'{"capability": "order.query", "payload": {"note": "a\\u0000b"}}',
    b'{"capability": "order.query", "payload": {"note": "\\ud800"}}',
    b'{"capability": "order.query", "payload": {"\\u0000": 1}}',
    b'{"capability": "order.query", "mode": "\\ud800"}',
    b'{"capability": "order.query", "payload": {"n": 1e400}}',
    b'{"capability": "order.query", "payload": {"n": NaN}}',
    b'{"capability": "order.query", "payload": ' + b'[' * 1000 + b']' * 1000 + b'}',
    b'{"capability": "order.\xff"}',
], ids=["nul", "lone-surrogate", "nul-key", "surrogate-mode", "inf", "nan", "deep", "not-utf8"])
def test_invoke_refuses_bodies_that_cannot_be_stored_or_rendered(api, body):
    error = _error(_raw(api, "/api/v1/invoke", body))
    assert error["code"] in ("bad_characters", "too_deep", "bad_json")


def test_callback_result_and_draft_schema_with_nul_are_refused(api, registered):
    error = _error(_raw(agent_client(registered), "/api/v1/tasks/t-1/callback",
                        b'{"status": "succeeded", "result": {"x": "\\u0000"}}'))
    assert error["code"] == "bad_characters"
    error = _error(_raw(api, "/api/v1/capability-versions/",
                        b'{"capability": "order.query", "input_schema": {"title": "\\u0000"}}'))
    assert error["code"] == "bad_characters"


def test_deep_json_is_refused_on_agent_endpoints_too(registered):
    body = b'{"instance_id": "x", "load": ' + b'[' * 5000 + b']' * 5000 + b'}'
    assert _error(_raw(agent_client(registered), "/api/v1/agents/heartbeat", body))["code"] == "too_deep"


@pytest.mark.parametrize("header, value", [
    ("HTTP_TRACEPARENT", "00-" + "a" * 32 + "-" + "b" * 16 + "-01" + "x" * 500),
    ("HTTP_X_REACH_PARENT_REQUEST_ID", "p" * 101),
    ("HTTP_X_REACH_TRACE_ID", "tr\u00e9ce"),
    ("HTTP_X_REACH_TRACE_ID", "t" * 65),
    ("HTTP_X_REACH_CALL_PATH", "a,b\u00e9"),
    ("HTTP_X_REACH_DEPTH", "99999999999999999999"),
    ("HTTP_X_REACH_RETRY_BUDGET", "-1"),
])
def test_invoke_headers_out_of_shape_are_refused(api, header, value):
    assert _error(api.post("/api/v1/invoke", ORDER, **{header: value}))["code"] == "invalid_header"


@pytest.mark.parametrize("field, value", [
    ("request_id", "r\u00e9quest"),
    ("request_id", "a/b"),
    ("callback_url", "http://example.com:99999/hook"),
    ("callback_url", "http://" + "a" * 64 + ".example.com/hook"),
    ("mode", "later"),
])
def test_invoke_fields_out_of_shape_are_refused(api, field, value):
    error = _error(api.post("/api/v1/invoke", {**ORDER, field: value}))
    assert field in json.dumps(error)


def test_integers_out_of_column_range_are_refused(api, registered):
    agent = agent_client(registered)
    too_big = agent.post("/api/v1/agents/register", registration("order-agent", reg_version=2**63))
    assert "reg_version" in _error(too_big)["details"]
    beat = agent.post("/api/v1/agents/heartbeat", {"instance_id": "127.0.0.1:9999", "in_flight": 2**31})
    assert "in_flight" in _error(beat)["details"]
    draft = api.post("/api/v1/capability-versions/", {"capability": "order.query", "avg_tokens_per_call": 2**31})
    assert "avg_tokens_per_call" in _error(draft)["details"]


@pytest.mark.parametrize("path", ["/api/v1/agents/", "/api/v1/instances/", "/api/v1/capability-versions/"])
def test_huge_limit_and_offset_on_lists(api, path):
    assert api.get(path, {"limit": "99999999999999999999"}).status_code == 200
    assert _error(api.get(path, {"offset": "99999999999999999999"}))["code"] == "invalid_offset"


@pytest.mark.parametrize("week", ["2025-W53", "0000-W01", "0001-W01"])
def test_weeks_outside_the_iso_calendar_are_refused(django_user_model, week):
    from django.contrib.auth.models import Group

    finance = django_user_model.objects.create_user("fin", password="pw-fin-12345")
    finance.groups.add(Group.objects.get(name="finance"))
    client = APIClient()
    client.force_authenticate(finance)
    assert _error(client.get("/api/v1/ledger/weekly", {"week": week}))["code"] == "invalid_week"


@pytest.mark.parametrize("megabytes", [5, 50])
def test_bodies_over_the_limit_answer_413_as_json(api, megabytes):
    body = b'{"capability": "order.query", "payload": {"blob": "' + b"x" * (megabytes << 20) + b'"}}'
    assert _error(_raw(api, "/api/v1/invoke", body), 413)["code"] == "payload_too_large"


def test_unknown_api_path_and_method_answer_json(api):
    assert _error(api.get("/api/v1/no-such-thing"), 404)["code"] == "not_found"
    assert _error(api.delete("/api/v1/invoke"), 405)


def test_an_unexpected_error_is_a_json_500_whose_log_line_quotes_nothing(api, monkeypatch, caplog):
    """A database error's message carries fragments of the statement's data: the log gets its type only."""
    from django.db import DataError

    from routing.api import views

    def explode(**kwargs):
        raise DataError("invalid input syntax DETAIL: Token \"IBAN DE89370400440532013000\" is invalid")

    monkeypatch.setattr(views, "task_invoke", explode)
    with caplog.at_level(logging.INFO):
        response = APIClient(raise_request_exception=False, HTTP_AUTHORIZATION=api._credentials[
            "HTTP_AUTHORIZATION"]).post("/api/v1/invoke", ORDER, format="json")
    assert _error(response, 500)["code"] == "server_error"
    assert "IBAN" not in response.content.decode()
    assert any(getattr(r, "exc_type", "") == "DataError" for r in caplog.records)
    logged = json.dumps([{**r.__dict__, "exc_info": repr(r.exc_info)} for r in caplog.records], default=str)
    assert "DE89370400440532013000" not in logged


def test_admin_forms_refuse_json_that_cannot_be_stored(admin_client, user):
    from routing.models import Schedule

    response = admin_client.post("/admin/routing/schedule/add/", {
        "name": "nul", "enabled": "on", "cron": "0 3 * * *", "capability": "order.query",
        "payload": '{"note": "a\\u0000b"}', "caller": user.pk})
    assert response.status_code == 200 and b"NUL character" in response.content
    assert not Schedule.objects.exists()
