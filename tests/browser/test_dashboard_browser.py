"""The operations dashboard and the onboarding page in a real browser. An operator sees a failing agent and its open
breaker after a fault is injected into a real example agent, a team member sees only their team, and an agent
onboarded from the page registers itself with its key and receives traffic. Screenshots go to docs/screenshots/."""

from __future__ import annotations

import pytest
import yaml
from django.core.management import call_command

from registry.choices import VersionState
from registry.models import CapabilityVersion, Instance
from reviews.services import capability_version_approve, capability_version_submit
from routing import breaker, snapshot
from tests.browser.conftest import shot
from tests.helpers import wait_until
from tests.reviews.conftest import person
from tests.routing.conftest import instance_of, register_agents, registry_ready  # noqa: F401  (shared fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
ORDER = {"capability": "order.query", "payload": {"order_id": "A-1"}}
SUMMARY = {"capability": "document.summarize", "payload": {"text": "A long text."}}


def test_operator_sees_the_failing_agent_and_its_open_breaker(login, live_server, django_user_model, agent_procs,
                                                              api, admin_user, settings):
    settings.REACH = {**settings.REACH, "BACKOFF_BASE_S": 0.001, "BACKOFF_JITTER_S": 0.001}
    call_command("reach_import", "examples/descriptors", verbosity=0)
    CapabilityVersion.objects.update(state=VersionState.ACTIVE)
    agents = agent_procs(["order-agent", "doc-summary-agent"])
    register_agents(agents, ["order-agent", "doc-summary-agent"])
    for i in range(4):
        assert api.post("/api/v1/invoke", {**SUMMARY, "request_id": f"ok-{i}"}, format="json").status_code == 200
        assert api.post("/api/v1/invoke", {**ORDER, "request_id": f"fine-{i}"}, format="json").status_code == 200

    agents.set_faults("order-agent", fail_rate=1.0, fail_status=500)  # the fault
    for i in range(7):  # 3 attempts each: 21 failed calls in the breaker's window
        api.post("/api/v1/invoke", {**ORDER, "request_id": f"bad-{i}"}, format="json")
    assert breaker.state(instance_of("order-agent").pk) == breaker.OPEN

    admin_user.set_password("pw-admin-123")
    admin_user.save()
    operator = login("admin", "pw-admin-123")
    assert operator.inner_text("#site-name") == "Agent-Reach"
    order_row = operator.locator("tr[data-agent='order-agent']")
    assert "failing" in order_row.get_attribute("class")
    attention = order_row.locator(".attention").inner_text()
    assert "1 breaker open" in attention and "success" in attention
    assert "failing" not in (operator.locator("tr[data-agent='doc-summary-agent']").get_attribute("class") or "")
    assert "1 breaker open" in operator.inner_text("#open-breakers")
    assert "order-agent/" in operator.inner_text("#open-breakers")
    shot(operator, "dashboard-operator")
    operator.click("#open-breakers a >> nth=0")  # the tile opens the instances behind it
    operator.wait_for_selector("#result_list")
    assert operator.locator("#result_list tbody tr").count() == 1
    assert "order-agent" in operator.inner_text("#result_list")

    person(django_user_model, "kim", team="knowledge", group="agent team member")
    member = login("kim", "pw-kim-123")
    assert member.inner_text("#dashboard-scope") == "knowledge"
    assert member.locator("tr[data-agent='doc-summary-agent']").count() == 1
    assert member.locator("tr[data-agent='order-agent']").count() == 0
    assert "order-agent" not in member.inner_text("#dashboard")
    assert "0 breakers open" in member.inner_text("#open-breakers")
    shot(member, "dashboard-team-member")


@pytest.mark.usefixtures("registry_ready")
def test_an_agent_onboarded_from_the_page_receives_traffic(login, live_server, django_user_model, agent_procs,
                                                           api, admin_user, tmp_path):
    register_agents(agent_procs(["order-agent"]), ["order-agent"])  # a live registry for the try-routing box
    admin_user.set_password("pw-admin-123")
    admin_user.save()
    page = login("admin", "pw-admin-123")
    page.goto(f"{live_server.url}/admin/registry/agent/")
    page.click("#onboard-link")
    page.fill("#id_endpoint_id", "parcel-agent")
    page.fill("#id_display_name", "Parcel tracker")
    page.select_option("#id_team", label="commerce")
    page.select_option("#id_environment", label="dev")
    page.fill("#id_capability", "parcel.track")
    page.select_option("#id_action", "query")
    examples = [f"where is parcel {n} right now" for n in range(10)]
    page.fill("#id_examples", "\n".join(examples))
    page.fill("#id_negative_cases", "write a poem about parcels")
    # the try-routing box: which ACTIVE capability a typed request goes to today, and why
    page.fill("#try-text", "where is my order 12345")
    page.wait_for_selector(".try-candidate")
    result = page.inner_text("#try-result")
    assert "order.query@1.0.0\torder-agent" in result and "cosine" in result and "decision execute" in result
    shot(page, "onboarding-form")
    page.click("input[name=onboard]")
    page.wait_for_selector("#agent-key")
    key = page.inner_text("#agent-key")
    shot(page, "onboarding-key-once")
    assert key.startswith("ar_")

    # the draft goes through review as usual
    draft = CapabilityVersion.objects.get(capability__name="parcel.track")
    capability_version_submit(version=draft, actor=admin_user)
    capability_version_approve(version=draft, actor=person(django_user_model, "rex", group="reviewer"),
                               confidence_weight=0.9)
    # the agent itself, started with the key from the page, registers with the live gateway over HTTP
    folder = tmp_path / "descriptors"
    folder.mkdir()
    (folder / "parcel-agent.yaml").write_text(yaml.safe_dump({
        "agent": {"endpoint_id": "parcel-agent", "team": "commerce", "environment": "dev"},
        "server": {"port": 9150, "transport": "http"},
        "capabilities": [{"name": "parcel.track", "version": "1.0.0", "action": "query", "examples": examples}]}))
    parcel = agent_procs(["parcel-agent"], gateway=live_server.url, keys={"parcel-agent": key}, descriptors=folder)
    wait_until(lambda: Instance.objects.filter(agent__endpoint_id="parcel-agent").exists(), message="registration")
    snapshot.bump_generation()
    body = api.post("/api/v1/invoke", {"capability": "parcel.track", "payload": {"parcel": "31"},
                                       "request_id": "first-parcel"}, format="json").json()
    assert body["status"] == "succeeded" and body["agent"] == "parcel-agent", body
    assert parcel.stats("parcel-agent")["executions"]["first-parcel"] == 1
