"""Reads of the registry, returning QuerySets with their FilterSet applied, scoped to what the reader may see.

Who reads what (the API and the admin both read through these):
- admins, reviewers and finance: every team's agents, instances and capability versions;
- a team member: its own teams' agents, instances (with their URLs) and versions in every state;
- anyone authenticated (a caller): the ACTIVE capability versions (names, descriptions, schemas: what it can
  invoke), and nothing of agents and instances (addresses are the gateway's business, not the caller's).
"""

from __future__ import annotations

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
        ids = (model.objects.filter(**{f"{path}__in": teams}).annotate(key=Cast("pk", CharField()))
               .values("key"))
        visible |= Q(target_type=model._meta.label_lower, target_id__in=ids)
    return qs.filter(visible)
