from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html

from reach_platform.errors import ApplicationError
from reach_platform.jsonsafe import clean_form_json
from registry import onboarding, selectors, services
from registry.audit import object_save
from registry.choices import VersionState
from registry.models import (
    Agent,
    AgentCard,
    AllowlistEntry,
    AuditLog,
    Capability,
    CapabilityVersion,
    Environment,
    Instance,
    Team,
)
from registry.permissions import can_edit_team, is_admin, team_ids


class TeamScopedAdmin(admin.ModelAdmin):
    """Team members see and change their own team's objects only; reviewers and finance read everything; admins
    do everything. The same rules are enforced again by the services the admin calls."""

    team_path = "team"

    def team_id_of(self, obj) -> int:
        target = obj
        for part in self.team_path.split("__"):
            target = getattr(target, part)
        return target.pk

    def get_queryset(self, request):
        return selectors.team_scoped(super().get_queryset(request), user=request.user, team_path=self.team_path)

    def has_change_permission(self, request, obj=None):
        if not super().has_change_permission(request, obj):
            return False
        return obj is None or can_edit_team(request.user, self.team_id_of(obj))

    def has_delete_permission(self, request, obj=None):
        return is_admin(request.user) and super().has_delete_permission(request, obj)


def error_message(exc: ApplicationError) -> str:
    details = exc.details if isinstance(exc.details, list) else []
    return exc.message + (" " + "; ".join(str(d) for d in details) if details else "")


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["slug", "name"]
    search_fields = ["slug", "name"]
    filter_horizontal = ["members"]

    def get_queryset(self, request):
        return selectors.team_list(user=request.user)


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
        """The raw keys are shown once, on the page this POST answers with: never in a message (the messages
        framework keeps them in a signed, not encrypted, cookie) and never cached."""
        issued = []
        for entry in queryset.select_related("environment", "team"):
            _, raw = services.allowlist_entry_issue(endpoint_id=entry.endpoint_id,
                                                    environment=entry.environment.name,
                                                    team=entry.team.slug, actor=request.user)
            issued.append({"entry": str(entry), "key": raw})
        context = {**self.admin_site.each_context(request), "title": "Agent keys issued", "issued": issued,
                   "opts": self.model._meta}
        response = TemplateResponse(request, "admin/registry/allowlistentry/issued_keys.html", context)
        add_never_cache_headers(response)
        return response


class AdminOnlyEditsInline(admin.TabularInline):
    def has_change_permission(self, request, obj=None):
        return is_admin(request.user)

    def has_add_permission(self, request, obj=None):
        return is_admin(request.user)

    def has_delete_permission(self, request, obj=None):
        return is_admin(request.user)


class InstanceInline(AdminOnlyEditsInline):
    model = Instance
    extra = 0
    fields = ["instance_id", "url", "transport", "liveness", "weight", "max_concurrency", "max_qps",
              "reg_version", "last_heartbeat_at", "in_flight", "deregistered_at"]
    readonly_fields = ["liveness", "reg_version", "last_heartbeat_at", "in_flight", "deregistered_at"]
    show_change_link = True


class CapabilityInline(AdminOnlyEditsInline):
    model = Capability
    extra = 0
    fields = ["name"]
    show_change_link = True


def liveness_badge(liveness: str) -> str:
    colour = {"online": "#2e7d32", "suspect": "#ef6c00", "offline": "#c62828"}.get(liveness, "#555")
    return format_html('<b style="color:{}">{}</b>', colour, liveness.upper())


@admin.register(Agent)
class AgentAdmin(TeamScopedAdmin):
    change_list_template = "admin/registry/agent/change_list.html"
    list_display = ["endpoint_id", "team", "environment", "status", "instances_live"]
    list_filter = ["environment", "team", "status"]
    search_fields = ["endpoint_id", "display_name", "description"]
    inlines = [InstanceInline, CapabilityInline]

    def get_readonly_fields(self, request, obj=None):
        if obj is not None and not is_admin(request.user):  # teams edit the description and status only
            return ["endpoint_id", "team", "environment", "created_at", "updated_at"]
        return super().get_readonly_fields(request, obj)

    def get_fields(self, request, obj=None):
        return ["endpoint_id", "display_name", "description", "team", "environment", "status"]

    def save_model(self, request, obj, form, change):
        if not change:
            return super().save_model(request, obj, form, change)
        fields = {name: form.cleaned_data[name] for name in form.changed_data if name in services.AGENT_EDITABLE}
        other = [name for name in form.changed_data if name not in services.AGENT_EDITABLE]
        if other and is_admin(request.user):
            object_save(obj=obj, actor=request.user, fields=other)
        if fields:
            services.agent_update(agent=obj, actor=request.user, **fields)

    def get_urls(self):
        return [path("onboard/", self.admin_site.admin_view(self.onboard_view), name="registry_agent_onboard"),
                path("onboard/try/", self.admin_site.admin_view(self.try_view), name="registry_agent_onboard_try"),
                *super().get_urls()]

    def may_onboard(self, request) -> bool:
        return is_admin(request.user) or bool(team_ids(request.user))

    def onboard_view(self, request):
        if not self.may_onboard(request):
            raise DjangoPermissionDenied
        return onboarding.onboarding_view(self, request)

    def try_view(self, request):
        if not self.may_onboard(request):
            raise DjangoPermissionDenied
        return onboarding.try_routing_view(self, request)

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {"may_onboard": self.may_onboard(request), **(extra_context or {})})

    @admin.display(description="Instances")
    def instances_live(self, obj):
        parts = [liveness_badge(i.liveness) for i in obj.instances.all() if i.deregistered_at is None]
        return format_html(" ".join(["{}"] * len(parts)), *parts) if parts else "—"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("team", "environment").prefetch_related("instances")


@admin.register(Instance)
class InstanceAdmin(TeamScopedAdmin):
    team_path = "agent__team"
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
class CapabilityAdmin(TeamScopedAdmin):
    team_path = "agent__team"
    list_display = ["name", "agent"]

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "agent" and not is_admin(request.user):
            kwargs["queryset"] = Agent.objects.filter(team__in=team_ids(request.user))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request, obj, form, change):
        from registry.permissions import ensure_can_edit_team

        ensure_can_edit_team(request.user, obj.agent.team_id, f"agent '{obj.agent.endpoint_id}'")
        object_save(obj=obj, actor=request.user, fields=["name", "agent"])
    search_fields = ["name", "agent__endpoint_id"]
    inlines = [VersionInline]


class DraftForm(forms.ModelForm):
    class Meta:
        model = CapabilityVersion
        fields = ["capability", "version", *services.DRAFT_FIELDS]

    def clean(self):
        data = super().clean()
        clean_form_json(self, ["examples", "negative_cases", "reject_conditions", "input_schema", "output_schema"])
        return data


@admin.register(CapabilityVersion)
class CapabilityVersionAdmin(TeamScopedAdmin):
    """Versions are written as drafts by their team; the review page (diff and workflow buttons) moves them on."""

    team_path = "capability__agent__team"
    form = DraftForm
    list_display = ["capability", "version", "state_col", "action", "canary_col", "confidence_weight"]
    list_filter = ["state", "action", "is_canary", "rolled_back", "capability__agent__team",
                   "capability__agent__environment"]
    search_fields = ["capability__name", "description", "version"]
    actions = ["activate"]
    WORKFLOW_FIELDS = ["state", "is_canary", "canary_share", "rolled_back", "confidence_weight", "review_comment",
                       "submitted_by", "reviewed_by", "embedded_with", "activated_at", "created_at", "updated_at",
                       "audit_history"]

    def get_fields(self, request, obj=None):
        fields = ["capability", "version", *services.DRAFT_FIELDS]
        return fields if obj is None else [*fields, *self.WORKFLOW_FIELDS]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return []
        return ["capability", "version", *self.WORKFLOW_FIELDS]

    def has_change_permission(self, request, obj=None):
        # only drafts (and rejected versions, which go back to draft) are edited; the rest moves by workflow
        if obj is not None and obj.state not in (VersionState.DRAFT, VersionState.REJECTED):
            return False
        return super().has_change_permission(request, obj)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "capability" and not is_admin(request.user):
            kwargs["queryset"] = Capability.objects.filter(agent__team__in=team_ids(request.user))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request, obj, form, change):
        fields = {name: form.cleaned_data[name] for name in services.DRAFT_FIELDS
                  if name in form.cleaned_data and (not change or name in form.changed_data)}
        if change:
            saved = services.capability_version_draft_update(version=obj, actor=request.user, **fields)
        else:
            saved = services.capability_version_draft_create(capability=obj.capability, actor=request.user,
                                                             version=obj.version, **fields)
        obj.pk = obj.id = saved.pk
        obj.state = saved.state

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except ApplicationError as exc:
            self.message_user(request, error_message(exc), messages.ERROR)
            return redirect(request.path)

    @admin.display(description="State", ordering="state")
    def state_col(self, obj):
        return format_html("<b>{}</b>{}", obj.state.upper(), " (rolled back)" if obj.rolled_back else "")

    @admin.display(description="Canary")
    def canary_col(self, obj):
        return f"{obj.canary_share:.0%}" if obj.is_canary else "—"

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


class CardImportForm(forms.ModelForm):
    """"Add" on agent cards imports an agent from its card (registry.a2a_cards.agent_card_import)."""

    url = forms.URLField(label="Agent URL", assume_scheme="https",
                         help_text="The agent's base URL or its /.well-known/agent-card.json.")
    team = forms.ModelChoiceField(queryset=Team.objects.all())
    environment = forms.ModelChoiceField(queryset=Environment.objects.all(), to_field_name="name")

    class Meta:
        model = AgentCard
        fields: list[str] = []

    def clean(self):
        from registry.a2a_cards import agent_card_import

        data = super().clean()
        if self.errors:
            return data
        try:
            self.imported = agent_card_import(url=data["url"], team=data["team"].slug,
                                              environment=data["environment"].name, actor=self.user)
        except ApplicationError as exc:
            raise forms.ValidationError(error_message(exc)) from exc
        return data


@admin.register(AgentCard)
class AgentCardAdmin(TeamScopedAdmin):
    """A2A agents registered from their card. A card the agent later serves changed is flagged here."""

    team_path = "agent__team"
    list_display = ["agent", "name", "rpc_url", "flagged", "flag_reason", "last_checked_at"]
    list_filter = ["flagged"]
    readonly_fields = ["agent", "card_url", "name", "rpc_url", "card", "skills_digest", "registered_at",
                       "last_checked_at", "flagged", "flag_reason", "served_card"]
    actions = ["check_cards"]

    def get_form(self, request, obj=None, **kwargs):
        if obj is None:
            form = type("BoundCardImportForm", (CardImportForm,), {"user": request.user})
            return form
        return super().get_form(request, obj, **kwargs)

    def get_fields(self, request, obj=None):
        return ["url", "team", "environment"] if obj is None else self.readonly_fields

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else self.readonly_fields

    def save_model(self, request, obj, form, change):
        if not change:  # the import saved everything in the form's clean (one transaction with this request)
            obj.__dict__.update({k: v for k, v in form.imported.__dict__.items() if not k.startswith("_")})
            obj._state.adding = False

    def changelist_view(self, request, extra_context=None):
        flagged = list(self.get_queryset(request).filter(flagged=True).select_related("agent"))
        for record in flagged:
            self.message_user(request, f"{record.agent.endpoint_id} serves a card that differs from the registered "
                              f"one ({record.flag_reason}); it keeps routing as registered.", messages.WARNING)
        return super().changelist_view(request, extra_context)

    @admin.action(description="Fetch the selected cards again and flag changes")
    def check_cards(self, request, queryset):
        from registry.a2a_cards import agent_card_check

        for record in queryset.select_related("agent"):
            try:
                record = agent_card_check(record=record, actor=request.user)
            except ApplicationError as exc:
                self.message_user(request, f"{record.agent.endpoint_id}: {error_message(exc)}", messages.ERROR)
                continue
            if not record.flagged:
                self.message_user(request, f"{record.agent.endpoint_id}: card as registered.")


@admin.register(AuditLog)
class AuditLogAdmin(admin.ModelAdmin):
    list_display = ["created_at", "actor_label", "action", "target_type", "target_repr", "request_id"]
    list_filter = ["action", "target_type"]
    search_fields = ["target_repr", "actor_label", "request_id", "target_id"]
    date_hierarchy = "created_at"

    def get_queryset(self, request):
        return selectors.audit_log_list(user=request.user)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
