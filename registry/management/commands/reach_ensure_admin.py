"""python manage.py reach_ensure_admin: create the first superuser once (REACH_ADMIN_USER / REACH_ADMIN_PASSWORD,
or a generated password kept in .data/admin-password) and print how to log in. An existing user is never changed:
a password set in the admin (or by ``changepassword``) survives every restart."""

from __future__ import annotations

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from reach_platform.local_services import DATA_DIR


class Command(BaseCommand):
    help = "Create the admin superuser if missing (never resets a password) and print how to log in."

    def handle(self, *args, **options):
        username = os.environ.get("REACH_ADMIN_USER", "admin")
        stored = DATA_DIR / "admin-password"
        User = get_user_model()
        if User.objects.filter(username=username).exists():
            first = stored.read_text().strip() if stored.exists() else "(the password you set)"
            self.stdout.write(f"Admin login: {username} / {first} (an existing user: its password is never reset)")
            return
        password = os.environ.get("REACH_ADMIN_PASSWORD")
        if not password:
            password = secrets.token_urlsafe(12)
            DATA_DIR.mkdir(parents=True, exist_ok=True)
            stored.write_text(password)
            stored.chmod(0o600)
        User.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(f"Admin login: {username} / {password}")
