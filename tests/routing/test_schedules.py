"""Schedules: validated, editable in the admin, fired by a real Celery beat, each run a normal task."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from django_celery_beat.models import PeriodicTask

from reach_platform.errors import InvalidInput
from routing.models import Schedule, Task
from routing.schedules import schedule_save
from tests.helpers import BASE, subprocess_env, wait_until


@pytest.mark.django_db
@pytest.mark.parametrize("fields, message", [
    ({"cron": "* * *", "capability": "order.query"}, "five-field"),
    ({"cron": "99 * * * *", "capability": "order.query"}, "Invalid cron"),
    ({"cron": "* * * * *", "every_seconds": 5, "capability": "order.query"}, "not both"),
    ({"cron": "* * * * *"}, "capability or a task text"),
])
def test_invalid_schedules_are_refused(user, fields, message):
    with pytest.raises(InvalidInput, match=message):
        schedule_save(schedule=Schedule(name="bad", caller=user, **fields))
    assert not PeriodicTask.objects.exists()


@pytest.mark.django_db
def test_admin_creates_the_beat_entry_and_refuses_bad_cron(admin_client, user):
    response = admin_client.post("/admin/routing/schedule/add/", {
        "name": "nightly orders", "enabled": "on", "cron": "0 2 * * *", "capability": "order.query",
        "payload": '{"order_id": "1"}', "caller": user.pk})
    assert response.status_code == 302
    schedule = Schedule.objects.get(name="nightly orders")
    periodic = PeriodicTask.objects.get(pk=schedule.periodic_task_id)
    assert periodic.task == "routing.tasks.run_schedule" and periodic.crontab.hour == "2"
    bad = admin_client.post("/admin/routing/schedule/add/", {
        "name": "broken", "cron": "61 * * * *", "capability": "order.query", "payload": "{}", "caller": user.pk})
    assert bad.status_code == 200 and b"Invalid cron" in bad.content
    assert not Schedule.objects.filter(name="broken").exists()


@pytest.mark.django_db(transaction=True)
def test_schedule_fires_through_beat_and_each_run_is_a_task(user, running_agents, celery_worker_proc, tmp_path):
    agents = running_agents(["order-agent"])
    schedule = schedule_save(schedule=Schedule(name="every second", every_seconds=1, capability="order.query",
                                               payload={"order_id": "9"}, caller=user))
    beat = subprocess.Popen([sys.executable, "-m", "celery", "-A", "reach_platform", "beat", "-l", "warning",
                             "--schedule", str(tmp_path / "beat.db")], cwd=BASE, env=subprocess_env(),
                            start_new_session=True)
    try:
        runs = lambda: Task.objects.filter(parent_request_id=f"schedule:{schedule.pk}", status="succeeded")  # noqa: E731
        wait_until(lambda: runs().count() >= 2, timeout=60, interval=0.5, message="two scheduled runs")
    finally:
        os.killpg(beat.pid, signal.SIGTERM)
        beat.wait(10)
    first = runs().first()
    assert first.request_id.startswith(f"schedule-{schedule.pk}-") and first.agent_endpoint == "order-agent"
    assert sum(agents.stats("order-agent")["by_capability"].values()) >= 2
