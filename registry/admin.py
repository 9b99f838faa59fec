from __future__ import annotations

from django.contrib import admin, messages
from django.utils.html import format_html

from registry import services
from registry.choices import VersionState
from registry.models import (
    Agent,
    AllowlistEntry,
    AuditLog,
    Capability,
    CapabilityVersion,
    Environment,
    Instance,
    Team,
)


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["slug", "name"]
    search_fields = ["slug", "name"]
    filter_horizontal = ["members"]


@admin.register(Environment)
class EnvironmentAdmin(admin.ModelAdmin):
    list_display = ["name", "description"]


@admin.register(AllowlistEntry)
class AllowlistEntryAdmin(admin.ModelAdmin):
    list_display = ["endpoint_id", "environment", "team", "enabled", "key_prefix", "created_at"]
    list_filter = ["environment", "team", "enabled"]
    search_fields = ["endpoint_id"]
    readonly_fields = ["key_hash", "key_prefix", "created_at"]
    actions = ["issue_keys"]

    @admin.action(description="Issue (rotate) agent keys for the selected entries")
    def issue_keys(self, request, queryset):
        for entry in queryset.select_related("environment", "team"):
            _, raw = services.allowlist_entry_issue(endpoint_id=entry.endpoint_id,
                                                    environment=entry.environment.name,
                                                    team=entry.team.slug, actor=request.user)
            self.message_user(request, f"Key for {entry}: {raw} (shown once, store it now)", messages.WARNING)


class InstanceInline(admin.TabularInline):
    model = Instance
    extra = 0
    fields = ["instance_id", "url", "transport", "liveness", "weight", "max_concurrency", "max_qps",
              "reg_version", "last_heartbeat_at", "in_flight", "deregistered_at"]
    readonly_fields = ["liveness", "reg_version", "last_heartbeat_at", "in_flight", "deregistered_at"]
    show_change_link = True


class CapabilityInline(admin.TabularInline):
    model = Capability
    extra = 0
    fields = ["name"]
    show_change_link = True


def liveness_badge(liveness: str) -> str:
    colour = {"online": "#2e7d32", "suspect": "#ef6c00", "offline": "#c62828"}.get(liveness, "#555")
    return format_html('<b style="color:{}">{}</b>', colour, liveness.upper())


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ["endpoint_id", "team", "environment", "status", "instances_live"]
    list_filter = ["environment", "team", "status"]
    search_fields = ["endpoint_id", "display_name", "description"]
    inlines = [InstanceInline, CapabilityInline]

    @admin.display(description="Instances")
    def instances_live(self, obj):
        parts = [liveness_badge(i.liveness) for i in obj.instances.all() if i.deregistered_at is None]
        return format_html(" ".join(["{}"] * len(parts)), *parts) if parts else "—"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("team", "environment").prefetch_related("instances")


@admin.register(Instance)
class InstanceAdmin(admin.ModelAdmin):
    list_display = ["__str__", "url", "transport", "liveness_col", "in_flight", "max_concurrency",
                    "last_heartbeat_at"]
    list_filter = ["liveness", "transport", "agent__environment"]
    search_fields = ["instance_id", "url", "agent__endpoint_id"]
    readonly_fields = ["reg_version", "started_at", "last_heartbeat_at", "last_seen_at", "last_probe_at",
                       "last_probe_ok", "suspect_since", "liveness", "in_flight", "load", "deregistered_at"]

    @admin.display(description="Liveness", ordering="liveness")
    def liveness_col(self, obj):
        return liveness_badge(obj.liveness)


class VersionInline(admin.TabularInline):
    model = CapabilityVersion
    extra = 0
    fields = ["version", "state", "action", "is_canary", "canary_share", "confidence_weight", "activated_at"]
    readonly_fields = fields
    show_change_link = True
    can_delete = False


@admin.register(Capability)
class CapabilityAdmin(admin.ModelAdmin):
    list_display = ["name", "agent"]
    search_fields = ["name", "agent__endpoint_id"]
    inlines = [VersionInline]


@admin.register(CapabilityVersion)
class CapabilityVersionAdmin(admin.ModelAdmin):
    list_display = ["capability", "version", "state", "action", "is_canary", "idempotent", "confidence_weight",
                    "embedded_with"]
    list_filter = ["state", "action", "idempotent", "is_canary", "capability__agent__environment"]
    search_fields = ["capability__name", "description", "version"]
    readonly_fields = ["state", "embedded_with", "source_digest", "activated_at", "rolled_back", "submitted_by",
                       "reviewed_by", "created_at", "updated_at", "audit_history"]
    actions = ["activate"]

    @admin.display(description="Audit history")
    def audit_history(self, obj):
        rows = AuditLog.objects.filter(target_type="registry.capabilityversion", target_id=str(obj.pk))[:50]
        return format_html("<br>".join(["{} — {} by {}"] * len(rows)),
                           *[x for r in rows for x in (r.created_at.strftime("%Y-%m-%d %H:%M:%S"), r.action,
                                                        r.actor_label)]) if rows else "—"

    @admin.action(description="Activate without review (trusted admins only)")
    def activate(self, request, queryset):
        if not request.user.is_superuser:
            self.message_user(request, "Only superusers may activate without review.", messages.ERROR)
            return
        for version in queryset.exclude(state__in=[VersionState.ACTIVE, VersionState.RETIRED]):
            services.capability_version_activate(version=version, actor=request.user)
            self.message_user(request, f"{version} activated.")


@admin.register(AuditLog)
class AuditLogAdmin(admin.ModelAdmin):
    list_display = ["created_at", "actor_label", "action", "target_type", "target_repr", "request_id"]
    list_filter = ["action", "target_type"]
    search_fields = ["target_repr", "actor_label", "request_id", "target_id"]
    date_hierarchy = "created_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
