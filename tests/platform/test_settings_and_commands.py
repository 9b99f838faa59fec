"""Production settings (DEBUG off by default, no development secret key in a deployment) and the first-hour
commands: reach_ensure_admin never resets a password, reach_caller hands out a token (and a budget)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from decimal import Decimal

import pytest
from django.core.management import call_command
from rest_framework.authtoken.models import Token

from ledger.models import Budget
from registry.models import AuditLog
from tests.helpers import BASE


def settings_in_subprocess(**env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {"PYTEST_VERSION", "DEBUG", "SECRET_KEY",
                                                              "DATABASE_URL"}}
    code = "import django; django.setup(); from django.conf import settings; print('DEBUG', settings.DEBUG)"
    return subprocess.run([sys.executable, "-c", code], cwd=BASE, capture_output=True, text=True, timeout=60,
                          env={**clean, "DJANGO_SETTINGS_MODULE": "reach_platform.settings", **env})


def test_debug_is_off_unless_asked_for():
    assert settings_in_subprocess().stdout.strip() == "DEBUG False"
    assert settings_in_subprocess(DEBUG="true").stdout.strip() == "DEBUG True"


def test_a_deployment_without_secret_key_refuses_to_start():
    deployment = {"DATABASE_URL": "postgresql://reach@db.example.internal/reach"}
    refused = settings_in_subprocess(**deployment)
    assert refused.returncode != 0 and "SECRET_KEY is not set" in refused.stderr
    assert settings_in_subprocess(**deployment, SECRET_KEY="k" * 50).stdout.strip() == "DEBUG False"


def test_ensure_admin_creates_once_and_never_resets_a_password(db, django_user_model, monkeypatch):
    monkeypatch.setenv("REACH_ADMIN_USER", "boss")
    monkeypatch.setenv("REACH_ADMIN_PASSWORD", "first-password-1")
    call_command("reach_ensure_admin", stdout=io.StringIO())
    boss = django_user_model.objects.get(username="boss")
    assert boss.is_superuser and boss.check_password("first-password-1")
    boss.set_password("changed-in-the-admin")
    boss.save()
    out = io.StringIO()
    call_command("reach_ensure_admin", stdout=out)  # the next `make run`
    boss.refresh_from_db()
    assert boss.check_password("changed-in-the-admin")
    assert "never reset" in out.getvalue()


def test_reach_caller_prints_a_token_and_sets_a_budget(db, django_user_model):
    out = io.StringIO()
    call_command("reach_caller", "shop-app", "--budget", "25.5", stdout=out, stderr=io.StringIO())
    token = out.getvalue().strip()
    user = django_user_model.objects.get(username="shop-app")
    assert Token.objects.get(user=user).key == token and not user.is_staff and not user.has_usable_password()
    assert Budget.objects.get(caller=user).monthly_limit == Decimal("25.5")
    again = io.StringIO()
    call_command("reach_caller", "shop-app", stdout=again, stderr=io.StringIO())
    assert again.getvalue().strip() == token  # the same caller keeps its token
    assert AuditLog.objects.filter(action="caller.created", target_id=str(user.pk)).exists()
    assert AuditLog.objects.get(action="budget.set").after == {"monthly_limit": "25.5", "warn_ratio": 0.8}


def test_reach_caller_refuses_an_admin_name_and_a_bad_budget(db, django_user_model):
    from django.core.management.base import CommandError

    django_user_model.objects.create_superuser("root", password="pw-root-123")
    with pytest.raises(CommandError, match="not a caller"):
        call_command("reach_caller", "root", stdout=io.StringIO(), stderr=io.StringIO())
    with pytest.raises(CommandError, match="limit >= 0"):
        call_command("reach_caller", "app", "--budget", "-3", stdout=io.StringIO(), stderr=io.StringIO())
