"""Reads of the registry, returning QuerySets with their FilterSet applied."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from registry.filters import AgentFilter, CapabilityVersionFilter, InstanceFilter
from registry.models import Agent, CapabilityVersion, Instance


def agent_list(*, filters: dict | None = None) -> QuerySet[Agent]:
    qs = Agent.objects.select_related("team", "environment").prefetch_related(
        Prefetch("instances", queryset=Instance.objects.filter(deregistered_at__isnull=True))
    )
    return AgentFilter(filters or {}, qs).qs


def instance_list(*, filters: dict | None = None) -> QuerySet[Instance]:
    qs = Instance.objects.select_related("agent", "agent__team", "agent__environment")
    return InstanceFilter(filters or {}, qs).qs


def capability_version_list(*, filters: dict | None = None) -> QuerySet[CapabilityVersion]:
    qs = CapabilityVersion.objects.select_related("capability", "capability__agent", "capability__agent__team",
                                                  "capability__agent__environment")
    return CapabilityVersionFilter(filters or {}, qs).qs
