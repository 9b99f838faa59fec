from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.utils.html import format_html, format_html_join

from reach_platform.jsonsafe import clean_form_json
from registry.admin_audit import AuditedAdmin
from routing.callbacks import delivery_replay
from routing.models import (
    A2APushConfig,
    AgentSession,
    Attempt,
    CallbackDelivery,
    CallerSecret,
    RoutingCalibration,
    Schedule,
    Task,
    TaskEvent,
)
from routing.schedules import schedule_delete, schedule_save


class EventInline(admin.TabularInline):
    model = TaskEvent
    extra = 0
    can_delete = False
    fields = ["at", "from_status", "to_status", "detail"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


class DeliveryInline(admin.TabularInline):
    model = CallbackDelivery
    extra = 0
    can_delete = False
    fields = ["url", "status", "attempts", "last_error", "created_at", "delivered_at", "dead_at"]
    readonly_fields = fields
    verbose_name_plural = "callbacks"

    def has_add_permission(self, request, obj=None):
        return False


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    fields = ["number", "version", "instance", "started_at", "latency_ms", "timeout_ms", "outcome", "status_code",
              "is_retry", "is_fallback", "error"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    """The task timeline: decision with its score breakdown ("why this agent, why not the next"), every
    transition and every attempt, from one request_id."""

    list_display = ["request_id", "status", "fallback", "agent_endpoint", "capability_label", "decision_kind",
                    "score", "attempts_count", "created_at"]
    list_filter = ["status", "fallback", "mode"]
    search_fields = ["request_id", "key", "trace_id", "agent_endpoint", "capability_label", "task_text"]
    date_hierarchy = "created_at"
    readonly_fields = ["request_id", "key", "status", "fallback", "mode", "caller", "task_text", "capability_requested",
                       "payload", "why", "cost", "agent_endpoint", "capability_label", "result", "error", "attempts_count",
                       "retry_budget", "depth", "call_path", "trace_id", "parent_request_id", "callback_url",
                       "created_at", "updated_at"]
    exclude = ["decision", "version", "instance", "text_hash", "user_key", "top_k", "deadline_at"]
    inlines = [EventInline, AttemptInline, DeliveryInline]

    @admin.display(description="Decision")
    def decision_kind(self, obj):
        return obj.decision.get("decision", "")

    @admin.display(description="Score")
    def score(self, obj):
        return obj.decision.get("score", "")

    @admin.display(description="Cost")
    def cost(self, obj):
        from ledger.models import CostEntry

        entries = list(CostEntry.objects.filter(request_id=obj.key).order_by("attempt_number"))
        if not entries:
            return "—"
        rows = [(e.attempt_number, e.agent_endpoint, e.input_tokens, e.output_tokens,
                 " (estimated)" if e.tokens_estimated else "", e.cost) for e in entries]
        total = sum(e.cost for e in entries)
        return format_html("{}<p>total {}</p>", format_html_join(
            "", "<div>#{} {}: {} in / {} out tokens{} = {}</div>", rows), total)

    @admin.display(description="Why this agent")
    def why(self, obj):
        decision = obj.decision or {}
        rows = [(c["capability"], c["agent"], c["score"], ", ".join(f"{k} {v}" for k, v in c["breakdown"].items()),
                 "; ".join(c.get("reasons", []))) for c in decision.get("candidates", [])]
        filtered = [(f["capability"], f["reason"]) for f in decision.get("filtered", [])]
        head = format_html("<p><b>{}</b> (top score {}){}</p>", decision.get("decision", "—"),
                           decision.get("score", "—"), " — rule-only fast path" if decision.get("fast_path") else "")
        table = format_html(
            "<table><tr><th>capability</th><th>agent</th><th>score</th><th>breakdown</th><th>reasons</th></tr>{}"
            "</table>",
            format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", rows))
        out = format_html_join("", "<li>{}: {}</li>", filtered)
        return format_html("{}{}{}", head, table, format_html("<p>Filtered out:</p><ul>{}</ul>", out) if filtered
                           else "")

    def get_queryset(self, request):
        from registry.models import Agent
        from registry.permissions import sees_all_teams, team_ids

        qs = super().get_queryset(request)
        if sees_all_teams(request.user):
            return qs
        # a team member sees the tasks its own agents served
        return qs.filter(agent_endpoint__in=Agent.objects.filter(team__in=team_ids(request.user))
                         .values("endpoint_id"))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(RoutingCalibration)
class RoutingCalibrationAdmin(admin.ModelAdmin):
    list_display = ["embedder", "capabilities", "computed_at", "params"]
    readonly_fields = ["embedder", "capabilities", "computed_at", "params"]
    exclude = ["head"]

    def has_add_permission(self, request):
        return False


@admin.register(A2APushConfig)
class A2APushConfigAdmin(admin.ModelAdmin):
    """A2A push-notification configs of callers' tasks (made through the A2A door; read-only here)."""

    list_display = ["task_request_id", "config_id", "caller", "url", "created_at"]
    search_fields = ["task_request_id", "config_id", "url"]
    readonly_fields = ["caller", "task_request_id", "config_id", "url", "auth_scheme", "created_at"]
    exclude = ["token", "auth_credentials"]  # secrets of the caller's webhook: not shown

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(CallbackDelivery)
class CallbackDeliveryAdmin(admin.ModelAdmin):
    """The callback outbox; dead letters can be replayed, one or many."""

    list_display = ["task", "url", "status", "attempts", "last_error", "created_at", "delivered_at", "dead_at"]
    list_filter = ["status"]
    search_fields = ["task__request_id", "url"]
    readonly_fields = ["task", "url", "body", "push_config", "status", "attempts", "last_error", "created_at",
                       "delivered_at", "dead_at"]
    actions = ["replay"]

    @admin.action(description="Replay the selected dead letters")
    def replay(self, request, queryset):
        dead = list(queryset.filter(status=CallbackDelivery.Status.DEAD))
        for delivery in dead:
            delivery_replay(delivery, actor=request.user)
        self.message_user(request, f"{len(dead)} dead letter(s) queued again.", messages.SUCCESS)

    def has_add_permission(self, request):
        return False


@admin.register(CallerSecret)
class CallerSecretAdmin(AuditedAdmin):
    audit_exclude = ("secret",)
    list_display = ["caller", "created_at"]
    readonly_fields = ["secret", "created_at"]


class ScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = ["name", "enabled", "cron", "every_seconds", "capability", "task_text", "payload", "caller"]

    def clean(self):
        from django.core.exceptions import ValidationError

        from reach_platform.errors import ApplicationError
        from routing.schedules import schedule_validate

        data = super().clean()
        clean_form_json(self, ["payload"])
        probe = Schedule(**{k: data.get(k) for k in ("cron", "every_seconds", "capability", "task_text")},
                         payload=data.get("payload", {}))
        probe.cron, probe.capability, probe.task_text = probe.cron or "", probe.capability or "", probe.task_text or ""
        try:
            schedule_validate(probe)
        except ApplicationError as exc:
            raise ValidationError(exc.message)
        return data


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    """Cron entries that invoke a capability or a task text; each run shows up as a normal task."""

    form = ScheduleForm
    list_display = ["name", "enabled", "cron", "every_seconds", "capability", "task_text", "caller", "last_run_at"]
    list_filter = ["enabled"]
    search_fields = ["name", "capability", "task_text"]
    readonly_fields = ["last_run_at", "created_at"]

    def save_model(self, request, obj, form, change):
        schedule_save(schedule=obj, actor=request.user)

    def delete_model(self, request, obj):
        schedule_delete(schedule=obj, actor=request.user)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            schedule_delete(schedule=obj, actor=request.user)


@admin.register(AgentSession)
class AgentSessionAdmin(admin.ModelAdmin):
    list_display = ["user_key", "agent_endpoint", "instance", "caller", "opened_at", "last_activity_at", "closed_at",
                    "close_reason"]
    list_filter = ["close_reason", "agent_endpoint"]
    search_fields = ["user_key", "agent_endpoint"]
    readonly_fields = list_display

    def has_add_permission(self, request):
        return False
