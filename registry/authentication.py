"""Agent credentials: ``Authorization: Agent <key>``, separate from caller tokens."""

from __future__ import annotations

from rest_framework import authentication, exceptions
from rest_framework.permissions import BasePermission

from registry.services import allowlist_entry_for_key


class AgentPrincipal:
    """The authenticated agent: its allowlist entry (endpoint id + environment + team)."""

    is_authenticated = True
    is_agent = True

    def __init__(self, entry):
        self.entry = entry
        self.endpoint_id = entry.endpoint_id

    def __str__(self) -> str:
        return f"agent:{self.endpoint_id}"


class AgentKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Agent"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(errors="replace").split()
        if not header or header[0] != self.keyword:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Malformed agent credentials: use 'Authorization: Agent <key>'.")
        entry = allowlist_entry_for_key(header[1])
        if entry is None:
            raise exceptions.AuthenticationFailed("Unknown or disabled agent key.")
        return AgentPrincipal(entry), entry

    def authenticate_header(self, request):
        return self.keyword


class IsAgent(BasePermission):
    message = "Agent credentials required (Authorization: Agent <key>)."

    def has_permission(self, request, view):
        return isinstance(request.user, AgentPrincipal)

    def has_object_permission(self, request, view, obj):
        return True
