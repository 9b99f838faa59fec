from __future__ import annotations

import factory
from django.utils import timezone

from registry.choices import VersionState
from registry.models import Agent, AllowlistEntry, Capability, CapabilityVersion, Environment, Instance, Team
from routing.models import Attempt, Task


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"team-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.title())


class EnvironmentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Environment
        django_get_or_create = ("name",)

    name = "dev"


class AgentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Agent
        django_get_or_create = ("endpoint_id",)

    endpoint_id = factory.Sequence(lambda n: f"agent-{n}")
    display_name = factory.LazyAttribute(lambda o: o.endpoint_id)
    team = factory.SubFactory(TeamFactory)
    environment = factory.SubFactory(EnvironmentFactory)


class InstanceFactory(factory.django.DjangoModelFactory):
    """A live, ONLINE instance that heartbeated just now (its URL answers nothing: give a real one to call it)."""

    class Meta:
        model = Instance

    agent = factory.SubFactory(AgentFactory)
    instance_id = factory.Sequence(lambda n: f"127.0.0.1:{20000 + n}")
    url = factory.LazyAttribute(lambda o: f"http://{o.instance_id}/invoke")
    health_url = factory.LazyAttribute(lambda o: f"http://{o.instance_id}/health")
    reg_version = 1
    last_heartbeat_at = factory.LazyFunction(timezone.now)
    last_seen_at = factory.LazyFunction(timezone.now)


class CapabilityFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Capability
        django_get_or_create = ("name",)

    agent = factory.SubFactory(AgentFactory)
    name = factory.Sequence(lambda n: f"capability.n{n}")


class CapabilityVersionFactory(factory.django.DjangoModelFactory):
    """A version that passes submission (10 examples, a negative case, a preset action); DRAFT unless told."""

    class Meta:
        model = CapabilityVersion

    capability = factory.SubFactory(CapabilityFactory)
    version = "1.0.0"
    state = VersionState.DRAFT
    action = "query"
    description = factory.LazyAttribute(lambda o: f"Answers {o.capability.name} requests.")
    examples = factory.LazyAttribute(lambda o: [f"{o.capability.name} request number {i}" for i in range(10)])
    negative_cases = ["write a poem about the sea"]
    input_schema = {"type": "object"}
    output_schema = {"type": "object"}


class TaskFactory(factory.django.DjangoModelFactory):
    """A finished task served by ``version``'s agent (status SUCCEEDED unless told)."""

    class Meta:
        model = Task

    request_id = factory.Sequence(lambda n: f"req-{n}")
    status = "succeeded"
    version = factory.SubFactory(CapabilityVersionFactory, state=VersionState.ACTIVE)
    agent_endpoint = factory.LazyAttribute(lambda o: o.version.capability.agent.endpoint_id if o.version else "")
    capability_label = factory.LazyAttribute(lambda o: str(o.version) if o.version else "")
    payload = factory.LazyFunction(dict)


class AttemptFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Attempt

    task = factory.SubFactory(TaskFactory)
    number = 1
    version = factory.LazyAttribute(lambda o: o.task.version)
    instance = factory.SubFactory(InstanceFactory)
    started_at = factory.LazyFunction(timezone.now)
    latency_ms = 40.0
    outcome = "success"


def allowlisted(endpoint_id: str, environment: str = "dev", team: str = "commerce") -> str:
    """Allowlist an endpoint id and return its raw agent key."""
    from registry.services import allowlist_entry_issue

    _, raw = allowlist_entry_issue(endpoint_id=endpoint_id, environment=environment, team=team)
    return raw


def agent_client(key: str):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Agent {key}")
    return client


def registration(endpoint_id: str, port: int = 9999, **overrides) -> dict:
    body = {"endpoint_id": endpoint_id, "environment": "dev", "instance_id": f"127.0.0.1:{port}",
            "url": f"http://127.0.0.1:{port}/invoke", "health_url": f"http://127.0.0.1:{port}/health",
            "reg_version": 1, "started_at": "2026-11-29T10:00:00Z"}
    body.update(overrides)
    return body


__all__ = ["AgentFactory", "AllowlistEntry", "AttemptFactory", "CapabilityFactory", "CapabilityVersionFactory",
           "Environment", "EnvironmentFactory", "InstanceFactory", "TaskFactory", "TeamFactory", "agent_client",
           "allowlisted", "registration"]
