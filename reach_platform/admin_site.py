"""The admin site, branded Agent-Reach, whose index is the operations dashboard (reach_platform.dashboard)."""

from __future__ import annotations

from django.contrib import admin

from reach_platform.dashboard import dashboard_context


class ReachAdminSite(admin.AdminSite):
    site_header = "Agent-Reach"
    site_title = "Agent-Reach"
    index_title = "Operations"

    def index(self, request, extra_context=None):
        return super().index(request, {**dashboard_context(request.user), **(extra_context or {})})

