from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command

from registry.models import Team
from tests.helpers import as_user  # noqa: F401  (the tests of this package import it from here)


def person(django_user_model, name: str, *, team: str | None = None, group: str | None = None, staff=True):
    user = django_user_model.objects.create_user(name, password=f"pw-{name}-123", is_staff=staff)
    if team:
        Team.objects.get(slug=team).members.add(user)
    if group:
        user.groups.add(Group.objects.get(name=group))
    return user


@pytest.fixture
def people(django_user_model):
    """The example registry (as drafts) and one person per role: commerce owns order-agent, platform owns
    notify-agent."""
    call_command("reach_import", "examples/descriptors", verbosity=0)
    return {
        "member": person(django_user_model, "member", team="commerce", group="agent team member"),
        "reviewer": person(django_user_model, "reviewer", group="reviewer"),
        "own_reviewer": person(django_user_model, "own-reviewer", team="commerce", group="reviewer"),
        "outsider": person(django_user_model, "outsider", team="platform", group="agent team member"),
        "finance": person(django_user_model, "finance", group="finance"),
    }


from tests.routing.conftest import registry_ready, running_agents  # noqa: E402,F401  (shared fixtures)
