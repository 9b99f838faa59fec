"""Schema fuzzing (issue 12): schemathesis generates requests from the served OpenAPI schema and sends them to a
live server, once with a caller token and once with an agent key. Any 5xx, an undocumented status, a wrong
content type or a body that does not match the documented schema fails the test."""

from __future__ import annotations

import os

import httpx
import pytest
import schemathesis
from django.core.management import call_command
from hypothesis import HealthCheck, given, settings
from rest_framework.authtoken.models import Token
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from registry.choices import VersionState
from registry.models import CapabilityVersion
from tests.factories import agent_client, allowlisted, registration

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# At least 1,000 generated cases per run in all (REACH_FUZZ_EXAMPLES per operation and credential).
EXAMPLES = int(os.environ.get("REACH_FUZZ_EXAMPLES", "25"))
MIN_CASES = 1000


@pytest.fixture
def fuzz_world(live_server, django_user_model):
    call_command("reach_import", "examples/descriptors", verbosity=0)
    CapabilityVersion.objects.filter(capability__name="order.query").update(state=VersionState.ACTIVE)
    key = allowlisted("order-agent")
    assert agent_client(key).post("/api/v1/agents/register", registration("order-agent")).status_code == 201
    caller = django_user_model.objects.create_user("fuzz-caller", password="pw-fuzz-12345")
    token = Token.objects.create(user=caller).key
    raw = httpx.get(f"{live_server.url}/api/schema/", params={"format": "json"}, timeout=30).json()
    return schemathesis.openapi.from_dict(raw), {"caller token": f"Token {token}", "agent key": f"Agent {key}"}


@pytest.mark.django_db(transaction=True)
def test_generated_requests_get_documented_answers_and_no_server_error(live_server, fuzz_world):
    schema, credentials = fuzz_world
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 20
    sent: dict[str, int] = {}

    def fuzz(operation, label: str, authorization: str):
        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def run(case):
            response = case.call(base_url=live_server.url, headers={"Authorization": authorization}, timeout=30)
            case.validate_response(response, checks=CHECKS)
            sent[label] = sent.get(label, 0) + 1

        run()

    for label, authorization in credentials.items():
        for operation in operations:
            fuzz(operation, label, authorization)
    assert sum(sent.values()) >= MIN_CASES, sent
    assert all(count >= MIN_CASES // 4 for count in sent.values()), sent
