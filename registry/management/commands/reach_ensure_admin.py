"""python manage.py reach_ensure_admin: create the first superuser (REACH_ADMIN_USER / REACH_ADMIN_PASSWORD, or a
generated password kept in .data/admin-password) and print how to log in."""

from __future__ import annotations

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from reach_platform.local_services import DATA_DIR


class Command(BaseCommand):
    help = "Create the admin superuser if missing and print its credentials."

    def handle(self, *args, **options):
        username = os.environ.get("REACH_ADMIN_USER", "admin")
        password = os.environ.get("REACH_ADMIN_PASSWORD")
        stored = DATA_DIR / "admin-password"
        if not password:
            if stored.exists():
                password = stored.read_text().strip()
            else:
                password = secrets.token_urlsafe(12)
                DATA_DIR.mkdir(parents=True, exist_ok=True)
                stored.write_text(password)
                stored.chmod(0o600)
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None:
            User.objects.create_superuser(username=username, email="", password=password)
        elif not user.check_password(password):
            user.set_password(password)
            user.is_superuser = user.is_staff = True
            user.save()
        self.stdout.write(f"Admin login: {username} / {password}")
