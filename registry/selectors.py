"""Reads of the registry, returning QuerySets with their FilterSet applied, scoped to what the reader may see.

Who reads what (the API and the admin both read through these):
- admins, reviewers and finance: every team's agents, instances and capability versions;
- a team member: its own teams' agents, instances (with their URLs) and versions in every state;
- anyone authenticated (a caller): the ACTIVE capability versions (names, descriptions, schemas: what it can
  invoke), and nothing of agents and instances (addresses are the gateway's business, not the caller's).
"""

from __future__ import annotations

from typing import Any

from django.db.models import CharField, Prefetch, Q, QuerySet
from django.db.models.functions import Cast

from registry.choices import VersionState
from registry.filters import AgentFilter, CapabilityVersionFilter, InstanceFilter
from registry.models import Agent, AllowlistEntry, AuditLog, Capability, CapabilityVersion, Instance, Team
from registry.permissions import sees_all_teams, team_ids


def team_scoped(qs: QuerySet, *, user, team_path: str) -> QuerySet:
    """``qs`` limited to the rows of the user's teams, unless the user reads every team."""
    if sees_all_teams(user):
        return qs
    return qs.filter(**{f"{team_path}__in": team_ids(user)})


def agent_list(*, user, filters: dict | None = None) -> QuerySet[Agent]:
    qs = Agent.objects.select_related("team", "environment").prefetch_related(
        Prefetch("instances", queryset=Instance.objects.filter(deregistered_at__isnull=True))
    )
    return AgentFilter(filters or {}, team_scoped(qs, user=user, team_path="team")).qs


def instance_list(*, user, filters: dict | None = None) -> QuerySet[Instance]:
    qs = Instance.objects.select_related("agent", "agent__team", "agent__environment")
    return InstanceFilter(filters or {}, team_scoped(qs, user=user, team_path="agent__team")).qs


def capability_versions_visible(qs: QuerySet[CapabilityVersion], *, user) -> QuerySet[CapabilityVersion]:
    if sees_all_teams(user):
        return qs
    return qs.filter(Q(state=VersionState.ACTIVE) | Q(capability__agent__team__in=team_ids(user)))


def capability_version_list(*, user, filters: dict | None = None) -> QuerySet[CapabilityVersion]:
    qs = CapabilityVersion.objects.select_related("capability", "capability__agent", "capability__agent__team",
                                                  "capability__agent__environment")
    return CapabilityVersionFilter(filters or {}, capability_versions_visible(qs, user=user)).qs


def team_list(*, user) -> QuerySet[Team]:
    """Admins and reviewers see every team and its members; anyone else only the teams they belong to."""
    return team_scoped(Team.objects.all(), user=user, team_path="pk")


# Audit targets that belong to a team, and the path from each to its team.
_TEAM_TARGETS = [(Agent, "team"), (Instance, "agent__team"), (Capability, "agent__team"),
                 (CapabilityVersion, "capability__agent__team"), (AllowlistEntry, "team"), (Team, "pk")]


def audit_log_list(*, user) -> QuerySet[AuditLog]:
    """Admins and reviewers read the whole trail; anyone else the rows about their own teams' objects and their
    own actions (another team's rows carry its allowlist key prefixes and its people's names)."""
    qs = AuditLog.objects.all()
    if sees_all_teams(user):
        return qs
    teams = team_ids(user)
    visible = Q(actor_id=user.pk)
    for model, path in _TEAM_TARGETS:
        ids = (model._default_manager.filter(**{f"{path}__in": teams}).annotate(key=Cast("pk", CharField()))
               .values("key"))
        visible |= Q(target_type=model._meta.label_lower, target_id__in=ids)
    return qs.filter(visible)


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
