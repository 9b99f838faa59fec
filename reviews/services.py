"""People's decisions: the capability review workflow, canary releases, the manual review queue and routing
feedback.

Each transition checks the current state with compare-and-set and writes an audit row in its transaction. The
object-level rules live in ``registry.permissions`` so that the admin and the API enforce the same thing."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, Q
from django.utils import timezone

from ledger.selectors import Percentile
from reach_platform.errors import Conflict, InvalidInput, PermissionDenied
from registry.audit import audit
from registry.choices import ACTIONS, VersionState
from registry.descriptors import MIN_EXAMPLES, MIN_NEGATIVES, schema_problems
from registry.generation import announce_versions_changed, bump_generation
from registry.models import Capability, CapabilityVersion
from registry.permissions import can_read_any_task, ensure_can_edit_team, is_reviewer, is_team_member_of
from registry.services import capability_version_activate, capability_version_draft_create
from reviews.models import ReviewClaim, RoutingFeedback
from routing.choices import AttemptOutcome, ReviewReason, TaskStatus

if TYPE_CHECKING:
    from routing.models import Task

logger = logging.getLogger(__name__)


def _team_id(version: CapabilityVersion) -> int:
    return version.capability.agent.team_id


def submission_problems(version: CapabilityVersion) -> list[str]:
    problems = []
    if len(set(version.examples or [])) < MIN_EXAMPLES:
        problems.append(f"needs at least {MIN_EXAMPLES} distinct examples (has {len(set(version.examples or []))})")
    if len(version.negative_cases or []) < MIN_NEGATIVES:
        problems.append(f"needs at least {MIN_NEGATIVES} negative case")
    if version.action not in ACTIONS:
        problems.append(f"action '{version.action}' is not in the preset list")
    problems += [f"{where} {problem}" for where, problem in schema_problems(
        version.input_schema, version.output_schema, version.reject_conditions)]
    return problems


def ensure_four_eyes(version: CapabilityVersion, actor, what: str) -> None:
    """Four eyes, always: a reviewer decides on a version only when they are not in its owning team and did not
    submit it themselves (an admin with no team included)."""
    if not is_reviewer(actor):
        raise PermissionDenied(f"Only reviewers may {what} a capability version.", code="not_a_reviewer")
    if is_team_member_of(actor, _team_id(version)):
        raise PermissionDenied(f"Reviewers cannot {what} their own team's versions.", code="own_team")
    submitter = CapabilityVersion.objects.filter(pk=version.pk).values_list("submitted_by_id", flat=True).first()
    if submitter is not None and submitter == actor.pk:
        raise PermissionDenied(f"The person who submitted a version cannot {what} it.", code="own_submission")


def _move(version: CapabilityVersion, *, expected: str, to: str, **fields) -> None:
    updated = CapabilityVersion.objects.filter(pk=version.pk, state=expected).update(
        state=to, updated_at=timezone.now(), **fields)
    if not updated:
        raise Conflict(f"Version {version} is no longer {expected}.", code="state_conflict")


# --- review workflow -----------------------------------------------------------------------------------------

@transaction.atomic
def capability_version_submit(*, version: CapabilityVersion, actor) -> CapabilityVersion:
    """DRAFT -> SUBMITTED, by a member of the owning team, when the descriptor is complete."""
    ensure_can_edit_team(actor, _team_id(version), f"capability '{version.capability.name}'")
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
    ensure_four_eyes(version, actor, "approve")
    if not 0 <= confidence_weight <= 1:
        raise InvalidInput("confidence_weight must be between 0 and 1.")
    if canary_share is not None and not 0 < canary_share < 1:
        raise InvalidInput("canary_share must be between 0 and 1 (exclusive).")
    if canary_share is not None and not version.capability.versions.filter(
            state=VersionState.ACTIVE, is_canary=False).exists():
        raise InvalidInput("A canary needs an active version to compare with; approve this one without a share.",
                           code="no_stable_version")
    _move(version, expected=VersionState.SUBMITTED, to=VersionState.APPROVED, reviewed_by=actor,
          confidence_weight=confidence_weight, is_canary=canary_share is not None,
          canary_share=canary_share or 0.0)
    audit(action="version.approved", target=version, actor=actor, before={"state": VersionState.SUBMITTED},
          after={"state": VersionState.APPROVED, "confidence_weight": confidence_weight, "canary_share": canary_share})
    version.refresh_from_db()
    return capability_version_activate(version=version, actor=actor)


@transaction.atomic
def capability_version_reject(*, version: CapabilityVersion, actor, comment: str) -> CapabilityVersion:
    ensure_four_eyes(version, actor, "reject")
    if not comment or not comment.strip():
        raise InvalidInput("A rejection needs a comment.", code="comment_required")
    _move(version, expected=VersionState.SUBMITTED, to=VersionState.REJECTED, reviewed_by=actor,
          review_comment=comment.strip())
    audit(action="version.rejected", target=version, actor=actor, before={"state": VersionState.SUBMITTED},
          after={"state": VersionState.REJECTED, "comment": comment.strip()})
    version.refresh_from_db()
    return version


# --- canary releases -----------------------------------------------------------------------------------------

def _active_canary(version: CapabilityVersion) -> CapabilityVersion:
    version = CapabilityVersion.objects.select_for_update().select_related("capability__agent").get(pk=version.pk)
    if version.state != VersionState.ACTIVE or not version.is_canary:
        raise Conflict(f"{version} is not an active canary.", code="state_conflict")
    return version


@transaction.atomic
def capability_version_promote(*, version: CapabilityVersion, actor) -> CapabilityVersion:
    """A canary takes all the traffic: the previous stable version retires."""
    ensure_four_eyes(version, actor, "promote")
    version = _active_canary(version)
    for old in CapabilityVersion.objects.select_for_update().filter(
            capability=version.capability, state=VersionState.ACTIVE, is_canary=False):
        _move(old, expected=VersionState.ACTIVE, to=VersionState.RETIRED)
        audit(action="version.retired", target=old, actor=actor, before={"state": VersionState.ACTIVE},
              after={"state": VersionState.RETIRED, "replaced_by": version.version})
    CapabilityVersion.objects.filter(pk=version.pk).update(is_canary=False, canary_share=0.0,
                                                           updated_at=timezone.now())
    audit(action="version.promoted", target=version, actor=actor,
          before={"is_canary": True, "canary_share": version.canary_share}, after={"is_canary": False})
    transaction.on_commit(bump_generation)
    announce_versions_changed()
    version.refresh_from_db()
    return version


@transaction.atomic
def capability_version_rollback(*, version: CapabilityVersion, actor=None, reason: str,
                                stats: dict | None = None) -> CapabilityVersion:
    """Take a canary out of traffic: RETIRED with the ``rolled_back`` flag; the stable version keeps serving."""
    if actor is not None:  # None: the automatic rollback
        ensure_four_eyes(version, actor, "roll back")
    version = _active_canary(version)
    _move(version, expected=VersionState.ACTIVE, to=VersionState.RETIRED, rolled_back=True,
          review_comment=f"Rolled back: {reason}"[:4000])
    audit(action="version.rolled_back", target=version, actor=actor,
          actor_label="" if actor else "system:canary", before={"state": VersionState.ACTIVE, "canary": True},
          after={"state": VersionState.RETIRED, "rolled_back": True, "reason": reason, "stats": stats})
    logger.warning("canary rolled back", extra={"version": str(version), "reason": reason})
    transaction.on_commit(bump_generation)
    announce_versions_changed()
    version.refresh_from_db()
    return version


def _attempt_stats(version_id: int, since) -> dict:
    from routing.models import Attempt

    agg = Attempt.objects.filter(version_id=version_id, started_at__gte=since).aggregate(
        n=Count("id"), ok=Count("id", filter=Q(outcome__in=[AttemptOutcome.SUCCESS, AttemptOutcome.ACCEPTED])),
        p95=Percentile("latency_ms", 0.95))
    n = agg["n"]
    return {"attempts": n, "success_rate": (agg["ok"] / n) if n else None, "p95_ms": agg["p95"]}


def canary_compare(version: CapabilityVersion) -> dict:
    """The canary against its capability's stable version, over the attempts since the canary went live."""
    since = version.activated_at or version.updated_at
    stable = (CapabilityVersion.objects.filter(capability_id=version.capability_id, state=VersionState.ACTIVE,
                                               is_canary=False).first())
    return {"canary": _attempt_stats(version.pk, since),
            "stable": _attempt_stats(stable.pk, since) if stable else None,
            "stable_version": stable.version if stable else None}


def canary_verdict(stats: dict) -> str | None:
    """Why the canary should be rolled back, or None while it holds up (or the sample is too small)."""
    conf = settings.REACH
    canary, stable = stats["canary"], stats["stable"]
    if canary["attempts"] < conf["CANARY_MIN_SAMPLE"]:
        return None
    base_success = stable["success_rate"] if stable and stable["attempts"] else 1.0
    if canary["success_rate"] < base_success - conf["CANARY_SUCCESS_MARGIN"]:
        return (f"success rate {canary['success_rate']:.0%} over {canary['attempts']} attempts against "
                f"{base_success:.0%} for the stable version")
    if stable and stable["attempts"] >= conf["CANARY_MIN_SAMPLE"] and canary["p95_ms"] and stable["p95_ms"]:
        limit = max(stable["p95_ms"] * (1 + conf["CANARY_LATENCY_MARGIN"]), stable["p95_ms"] + 50)
        if canary["p95_ms"] > limit:
            return f"p95 latency {canary['p95_ms']:.0f} ms against {stable['p95_ms']:.0f} ms for the stable version"
    return None


def canary_evaluate(version_id: int) -> bool:
    """Roll an active canary back when real traffic shows it worse than the stable version. True if rolled back."""
    version = (CapabilityVersion.objects.filter(pk=version_id, state=VersionState.ACTIVE, is_canary=True)
               .select_related("capability").first())
    if version is None:
        return False
    stats = canary_compare(version)
    reason = canary_verdict(stats)
    if reason is None:
        return False
    try:
        capability_version_rollback(version=version, reason=reason, stats=stats)
    except Conflict:  # rolled back or promoted concurrently
        return False
    return True


def canaries_evaluate() -> int:
    """Periodic sweep over every active canary (beat); the gateway also triggers it after canary attempts."""
    ids = CapabilityVersion.objects.filter(state=VersionState.ACTIVE, is_canary=True).values_list("pk", flat=True)
    return sum(canary_evaluate(vid) for vid in ids)


# --- routing feedback ----------------------------------------------------------------------------------------

def task_feedback(*, task, actor, correct: bool, comment: str = "") -> RoutingFeedback:
    """A caller says whether the routing was right: stored as a labelled routing example."""
    if task.caller_id and task.caller_id != actor.pk and not can_read_any_task(actor):
        raise PermissionDenied("This task belongs to another caller.")
    capability = (task.capability_label or "").split("@")[0]
    return RoutingFeedback.objects.create(task=task, request_text=task.task_text, capability=capability,
                                          correct=correct, comment=comment[:2000], source="caller", actor=actor)


@transaction.atomic
def feedback_promote(*, capability: Capability, feedback_ids: list[int], actor) -> CapabilityVersion:
    """Turn labelled routing examples into the capability's next version, a DRAFT that goes through the normal
    review workflow: right routings become examples, wrong ones negative cases.

    Reviewers curate feedback, so a reviewer may promote into any team's capability; the draft then waits for the
    owning team to submit it (and another reviewer to approve it)."""
    if not is_reviewer(actor):
        raise PermissionDenied("Only reviewers may promote routing feedback.", code="not_a_reviewer")
    rows = list(RoutingFeedback.objects.select_for_update().filter(pk__in=feedback_ids))
    if len(rows) != len(set(feedback_ids)):
        raise InvalidInput("Some feedback ids do not exist.")
    foreign = [r.pk for r in rows if r.capability != capability.name]
    if foreign:
        raise InvalidInput(f"Feedback {foreign} is about another capability.", code="wrong_capability")
    used = [r.pk for r in rows if r.promoted_to_id]
    if used:
        raise Conflict(f"Feedback {used} was promoted already.", code="already_promoted")
    if not any(r.request_text.strip() for r in rows):
        raise InvalidInput("The selected feedback holds no request text to learn from.")
    base = (capability.versions.filter(state=VersionState.ACTIVE, is_canary=False).first()
            or capability.versions.order_by("-created_at").first())
    examples = list(base.examples or []) if base else []
    negatives = list(base.negative_cases or []) if base else []
    for r in rows:
        text = r.request_text.strip()
        target = examples if r.correct else negatives
        if text and text not in examples and text not in negatives:
            target.append(text)
    # a reviewer drafts on the owning team's behalf: the team still submits it, another reviewer approves it
    draft = capability_version_draft_create(capability=capability, actor=actor, base=base, team_check=False,
                                            examples=examples, negative_cases=negatives)
    RoutingFeedback.objects.filter(pk__in=[r.pk for r in rows]).update(promoted_to=draft)
    audit(action="feedback.promoted", target=draft, actor=actor, after={"feedback": sorted(r.pk for r in rows)})
    return draft


# --- manual review queue -------------------------------------------------------------------------------------

def _open_claim(task) -> ReviewClaim | None:
    return ReviewClaim.objects.filter(task=task, resolution="").select_related("reviewer").first()


def _claim_of(task, reviewer) -> ReviewClaim:
    claim = _open_claim(task)
    if claim is None or claim.reviewer_id != reviewer.pk:
        raise PermissionDenied("Claim the item first; another reviewer may hold it.", code="not_claimed")
    return claim


def queue_claim(*, task, reviewer) -> ReviewClaim:
    """Compare-and-set through the unique task: of two concurrent claims exactly one wins."""
    if not is_reviewer(reviewer):
        raise PermissionDenied("Only reviewers may claim review items.", code="not_a_reviewer")
    if not task.review_reason:
        raise Conflict(f"Task {task.request_id} is not in the review queue.", code="state_conflict")
    try:
        with transaction.atomic():
            claim = ReviewClaim.objects.create(task=task, reviewer=reviewer)
    except IntegrityError:
        holder = ReviewClaim.objects.select_related("reviewer").get(task=task)
        if holder.resolution:
            raise Conflict(f"Task {task.request_id} was resolved ({holder.resolution}).", code="state_conflict")
        raise Conflict(f"Already claimed by {holder.reviewer.get_username()}.", code="already_claimed")
    audit(action="review.claimed", target=task, actor=reviewer)
    return claim


def queue_release(*, task, reviewer) -> None:
    """Give an item back to the queue unresolved."""
    claim = _claim_of(task, reviewer)
    claim.delete()
    audit(action="review.released", target=task, actor=reviewer)


def _resolve_claim(claim: ReviewClaim, resolution: str) -> None:
    ReviewClaim.objects.filter(pk=claim.pk).update(resolution=resolution, resolved_at=timezone.now())


def queue_answer(*, task, reviewer, answer) -> Task:
    """Answer by hand: the caller's task completes with the answer (its callback fires) and the resolution is
    kept as routing feedback (no capability served it)."""
    from routing.services import task_resolve_by_hand

    claim = _claim_of(task, reviewer)
    if task.review_reason == ReviewReason.DEAD_LETTER and task.status not in (TaskStatus.MANUAL_REVIEW,
                                                                              TaskStatus.FAILED):
        raise Conflict("This task has its outcome; only its callback failed. Replay the callback or reject.",
                       code="state_conflict")
    with transaction.atomic():
        task = task_resolve_by_hand(task=task, status=TaskStatus.SUCCEEDED, result=answer, actor=reviewer)
        _resolve_claim(claim, ReviewClaim.Resolution.ANSWERED)
        RoutingFeedback.objects.create(task=task, request_text=task.task_text, capability="", correct=True,
                                       comment="answered by hand", source="reviewer", actor=reviewer)
        audit(action="review.answered", target=task, actor=reviewer)
    return task


def queue_redispatch(*, task, reviewer, capability: str):
    """Send the request to a capability the reviewer chose, as a normal task linked to this one; the caller's
    task ends with its outcome. The choice is kept as a labelled routing example (text -> capability)."""
    from routing.services import task_redispatch

    claim = _claim_of(task, reviewer)
    if task.review_reason == ReviewReason.DEAD_LETTER:
        raise Conflict("A dead letter has its outcome already; replay its callback instead.", code="state_conflict")
    with transaction.atomic():
        child = task_redispatch(task=task, capability=capability, actor=reviewer)
        _resolve_claim(claim, ReviewClaim.Resolution.REDISPATCHED)
        if task.task_text:
            RoutingFeedback.objects.create(task=task, request_text=task.task_text, capability=capability,
                                           correct=True, comment="re-dispatched by a reviewer", source="reviewer",
                                           actor=reviewer)
        audit(action="review.redispatched", target=task, actor=reviewer,
              after={"capability": capability, "request_id": child.request_id})
    return child


def queue_replay(*, task, reviewer) -> int:
    """Replay the dead-lettered callbacks of a task."""
    from routing.callbacks import delivery_replay
    from routing.models import CallbackDelivery

    claim = _claim_of(task, reviewer)
    dead = list(CallbackDelivery.objects.filter(task=task, status=CallbackDelivery.Status.DEAD))
    if not dead:
        raise Conflict("This task has no dead-lettered callback.", code="state_conflict")
    with transaction.atomic():
        for delivery in dead:
            delivery_replay(delivery, actor=reviewer)
        _resolve_claim(claim, ReviewClaim.Resolution.REPLAYED)
        audit(action="review.replayed", target=task, actor=reviewer, after={"deliveries": [d.pk for d in dead]})
    return len(dead)


def queue_reject(*, task, reviewer, reason: str) -> Task:
    """Reject an item: a task still waiting fails with the reason (its callback fires); a failed task or a dead
    letter is dismissed as it is."""
    from routing.services import task_resolve_by_hand

    if not reason.strip():
        raise InvalidInput("A rejection needs a reason.", code="comment_required")
    claim = _claim_of(task, reviewer)
    with transaction.atomic():
        if task.status == TaskStatus.MANUAL_REVIEW:
            task = task_resolve_by_hand(task=task, status=TaskStatus.FAILED, actor=reviewer,
                                        error={"code": "rejected_by_review", "message": reason.strip()})
        _resolve_claim(claim, ReviewClaim.Resolution.REJECTED)
        RoutingFeedback.objects.create(task=task, request_text=task.task_text, capability="", correct=False,
                                       comment=reason.strip()[:2000], source="reviewer", actor=reviewer)
        audit(action="review.rejected", target=task, actor=reviewer, after={"reason": reason.strip()})
    return task


def queue_reopen(task_id: int) -> None:
    """A task entered the queue again (say, its callback died after a reviewer had answered it): a resolved claim
    is cleared so the item waits again; the old claim stays in the audit trail."""
    ReviewClaim.objects.filter(task_id=task_id).exclude(resolution="").delete()
