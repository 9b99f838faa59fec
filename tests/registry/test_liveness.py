"""Liveness with a real agent process: registered over HTTP, killed, probed, restarted."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from registry import services
from registry.choices import Liveness
from registry.models import Instance
from tests.factories import allowlisted
from tests.helpers import WorkerProcess, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _instance() -> Instance:
    return Instance.objects.get(agent__endpoint_id="order-agent")


def test_killed_agent_goes_suspect_then_offline_and_comes_back_online(live_server, agent_procs):
    # given a real order agent that registered itself through the API
    key = allowlisted("order-agent")
    agents = agent_procs(["order-agent"], gateway=live_server.url, keys={"order-agent": key})
    wait_until(lambda: Instance.objects.filter(agent__endpoint_id="order-agent").exists(), message="registration")
    port_offset = agents.port_offset
    assert _instance().liveness == Liveness.ONLINE

    # when it is killed and 30 s pass without a heartbeat
    agents.kill()
    t0 = timezone.now()
    services.liveness_sweep(now=t0 + timedelta(seconds=31))
    # then it is SUSPECT (down-weighted, not removed)
    assert _instance().liveness == Liveness.SUSPECT

    # when its health probe keeps failing for 30 s more
    assert services.probe_health(_instance().health_url) is False
    services.instance_probe_record(instance_id=_instance().pk, ok=False, now=t0 + timedelta(seconds=45))
    assert _instance().liveness == Liveness.SUSPECT
    services.instance_probe_record(instance_id=_instance().pk, ok=False, now=t0 + timedelta(seconds=62))
    # then it is OFFLINE
    assert _instance().liveness == Liveness.OFFLINE

    # when the agent process is back (same address, no heartbeat yet) the first good probe brings it ONLINE
    agent_procs(["order-agent"], port_offset=port_offset)
    ok = services.probe_health(_instance().health_url)
    assert ok is True
    services.instance_probe_record(instance_id=_instance().pk, ok=ok)
    assert _instance().liveness == Liveness.ONLINE


def test_heartbeats_keep_an_instance_online(live_server, agent_procs):
    key = allowlisted("order-agent")
    agent_procs(["order-agent"], gateway=live_server.url, keys={"order-agent": key}, heartbeat=0.2)
    wait_until(lambda: Instance.objects.filter(agent__endpoint_id="order-agent").exists(), message="registration")
    first = _instance().last_heartbeat_at
    wait_until(lambda: _instance().last_heartbeat_at > first, message="a heartbeat")
    services.liveness_sweep()
    assert _instance().liveness == Liveness.ONLINE


def test_beat_sweep_task_probes_through_the_celery_worker(live_server, agent_procs, monkeypatch):
    # given a worker whose liveness windows are short, and an agent that registered then died
    monkeypatch.setenv("REACH_SUSPECT_AFTER_S", "0.5")
    monkeypatch.setenv("REACH_OFFLINE_AFTER_S", "0.5")
    monkeypatch.setenv("REACH_PROBE_INTERVAL_S", "0")
    worker = WorkerProcess().start()
    try:
        key = allowlisted("order-agent")
        agents = agent_procs(["order-agent"], gateway=live_server.url, keys={"order-agent": key})
        wait_until(lambda: Instance.objects.filter(agent__endpoint_id="order-agent").exists(), message="registration")
        agents.kill()
        from registry.tasks import liveness_sweep

        # when beat fires the sweep a few times
        def swept_offline():
            liveness_sweep.delay()
            return _instance().liveness == Liveness.OFFLINE

        # then the worker marks it SUSPECT, probes it (failing) and takes it OFFLINE
        wait_until(swept_offline, timeout=30, interval=0.5, message="OFFLINE through the worker")
        assert _instance().last_probe_ok is False
        # and when the agent is back, a probe run by the worker brings it ONLINE
        agent_procs(["order-agent"], port_offset=agents.port_offset)

        def swept_online():
            liveness_sweep.delay()
            return _instance().liveness == Liveness.ONLINE

        wait_until(swept_online, timeout=30, interval=0.5, message="ONLINE through the worker")
    finally:
        worker.stop()
