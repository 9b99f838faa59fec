from django.contrib.admin.apps import AdminConfig


class ReachAdminConfig(AdminConfig):
    """django.contrib.admin with the Agent-Reach site (its index is the operations dashboard)."""

    default_site = "reach_platform.admin_site.ReachAdminSite"
