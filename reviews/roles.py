"""The four roles as Django groups with their model permissions.

Model permissions say which admin pages a role sees; object-level rules (a team member edits only its own team's
agents and versions) are enforced in services through ``registry.permissions``, so admin and API agree.
The groups are created by a data migration; their permissions are (re)applied after every migrate, when all
permission rows exist."""

from __future__ import annotations

from registry.permissions import ADMIN_GROUP, FINANCE_GROUP, REVIEWER_GROUP, TEAM_MEMBER_GROUP

ROLE_PERMISSIONS: dict[str, list[str]] = {
    TEAM_MEMBER_GROUP: [
        "registry.view_team", "registry.view_environment", "registry.view_agent", "registry.change_agent",
        "registry.view_instance", "registry.view_capability", "registry.add_capability",
        "registry.view_capabilityversion", "registry.add_capabilityversion", "registry.change_capabilityversion",
        "registry.view_auditlog", "routing.view_task",
    ],
    REVIEWER_GROUP: [
        "registry.view_team", "registry.view_environment", "registry.view_agent", "registry.view_instance",
        "registry.view_capability", "registry.view_capabilityversion", "registry.view_auditlog",
        "routing.view_task", "routing.view_attempt", "routing.view_callbackdelivery",
        "reviews.view_reviewitem", "reviews.change_reviewitem", "reviews.view_routingfeedback",
        "reviews.change_routingfeedback", "reviews.view_reviewclaim",
    ],
    FINANCE_GROUP: ["ledger.view_costentry", "ledger.view_budget"],
    ADMIN_GROUP: ["*registry", "*routing", "*ledger", "*reviews", "auth.view_user", "auth.add_user",
                  "auth.change_user", "auth.view_group", "authtoken.view_tokenproxy", "authtoken.add_tokenproxy",
                  "authtoken.delete_tokenproxy", "django_celery_beat.view_periodictask"],
}


def ensure_roles(**_kwargs) -> None:
    from django.contrib.auth.models import Group, Permission

    for group_name, names in ROLE_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=group_name)
        perms = []
        for name in names:
            if name.startswith("*"):
                perms += list(Permission.objects.filter(content_type__app_label=name[1:]))
                continue
            app_label, codename = name.split(".")
            perms += list(Permission.objects.filter(content_type__app_label=app_label, codename=codename))
        group.permissions.add(*perms)
