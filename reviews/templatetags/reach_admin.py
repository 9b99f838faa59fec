"""The governance notices on the admin index: waiting review items, versions waiting for a reviewer, and canaries
rolled back recently (the team's notice of an automatic rollback)."""

from __future__ import annotations

from datetime import timedelta

from django import template
from django.utils import timezone

register = template.Library()


@register.inclusion_tag("admin/reviews/notices.html", takes_context=True)
def governance_notices(context):
    from registry.choices import VersionState
    from registry.models import CapabilityVersion
    from registry.permissions import is_reviewer, sees_all_teams, team_ids
    from reviews.selectors import queue_waiting_count

    user = context["request"].user
    reviewer = is_reviewer(user)
    versions = CapabilityVersion.objects.select_related("capability")
    if not sees_all_teams(user):
        versions = versions.filter(capability__agent__team__in=team_ids(user))
    rolled_back = list(versions.filter(rolled_back=True, updated_at__gte=timezone.now() - timedelta(days=7))[:10])
    return {
        "show_queue": reviewer or user.has_perm("reviews.view_reviewitem"),
        "waiting": queue_waiting_count(),
        "submitted": versions.filter(state=VersionState.SUBMITTED).count(),
        "rolled_back": rolled_back,
        "reviewer": reviewer,
    }
