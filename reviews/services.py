"""People's decisions: the capability review workflow and caller feedback on routing.

Each transition checks the current state with compare-and-set and writes an audit row in its transaction."""

from __future__ import annotations

from django.db import transaction
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from reach_platform.errors import Conflict, InvalidInput, PermissionDenied
from registry.audit import audit
from registry.choices import ACTIONS, VersionState
from registry.descriptors import MIN_EXAMPLES, MIN_NEGATIVES
from registry.models import CapabilityVersion
from registry.services import capability_version_activate
from reviews.models import ReviewClaim, RoutingFeedback

REVIEWER_GROUP = "reviewer"


def is_team_member(user, version: CapabilityVersion) -> bool:
    return version.capability.agent.team.members.filter(pk=user.pk).exists()


def is_reviewer(user) -> bool:
    return user.is_superuser or user.groups.filter(name=REVIEWER_GROUP).exists()


def submission_problems(version: CapabilityVersion) -> list[str]:
    problems = []
    if len(set(version.examples or [])) < MIN_EXAMPLES:
        problems.append(f"needs at least {MIN_EXAMPLES} distinct examples (has {len(set(version.examples or []))})")
    if len(version.negative_cases or []) < MIN_NEGATIVES:
        problems.append(f"needs at least {MIN_NEGATIVES} negative case")
    if version.action not in ACTIONS:
        problems.append(f"action '{version.action}' is not in the preset list")
    for name in ("input_schema", "output_schema"):
        try:
            Draft202012Validator.check_schema(getattr(version, name) or {})
        except SchemaError as exc:
            problems.append(f"{name} is not a valid JSON Schema: {exc.message}")
    return problems


def _move(version: CapabilityVersion, *, expected: str, to: str, **fields) -> None:
    updated = CapabilityVersion.objects.filter(pk=version.pk, state=expected).update(state=to, **fields)
    if not updated:
        raise Conflict(f"Version {version} is no longer {expected}.", code="state_conflict")


@transaction.atomic
def capability_version_submit(*, version: CapabilityVersion, actor) -> CapabilityVersion:
    """DRAFT -> SUBMITTED, by a member of the owning team, when the descriptor is complete."""
    if not (actor.is_superuser or is_team_member(actor, version)):
        raise PermissionDenied("Only members of the owning team may submit this version.", code="not_your_team")
    if version.state != VersionState.DRAFT:
        raise Conflict(f"Only a draft can be submitted; this version is {version.state}.", code="state_conflict")
    problems = submission_problems(version)
    if problems:
        raise InvalidInput("The version cannot be submitted.", details=problems, code="incomplete_descriptor")
    _move(version, expected=VersionState.DRAFT, to=VersionState.SUBMITTED, submitted_by=actor)
    audit(action="version.submitted", target=version, actor=actor, before={"state": VersionState.DRAFT},
          after={"state": VersionState.SUBMITTED})
    version.refresh_from_db()
    return version


@transaction.atomic
def capability_version_approve(*, version: CapabilityVersion, actor, confidence_weight: float,
                               canary_share: float | None = None) -> CapabilityVersion:
    """SUBMITTED -> APPROVED -> ACTIVE (the previous ACTIVE version retires, unless this one is a canary)."""
    if not is_reviewer(actor):
        raise PermissionDenied("Only reviewers may approve.", code="not_a_reviewer")
    if is_team_member(actor, version):
        raise PermissionDenied("Reviewers cannot approve their own team's submissions.", code="own_team")
    if not 0 <= confidence_weight <= 1:
        raise InvalidInput("confidence_weight must be between 0 and 1.")
    if canary_share is not None and not 0 < canary_share < 1:
        raise InvalidInput("canary_share must be between 0 and 1 (exclusive).")
    _move(version, expected=VersionState.SUBMITTED, to=VersionState.APPROVED, reviewed_by=actor,
          confidence_weight=confidence_weight, is_canary=canary_share is not None,
          canary_share=canary_share or 0.0)
    audit(action="version.approved", target=version, actor=actor, before={"state": VersionState.SUBMITTED},
          after={"state": VersionState.APPROVED, "confidence_weight": confidence_weight, "canary_share": canary_share})
    version.refresh_from_db()
    return capability_version_activate(version=version, actor=actor)


@transaction.atomic
def capability_version_reject(*, version: CapabilityVersion, actor, comment: str) -> CapabilityVersion:
    if not is_reviewer(actor):
        raise PermissionDenied("Only reviewers may reject.", code="not_a_reviewer")
    if not comment or not comment.strip():
        raise InvalidInput("A rejection needs a comment.", code="comment_required")
    _move(version, expected=VersionState.SUBMITTED, to=VersionState.REJECTED, reviewed_by=actor,
          review_comment=comment.strip())
    audit(action="version.rejected", target=version, actor=actor, before={"state": VersionState.SUBMITTED},
          after={"state": VersionState.REJECTED, "comment": comment.strip()})
    version.refresh_from_db()
    return version


def task_feedback(*, task, actor, correct: bool, comment: str = "") -> RoutingFeedback:
    """A caller says whether the routing was right: stored as a labelled routing example."""
    if task.caller_id and task.caller_id != actor.pk and not actor.is_staff:
        raise PermissionDenied("This task belongs to another caller.")
    capability = (task.capability_label or "").split("@")[0]
    return RoutingFeedback.objects.create(task=task, request_text=task.task_text, capability=capability,
                                          correct=correct, comment=comment[:2000], source="caller", actor=actor)


def _claim_of(task, reviewer) -> ReviewClaim:
    claim = ReviewClaim.objects.filter(task=task, resolution="").first()
    if claim is None or claim.reviewer_id != reviewer.pk:
        raise PermissionDenied("Claim the item first; another reviewer may hold it.", code="not_claimed")
    return claim


def queue_claim(*, task, reviewer) -> ReviewClaim:
    """Compare-and-set through the unique task: of two concurrent claims exactly one wins."""
    from django.db import IntegrityError

    if not is_reviewer(reviewer):
        raise PermissionDenied("Only reviewers may claim review items.", code="not_a_reviewer")
    if task.status != "manual_review":
        raise Conflict(f"Task {task.request_id} is not waiting for review.", code="state_conflict")
    try:
        with transaction.atomic():
            claim = ReviewClaim.objects.create(task=task, reviewer=reviewer)
    except IntegrityError:
        holder = ReviewClaim.objects.select_related("reviewer").get(task=task)
        raise Conflict(f"Already claimed by {holder.reviewer.get_username()}.", code="already_claimed")
    audit(action="review.claimed", target=task, actor=reviewer)
    return claim


def queue_answer(*, task, reviewer, answer) -> object:
    """Answer by hand: the caller's task completes with the answer (its callback fires) and the resolution is
    kept as routing feedback (no capability served it)."""
    from django.utils import timezone

    from routing.services import task_resolve_by_hand

    claim = _claim_of(task, reviewer)
    with transaction.atomic():
        task = task_resolve_by_hand(task=task, status="succeeded", result=answer, actor=reviewer)
        ReviewClaim.objects.filter(pk=claim.pk).update(resolution=ReviewClaim.Resolution.ANSWERED,
                                                       resolved_at=timezone.now())
        RoutingFeedback.objects.create(task=task, request_text=task.task_text, capability="", correct=True,
                                       comment="answered by hand", source="reviewer", actor=reviewer)
        audit(action="review.answered", target=task, actor=reviewer)
    return task


def queue_reject(*, task, reviewer, reason: str) -> object:
    from django.utils import timezone

    from routing.services import task_resolve_by_hand

    if not reason.strip():
        raise InvalidInput("A rejection needs a reason.", code="comment_required")
    claim = _claim_of(task, reviewer)
    with transaction.atomic():
        task = task_resolve_by_hand(task=task, status="failed", error={"code": "rejected_by_review",
                                                                       "message": reason.strip()}, actor=reviewer)
        ReviewClaim.objects.filter(pk=claim.pk).update(resolution=ReviewClaim.Resolution.REJECTED,
                                                       resolved_at=timezone.now())
        audit(action="review.rejected", target=task, actor=reviewer, after={"reason": reason.strip()})
    return task
