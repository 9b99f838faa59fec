"""Reads of the registry, returning QuerySets with their FilterSet applied."""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, QuerySet

from registry.choices import VersionState
from registry.filters import AgentFilter, CapabilityVersionFilter, InstanceFilter
from registry.models import Agent, AuditLog, CapabilityVersion, Instance, Team


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


# --- the operations dashboard (team_ids None: every team) -----------------------------------------------------

def agent_endpoints(*, team_ids: set[int] | None) -> list[str] | None:
    """The endpoint ids of some teams' agents (None in, None out: every agent)."""
    if team_ids is None:
        return None
    return list(Agent.objects.filter(team__in=team_ids).values_list("endpoint_id", flat=True))


def agents_overview(*, team_ids: set[int] | None, limit: int = 200) -> list[dict]:
    """Agents with their team and the liveness of each live instance: [{endpoint_id, team, instances: [{pk,
    liveness, instance_id}]}]."""
    agents = Agent.objects.select_related("team").order_by("endpoint_id")
    if team_ids is not None:
        agents = agents.filter(team__in=team_ids)
    rows: dict[int, dict[str, Any]] = {a.pk: {"endpoint_id": a.endpoint_id, "team": a.team.slug, "instances": []}
                                       for a in agents[:limit]}
    for inst in (Instance.objects.filter(agent_id__in=list(rows), deregistered_at__isnull=True)
                 .values("pk", "agent_id", "liveness", "instance_id")):
        rows[inst["agent_id"]]["instances"].append(inst)
    return list(rows.values())


def canary_verdicts(*, team_ids: set[int] | None, limit: int = 8) -> list[AuditLog]:
    """The latest canary outcomes (rolled back, promoted), newest first."""
    qs = AuditLog.objects.filter(action__in=["version.rolled_back", "version.promoted"])
    if team_ids is not None:
        mine = CapabilityVersion.objects.filter(capability__agent__team__in=team_ids).values_list("pk", flat=True)
        qs = qs.filter(target_type="registry.capabilityversion", target_id__in=[str(pk) for pk in mine])
    return list(qs.order_by("-created_at", "-id")[:limit])


def canaries_live(*, team_ids: set[int] | None) -> list[CapabilityVersion]:
    qs = CapabilityVersion.objects.filter(state=VersionState.ACTIVE, is_canary=True).select_related("capability")
    if team_ids is not None:
        qs = qs.filter(capability__agent__team__in=team_ids)
    return list(qs[:20])


def team_slugs(*, team_ids: set[int] | None) -> list[str] | None:
    if team_ids is None:
        return None
    return list(Team.objects.filter(pk__in=team_ids).values_list("slug", flat=True))
