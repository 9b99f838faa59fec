from __future__ import annotations

import factory

from registry.models import AllowlistEntry, Environment, Team


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"team-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.title())


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


__all__ = ["AllowlistEntry", "Environment", "TeamFactory", "allowlisted", "agent_client", "registration"]
