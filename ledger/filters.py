from __future__ import annotations

import django_filters

from ledger.models import CostEntry


class WeeklyReportFilter(django_filters.FilterSet):
    """The weekly report's filters (the week itself is required and validated by the view)."""

    team = django_filters.CharFilter(field_name="team_slug")
    agent = django_filters.CharFilter(field_name="agent_endpoint")

    class Meta:
        model = CostEntry
        fields = ["team", "agent"]
