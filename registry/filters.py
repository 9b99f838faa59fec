from __future__ import annotations

import django_filters
from django.db.models import Q

from registry.models import Agent, CapabilityVersion, Instance


class AgentFilter(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="team__slug")
    environment = django_filters.CharFilter(field_name="environment__name")
    status = django_filters.CharFilter()
    q = django_filters.CharFilter(method="search", label="Text search")

    class Meta:
        model = Agent
        fields = ["team", "environment", "status"]

    def search(self, queryset, name, value):
        return queryset.filter(Q(endpoint_id__icontains=value) | Q(display_name__icontains=value)
                               | Q(description__icontains=value))


class InstanceFilter(django_filters.FilterSet):
    agent = django_filters.CharFilter(field_name="agent__endpoint_id")
    team = django_filters.CharFilter(field_name="agent__team__slug")
    environment = django_filters.CharFilter(field_name="agent__environment__name")
    liveness = django_filters.CharFilter()
    transport = django_filters.CharFilter()
    q = django_filters.CharFilter(method="search", label="Text search")

    class Meta:
        model = Instance
        fields = ["agent", "team", "environment", "liveness", "transport"]

    def search(self, queryset, name, value):
        return queryset.filter(Q(instance_id__icontains=value) | Q(url__icontains=value)
                               | Q(agent__endpoint_id__icontains=value))


class CapabilityVersionFilter(django_filters.FilterSet):
    agent = django_filters.CharFilter(field_name="capability__agent__endpoint_id")
    team = django_filters.CharFilter(field_name="capability__agent__team__slug")
    environment = django_filters.CharFilter(field_name="capability__agent__environment__name")
    capability = django_filters.CharFilter(field_name="capability__name")
    status = django_filters.CharFilter(field_name="state")
    action = django_filters.CharFilter()
    domain = django_filters.CharFilter(field_name="domains", lookup_expr="contains", method="by_domain")
    q = django_filters.CharFilter(method="search", label="Text search")

    class Meta:
        model = CapabilityVersion
        fields = ["agent", "team", "environment", "capability", "status", "action"]

    def by_domain(self, queryset, name, value):
        return queryset.filter(domains__contains=[value])

    def search(self, queryset, name, value):
        return queryset.filter(Q(capability__name__icontains=value) | Q(description__icontains=value)
                               | Q(keywords__contains=[value]))
