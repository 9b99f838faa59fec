"""Object-level rules, shared by services, the API and the admin so that every door enforces the same thing.

Roles are Django groups (made by a data migration and kept in step by ``reviews.roles``):
- agent team member: edits its own team's agents and capability versions, nothing else;
- reviewer: approves and rejects capability versions, triages the manual review queue;
- finance: reads the ledger;
- admin (or a superuser): everything.
"""

from __future__ import annotations

from reach_platform.errors import PermissionDenied

ADMIN_GROUP = "admin"
REVIEWER_GROUP = "reviewer"
TEAM_MEMBER_GROUP = "agent team member"
FINANCE_GROUP = "finance"


def _groups(user) -> set[str]:
    cache = getattr(user, "_reach_groups", None)
    if cache is None:
        cache = set(user.groups.values_list("name", flat=True)) if user.is_authenticated else set()
        user._reach_groups = cache
    return cache


def is_admin(user) -> bool:
    return bool(user.is_authenticated and (user.is_superuser or ADMIN_GROUP in _groups(user)))


def is_reviewer(user) -> bool:
    return is_admin(user) or REVIEWER_GROUP in _groups(user)


def team_ids(user) -> set[int]:
    if not user.is_authenticated:
        return set()
    cache = getattr(user, "_reach_team_ids", None)
    if cache is None:
        cache = set(user.reach_teams.values_list("pk", flat=True))
        user._reach_team_ids = cache
    return cache


def sees_all_teams(user) -> bool:
    """Admins, reviewers and finance read every team's registry; team members only their own."""
    return is_admin(user) or bool(_groups(user) & {REVIEWER_GROUP, FINANCE_GROUP})


def can_read_any_task(user) -> bool:
    """Reviewers (who triage the queue) and admins read, and comment on, any caller's task; a caller its own."""
    return is_reviewer(user)


def can_read_ledger(user) -> bool:
    return is_admin(user) or FINANCE_GROUP in _groups(user)


def can_read_metrics(user) -> bool:
    return is_admin(user)


def can_edit_team(user, team_id: int) -> bool:
    return is_admin(user) or team_id in team_ids(user)


def ensure_can_edit_team(user, team_id: int, what: str) -> None:
    if not can_edit_team(user, team_id):
        raise PermissionDenied(f"Only members of the owning team may change {what}.", code="not_your_team")


def is_team_member_of(user, team_id: int) -> bool:
    return team_id in team_ids(user)
