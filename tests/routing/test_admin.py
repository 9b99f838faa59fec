from __future__ import annotations

import pytest

from routing.models import Task

pytestmark = pytest.mark.django_db(transaction=True)


def test_task_timeline_explains_why_this_agent_and_shows_fallback(admin_client, api, running_agents):
    agents = running_agents(["doc-summary-agent", "order-agent", "notify-agent", "codegen-agent",
                             "weekly-report-agent"])
    agents.set_faults("doc-summary-agent", bad_output_rate=1.0)
    api.post("/api/v1/invoke", {"task": "summarize this article for me", "request_id": "adm-1",
                                "payload": {"text": "An article."}}, format="json")
    task = Task.objects.get(request_id="adm-1")
    page = admin_client.get(f"/admin/routing/task/{task.pk}/change/").content.decode()
    assert "Why this agent" in page and "document.summarize" in page
    assert "semantic" in page and "bad_output" in page  # breakdown and the failed attempt
    listing = admin_client.get("/admin/routing/task/?q=adm-1").content.decode()
    assert "adm-1" in listing
