"""Governance in the admin: the review page of a version, the manual review queue, routing feedback, and the agent
detail page (instances with liveness and breaker state, recent tasks, success and latency, versions with their
review history). Registered here, the leftmost app, because these pages read registry, routing and reviews."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q
from django.shortcuts import redirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from ledger.selectors import Percentile
from reach_platform.errors import ApplicationError
from registry.admin import AgentAdmin, CapabilityVersionAdmin, error_message, liveness_badge
from registry.models import Agent, AuditLog, Capability, CapabilityVersion
from reviews import admin_views, selectors, services
from reviews.models import ReviewItem, RoutingFeedback

admin.site.unregister(CapabilityVersion)
admin.site.unregister(Agent)


@admin.register(CapabilityVersion)
class GovernedCapabilityVersionAdmin(CapabilityVersionAdmin):
    change_form_template = "admin/registry/capabilityversion/change_form.html"
    list_display = [*CapabilityVersionAdmin.list_display, "review_link"]

    def get_urls(self):
        return [path("<int:pk>/review/", self.admin_site.admin_view(self.review_view),
                     name="registry_capabilityversion_review"), *super().get_urls()]

    def review_view(self, request, pk: int):
        return admin_views.version_review(self, request, pk)

    @admin.display(description="Review")
    def review_link(self, obj):
        return format_html('<a href="{}">diff &amp; workflow</a>',
                           reverse("admin:registry_capabilityversion_review", args=[obj.pk]))

    def response_add(self, request, obj, post_url_continue=None):
        self.message_user(request, f"Draft {obj} saved. Submit it for review when it is complete.")
        return redirect("admin:registry_capabilityversion_review", obj.pk)

    def response_change(self, request, obj):
        if "_continue" in request.POST:
            return super().response_change(request, obj)
        self.message_user(request, f"Draft {obj} saved. Submit it for review when it is complete.")
        return redirect("admin:registry_capabilityversion_review", obj.pk)


# --- manual review queue -------------------------------------------------------------------------------------

class QueueStatusFilter(admin.SimpleListFilter):
    title = "queue status"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        return [("open", "Open (waiting or claimed)"), ("waiting", "Waiting"), ("claimed", "Claimed"),
                ("resolved", "Resolved"), ("all", "All")]

    def choices(self, changelist):  # "open" is the default, so there is no separate "All" link
        current = self.value() or "open"
        for value, label in self.lookup_choices:
            yield {"selected": current == value, "query_string": changelist.get_query_string({self.parameter_name:
                                                                                              value}),
                   "display": label}

    def queryset(self, request, queryset):
        return queryset  # applied in get_queryset through the selector


class AgeFilter(admin.SimpleListFilter):
    title = "age"
    parameter_name = "age"

    def lookups(self, request, model_admin):
        return [("new", "Under 1 hour"), ("1h", "Older than 1 hour"), ("24h", "Older than 24 hours"),
                ("7d", "Older than 7 days")]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "new":
            return queryset.filter(created_at__gte=timezone.now() - timedelta(hours=1))
        if value in selectors.AGES:
            return queryset.filter(created_at__lt=timezone.now() - selectors.AGES[value])
        return queryset


class GuessFilter(admin.SimpleListFilter):
    title = "capability guess"
    parameter_name = "guess"

    def lookups(self, request, model_admin):
        guesses = (selectors.queue_items(status="all").exclude(capability_guess__isnull=True)
                   .values_list("capability_guess", flat=True).distinct())
        return [(g, g) for g in sorted(set(guesses))[:50]]

    def queryset(self, request, queryset):
        return queryset.filter(capability_guess=self.value()) if self.value() else queryset


@admin.register(ReviewItem)
class ReviewItemAdmin(admin.ModelAdmin):
    """Oldest first; open items by default. A row opens its triage page (claim, answer, re-dispatch, reject)."""

    list_display = ["request_id", "reason_col", "status", "capability_guess_col", "score", "age", "claim_col"]
    list_filter = [QueueStatusFilter, "review_reason", AgeFilter, GuessFilter]
    search_fields = ["request_id", "task_text"]
    list_per_page = 50

    def get_queryset(self, request):
        return selectors.queue_items(reader=request.user, status=request.GET.get("queue") or "open")

    def get_urls(self):
        return [path("<int:pk>/change/", self.admin_site.admin_view(self.triage_view),
                     name="reviews_reviewitem_change"), *super().get_urls()]

    def triage_view(self, request, pk: int):
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        return admin_views.queue_item(self, request, pk)

    @admin.display(description="Why", ordering="review_reason")
    def reason_col(self, obj):
        return obj.get_review_reason_display()

    @admin.display(description="Capability guess")
    def capability_guess_col(self, obj):
        return obj.capability_guess or "—"

    @admin.display(description="Score")
    def score(self, obj):
        return (obj.decision or {}).get("score", "—")

    @admin.display(description="Age", ordering="created_at")
    def age(self, obj):
        return f"{_short_age(obj.created_at)} ago"

    @admin.display(description="Claim")
    def claim_col(self, obj):
        if not (obj.claimed or obj.resolved):
            return "waiting"
        claim = obj.review_claim
        return f"{claim.reviewer}: {claim.get_resolution_display() if claim.resolution else 'holds it'}"

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def _short_age(when) -> str:
    seconds = int((timezone.now() - when).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


# --- routing feedback ----------------------------------------------------------------------------------------

@admin.register(RoutingFeedback)
class RoutingFeedbackAdmin(admin.ModelAdmin):
    """Labelled routing examples from real traffic. Select some of one capability and promote them into its next
    version: a draft that goes through the normal review workflow."""

    list_display = ["created_at", "request_text", "capability", "correct", "source", "actor", "promoted_to"]
    list_filter = ["correct", "source", ("promoted_to", admin.EmptyFieldListFilter), "capability"]
    search_fields = ["request_text", "capability", "task__request_id"]
    readonly_fields = ["task", "request_text", "capability", "correct", "comment", "source", "actor", "created_at",
                       "promoted_to"]
    actions = ["promote"]

    @admin.action(description="Promote into the capability's next version (a draft for review)")
    def promote(self, request, queryset):
        by_capability: dict[str, list[int]] = {}
        for row in queryset:
            by_capability.setdefault(row.capability, []).append(row.pk)
        for name, ids in by_capability.items():
            capability = Capability.objects.filter(name=name).first()
            if capability is None:
                self.message_user(request, f"{len(ids)} item(s) name no capability ('{name or 'none'}'); relabel "
                                           "them first.", messages.WARNING)
                continue
            try:
                draft = services.feedback_promote(capability=capability, feedback_ids=ids, actor=request.user)
            except ApplicationError as exc:
                self.message_user(request, error_message(exc), messages.ERROR)
                continue
            self.message_user(request, format_html(
                'Draft <a href="{}">{}</a> holds {} new example(s); its team submits it for review.',
                reverse("admin:registry_capabilityversion_review", args=[draft.pk]), draft, len(ids)),
                messages.SUCCESS)

    def has_add_permission(self, request):
        return False


# --- agent detail page ---------------------------------------------------------------------------------------

@admin.register(Agent)
class AgentDetailAdmin(AgentAdmin):
    """The agent page: instances with liveness and breaker state, success rate and latency, recent tasks, and
    its capability versions with their review history."""

    def get_fields(self, request, obj=None):
        fields = super().get_fields(request, obj)
        return fields if obj is None else [*fields, "instances_panel", "traffic_panel", "recent_tasks",
                                           "versions_panel"]

    def get_readonly_fields(self, request, obj=None):
        extra = ["instances_panel", "traffic_panel", "recent_tasks", "versions_panel"] if obj else []
        return [*super().get_readonly_fields(request, obj), *extra]

    @admin.display(description="Instances")
    def instances_panel(self, obj):
        from routing import breaker

        rows = [(i.instance_id, i.url, liveness_badge(i.liveness), breaker.state(i.pk).upper(), i.in_flight,
                 i.max_concurrency, ", ".join(i.versions) or "all",
                 i.last_heartbeat_at.strftime("%Y-%m-%d %H:%M:%S") if i.last_heartbeat_at else "—")
                for i in obj.instances.filter(deregistered_at__isnull=True)]
        if not rows:
            return "no live registration"
        return format_html(
            "<table id='agent-instances'><tr><th>instance</th><th>url</th><th>liveness</th><th>breaker</th>"
            "<th>in flight</th><th>max</th><th>versions</th><th>last heartbeat</th></tr>{}</table>",
            format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                                 "<td>{}</td></tr>", rows))

    @admin.display(description="Traffic (last 24 h)")
    def traffic_panel(self, obj):
        from routing.choices import AttemptOutcome
        from routing.models import Attempt

        since = timezone.now() - timedelta(hours=24)
        agg = Attempt.objects.filter(instance__agent=obj, started_at__gte=since).aggregate(
            n=Count("id"), ok=Count("id", filter=Q(outcome__in=[AttemptOutcome.SUCCESS, AttemptOutcome.ACCEPTED])),
            p50=Percentile("latency_ms", 0.5), p95=Percentile("latency_ms", 0.95))
        if not agg["n"]:
            return "no attempts in the last 24 hours"
        return format_html("{} attempts, success rate <b>{}</b>, latency p50 {} ms / p95 {} ms",
                           agg["n"], f"{agg['ok'] / agg['n']:.1%}", f"{agg['p50']:.0f}", f"{agg['p95']:.0f}")

    @admin.display(description="Recent tasks")
    def recent_tasks(self, obj):
        from routing.models import Task

        rows = [(reverse("admin:routing_task_change", args=[t.pk]), t.request_id, t.status, t.capability_label,
                 t.created_at.strftime("%Y-%m-%d %H:%M:%S"))
                for t in Task.objects.filter(agent_endpoint=obj.endpoint_id).order_by("-created_at")[:15]]
        if not rows:
            return "none yet"
        return format_html("<table id='agent-tasks'><tr><th>request</th><th>status</th><th>capability</th>"
                           "<th>at</th></tr>{}</table>",
                           format_html_join("", "<tr><td><a href='{}'>{}</a></td><td>{}</td><td>{}</td><td>{}</td>"
                                                "</tr>", rows))

    @admin.display(description="Capability versions and their review history")
    def versions_panel(self, obj):
        versions = list(CapabilityVersion.objects.filter(capability__agent=obj)
                        .select_related("capability").order_by("capability__name", "-created_at"))
        history = {}
        for row in AuditLog.objects.filter(target_type="registry.capabilityversion",
                                           target_id__in=[str(v.pk) for v in versions]).order_by("created_at"):
            history.setdefault(row.target_id, []).append(f"{row.created_at:%Y-%m-%d %H:%M} {row.action} "
                                                         f"({row.actor_label})")
        rows = [(reverse("admin:registry_capabilityversion_review", args=[v.pk]), str(v), v.state.upper(),
                 f"canary {v.canary_share:.0%}" if v.is_canary else ("rolled back" if v.rolled_back else ""),
                 "; ".join(history.get(str(v.pk), [])) or "—") for v in versions]
        return format_html("<table id='agent-versions'><tr><th>version</th><th>state</th><th></th>"
                           "<th>review history</th></tr>{}</table>",
                           format_html_join("", "<tr><td><a href='{}'>{}</a></td><td>{}</td><td>{}</td><td>{}</td>"
                                                "</tr>", rows))
