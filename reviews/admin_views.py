"""Admin pages for people's decisions: the version review page (diff + workflow buttons) and the triage page of a
manual review item. Both only call services, so they enforce exactly what the API enforces."""

from __future__ import annotations

import json

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import reverse

from reach_platform.errors import ApplicationError
from registry.admin import error_message
from registry.choices import VersionState
from registry.models import AuditLog, Capability, CapabilityVersion
from registry.permissions import can_edit_team, is_reviewer, is_team_member_of
from registry.services import capability_version_draft_create
from reviews import selectors, services
from reviews.models import ReviewClaim


def _percent(value: str) -> float | None:
    value = (value or "").strip().rstrip("%")
    if not value:
        return None
    return float(value) / 100


def version_review(model_admin, request, pk: int):
    version = get_object_or_404(CapabilityVersion.objects.select_related("capability__agent__team"), pk=pk)
    if not model_admin.has_view_permission(request, version) or not model_admin.get_queryset(request).filter(
            pk=pk).exists():
        messages.error(request, "You may not see this version.")
        return redirect("admin:registry_capabilityversion_changelist")
    here = reverse("admin:registry_capabilityversion_review", args=[pk])
    user = request.user
    team_id = version.capability.agent.team_id
    if request.method == "POST":
        action = request.POST.get("action", "")
        try:
            if action == "submit":
                services.capability_version_submit(version=version, actor=user)
                messages.success(request, f"{version} submitted for review.")
            elif action == "approve":
                share = _percent(request.POST.get("canary_percent", ""))
                services.capability_version_approve(version=version, actor=user,
                                                    confidence_weight=float(request.POST.get("confidence_weight")),
                                                    canary_share=share)
                messages.success(request, f"{version} approved and active"
                                          + (f" as a canary on {share:.0%} of the traffic." if share else "."))
            elif action == "reject":
                services.capability_version_reject(version=version, actor=user,
                                                   comment=request.POST.get("comment", ""))
                messages.success(request, f"{version} rejected.")
            elif action == "promote":
                services.capability_version_promote(version=version, actor=user)
                messages.success(request, f"{version} promoted: it now takes all the traffic.")
            elif action == "rollback":
                services.capability_version_rollback(version=version, actor=user,
                                                     reason=request.POST.get("reason") or "rolled back by hand")
                messages.success(request, f"{version} rolled back.")
            elif action == "new_draft":
                draft = capability_version_draft_create(capability=version.capability, actor=user, base=version)
                messages.success(request, f"Draft {draft} created from {version.version}; edit it, then submit.")
                return redirect("admin:registry_capabilityversion_change", draft.pk)
            else:
                messages.error(request, f"Unknown action '{action}'.")
        except (TypeError, ValueError):
            messages.error(request, "Confidence weight and canary share must be numbers.")
        except ApplicationError as exc:
            messages.error(request, error_message(exc))
        return redirect(here)
    version.refresh_from_db()
    base = selectors.version_base(version)
    editable = can_edit_team(user, team_id)
    reviewer = is_reviewer(user) and not is_team_member_of(user, team_id)
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": f"Review {version}",
        "version": version,
        "diff": selectors.version_diff(version, base),
        "problems": services.submission_problems(version) if version.state == VersionState.DRAFT else [],
        "can_submit": editable and version.state == VersionState.DRAFT,
        "can_edit": editable and version.state in (VersionState.DRAFT, VersionState.REJECTED),
        "can_review": reviewer and version.state == VersionState.SUBMITTED,
        "own_team_submission": is_team_member_of(user, team_id) and version.state == VersionState.SUBMITTED,
        "can_canary": is_reviewer(user) and version.state == VersionState.ACTIVE and version.is_canary,
        "can_draft": editable and version.state != VersionState.DRAFT,
        "canary": services.canary_compare(version) if version.is_canary else None,
        "history": AuditLog.objects.filter(target_type="registry.capabilityversion", target_id=str(version.pk))[:50],
    }
    return TemplateResponse(request, "admin/registry/capabilityversion/review.html", context)


def queue_item(model_admin, request, pk: int):
    item = get_object_or_404(selectors.queue_items(reader=request.user, status="all"), pk=pk)
    here = reverse("admin:reviews_reviewitem_change", args=[pk])
    user = request.user
    if request.method == "POST":
        action = request.POST.get("action", "")
        try:
            if action == "claim":
                services.queue_claim(task=item, reviewer=user)
                messages.success(request, f"You hold {item.request_id}.")
            elif action == "release":
                services.queue_release(task=item, reviewer=user)
                messages.success(request, f"{item.request_id} is back in the queue.")
            elif action == "answer":
                raw = request.POST.get("answer", "")
                try:
                    answer = json.loads(raw)
                except ValueError:
                    answer = {"answer": raw}
                services.queue_answer(task=item, reviewer=user, answer=answer)
                messages.success(request, f"{item.request_id} answered; the caller's task is complete.")
            elif action == "redispatch":
                child = services.queue_redispatch(task=item, reviewer=user,
                                                  capability=request.POST.get("capability", ""))
                messages.success(request, f"{item.request_id} re-dispatched as {child.request_id}.")
            elif action == "replay":
                n = services.queue_replay(task=item, reviewer=user)
                messages.success(request, f"{n} callback(s) replayed.")
            elif action == "reject":
                services.queue_reject(task=item, reviewer=user, reason=request.POST.get("reason", ""))
                messages.success(request, f"{item.request_id} rejected.")
            else:
                messages.error(request, f"Unknown action '{action}'.")
        except ApplicationError as exc:
            messages.error(request, error_message(exc))
        return redirect(here)
    claim = ReviewClaim.objects.filter(task=item).select_related("reviewer").first()
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": f"Review item {item.request_id}",
        "item": item,
        "claim": claim,
        "mine": claim is not None and not claim.resolution and claim.reviewer_id == user.pk,
        "open": claim is None,
        "candidates": (item.decision or {}).get("candidates", []),
        "payload": json.dumps(item.payload, indent=2, ensure_ascii=False),
        "capabilities": list(Capability.objects.filter(versions__state=VersionState.ACTIVE).distinct()
                             .values_list("name", "agent__endpoint_id").order_by("name")),
        "task_url": reverse("admin:routing_task_change", args=[item.pk]),
        "children": list(type(item).objects.filter(parent_request_id=item.key)
                         .values("request_id", "status", "capability_requested")),
    }
    return TemplateResponse(request, "admin/reviews/reviewitem/triage.html", context)
