"""Reads for people's decisions: the manual review queue and version diffs."""

from __future__ import annotations

import difflib
import json
from datetime import timedelta

from django.db.models import Exists, OuterRef, QuerySet
from django.db.models.fields.json import KT
from django.utils import timezone

from reach_platform.errors import PermissionDenied
from registry.choices import VersionState
from registry.models import CapabilityVersion
from registry.permissions import is_reviewer
from reviews.models import ReviewClaim, ReviewItem

QUEUE_STATUSES = ("open", "waiting", "claimed", "resolved", "all")
AGES = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7)}


def queue_items(*, reader=None, status: str = "open", reason: str | None = None,
                capability_guess: str | None = None, older_than: str | None = None,
                newer_than: str | None = None) -> QuerySet[ReviewItem]:
    """Tasks that need (or needed) a person, oldest first, with the top candidate as the capability guess.
    ``reader``: the person asking, who must be a reviewer (the items hold callers' texts); None for the system.

    status: open (waiting or claimed, the default), waiting, claimed, resolved, all."""
    if reader is not None and not is_reviewer(reader):
        raise PermissionDenied("Only reviewers may read the review queue.", code="not_a_reviewer")
    open_claim = ReviewClaim.objects.filter(task_id=OuterRef("pk"), resolution="")
    resolved_claim = ReviewClaim.objects.filter(task_id=OuterRef("pk")).exclude(resolution="")
    qs = (ReviewItem.objects.exclude(review_reason="")
          .annotate(claimed=Exists(open_claim), resolved=Exists(resolved_claim),
                    capability_guess=KT("decision__candidates__0__capability"))
          .select_related("review_claim__reviewer").order_by("created_at"))
    if status == "open":
        qs = qs.filter(resolved=False)
    elif status == "waiting":
        qs = qs.filter(resolved=False, claimed=False)
    elif status == "claimed":
        qs = qs.filter(claimed=True)
    elif status == "resolved":
        qs = qs.filter(resolved=True)
    if reason:
        qs = qs.filter(review_reason=reason)
    if capability_guess:
        qs = qs.filter(capability_guess=capability_guess)
    now = timezone.now()
    if older_than in AGES:
        qs = qs.filter(created_at__lt=now - AGES[older_than])
    if newer_than in AGES:
        qs = qs.filter(created_at__gte=now - AGES[newer_than])
    return qs


def queue_waiting_count() -> int:
    return queue_items(status="waiting").count()


# --- version diff ----------------------------------------------------------------------------------------------

LIST_FIELDS = ("examples", "negative_cases", "keywords", "tags", "domains", "languages")
SCHEMA_FIELDS = ("input_schema", "output_schema", "reject_conditions")
PROFILE_FIELDS = ("description", "action", "idempotent", "timeout_ms", "max_retries", "avg_latency_ms",
                  "p95_latency_ms", "avg_tokens_per_call", "cost_per_call", "price_per_1k_input_tokens",
                  "price_per_1k_output_tokens", "model_name", "confidence_weight")


def version_base(version: CapabilityVersion) -> CapabilityVersion | None:
    """What a version is compared with: the capability's stable ACTIVE version (else the newest older one)."""
    others = CapabilityVersion.objects.filter(capability_id=version.capability_id).exclude(pk=version.pk)
    return (others.filter(state=VersionState.ACTIVE, is_canary=False).first()
            or others.filter(created_at__lt=version.created_at).order_by("-created_at").first())


def version_diff(version: CapabilityVersion, base: CapabilityVersion | None) -> dict:
    """Per field: added/removed items for lists, a unified diff for schemas, before/after for the profile."""
    lists, schemas, profile = [], [], []
    for name in LIST_FIELDS:
        new = list(getattr(version, name) or [])
        old = list(getattr(base, name) or []) if base else []
        added = [x for x in new if x not in old]
        removed = [x for x in old if x not in new]
        if added or removed:
            lists.append({"field": name, "added": added, "removed": removed, "kept": len(new) - len(added)})
    for name in SCHEMA_FIELDS:
        new = json.dumps(getattr(version, name), indent=2, sort_keys=True, ensure_ascii=False).splitlines()
        old = (json.dumps(getattr(base, name), indent=2, sort_keys=True, ensure_ascii=False).splitlines()
               if base else [])
        if new != old:
            lines = list(difflib.unified_diff(old, new, fromfile=f"{name} ({base.version if base else 'none'})",
                                              tofile=f"{name} ({version.version})", lineterm=""))
            schemas.append({"field": name, "lines": lines})
    for name in PROFILE_FIELDS:
        after = getattr(version, name)
        before = getattr(base, name) if base else None
        if after != before:
            profile.append({"field": name, "before": before, "after": after})
    return {"base": base, "lists": lists, "schemas": schemas, "profile": profile,
            "changed": bool(lists or schemas or profile)}


def queue_summary() -> dict:
    """How many items wait for a reviewer, and since when the oldest waits (for the dashboard)."""
    waiting = queue_items(status="waiting")
    return {"waiting": waiting.count(), "oldest": waiting.values_list("created_at", flat=True).first()}
