"""The agent onboarding page in the admin: register an agent end to end without YAML — allowlist entry and key
(shown once, on the page, never in the messages cookie), the agent, its first capability draft — with a live
"try routing" box that asks the resolver's dry run which capability a typed request goes to, and why."""

from __future__ import annotations

import json

from django import forms
from django.http import JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from reach_platform.errors import ApplicationError
from registry.choices import ACTIONS
from registry.models import Environment, Team
from registry.permissions import is_admin, team_ids
from registry.services import TEAM_ONBOARDING_ENVIRONMENTS, agent_onboard
from routing.resolver import resolve


def _lines(text: str) -> list[str]:
    return [line.strip() for line in (text or "").splitlines() if line.strip()]


class OnboardingForm(forms.Form):
    endpoint_id = forms.SlugField(max_length=100, help_text="The agent's logical id, e.g. parcel-agent.")
    display_name = forms.CharField(max_length=200, required=False)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False,
                                  help_text="What the agent is (shown in the registry).")
    team = forms.ModelChoiceField(queryset=Team.objects.none())
    environment = forms.ModelChoiceField(queryset=Environment.objects.none(), to_field_name="name")
    capability = forms.RegexField(regex=r"^[a-z0-9_-]+(\.[a-z0-9_-]+)+$", max_length=120,
                                  help_text="Dotted name, e.g. parcel.track.")
    action = forms.ChoiceField(choices=[(a, a) for a in ACTIONS])
    capability_description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    examples = forms.CharField(widget=forms.Textarea(attrs={"rows": 8}),
                               help_text="Requests it should get, one per line (10 or more to submit).")
    negative_cases = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False,
                                     help_text="Requests it must not get, one per line (at least one to submit).")
    input_schema = forms.JSONField(initial={"type": "object"}, help_text="JSON Schema of the payload.")
    idempotent = forms.BooleanField(required=False, initial=True,
                                    help_text="Safe to retry (the gateway never retries a non-idempotent call "
                                              "that may have run).")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        teams = Team.objects.order_by("slug")
        self.fields["team"].queryset = teams if is_admin(user) else teams.filter(pk__in=team_ids(user))
        envs = Environment.objects.order_by("name")
        self.fields["environment"].queryset = envs if is_admin(user) else envs.filter(
            name__in=TEAM_ONBOARDING_ENVIRONMENTS)

    def clean_input_schema(self):
        schema = self.cleaned_data["input_schema"]
        if not isinstance(schema, dict):
            raise forms.ValidationError("A JSON Schema is a JSON object.")
        return schema


def onboarding_view(model_admin, request):
    user = request.user
    context = {**model_admin.admin_site.each_context(request), "opts": model_admin.model._meta,
               "title": "Onboard an agent", "try_url": reverse("admin:registry_agent_onboard_try")}
    form = OnboardingForm(request.POST or None, user=user)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            entry, key, draft = agent_onboard(
                actor=user, endpoint_id=data["endpoint_id"], team=data["team"],
                environment=data["environment"].name, capability=data["capability"],
                display_name=data["display_name"], agent_description=data["description"],
                action=data["action"], description=data["capability_description"],
                examples=_lines(data["examples"]), negative_cases=_lines(data["negative_cases"]),
                input_schema=data["input_schema"], idempotent=data["idempotent"])
        except ApplicationError as exc:
            form.add_error(None, exc.message)
        else:
            # The key is in this response only: not stored, not in a message, not in a redirect.
            response = TemplateResponse(request, "admin/registry/agent/onboarded.html", {
                **context, "title": f"{entry.endpoint_id} onboarded", "entry": entry, "key": key, "draft": draft,
                "register_body": json.dumps({
                    "endpoint_id": entry.endpoint_id, "environment": entry.environment.name,
                    "instance_id": "host:port", "url": "http://host:port/invoke",
                    "health_url": "http://host:port/health", "reg_version": 1}, indent=2),
                "gateway": request.build_absolute_uri("/").rstrip("/"),
                "review_url": reverse("admin:registry_capabilityversion_review", args=[draft.pk])})
            response["Cache-Control"] = "no-store"
            return response
    return TemplateResponse(request, "admin/registry/agent/onboard.html", {**context, "form": form})


def try_routing_view(model_admin, request):
    """The resolver's dry run for a typed request: the decision and the candidates with their reasons."""
    text = (request.GET.get("q") or "").strip()[:2000]
    if not text:
        return JsonResponse({"error": "Type a request."}, status=400)
    try:
        resolution = resolve(task=text).as_dict()
    except ApplicationError as exc:
        return JsonResponse({"error": exc.message}, status=400)
    keep = ("capability", "agent", "version", "score", "reasons")
    return JsonResponse({"decision": resolution["decision"], "score": resolution["score"],
                         "candidates": [{k: c.get(k) for k in keep} for c in resolution["candidates"]],
                         "filtered": resolution["filtered"][:10]})
