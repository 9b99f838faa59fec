"""python manage.py reach_agent_keys --out FILE [ENDPOINT_ID ...]: issue (rotate) agent keys."""

from __future__ import annotations

import json
import os
from pathlib import Path

from django.core.management.base import BaseCommand

from registry.models import AllowlistEntry
from registry.services import allowlist_entry_issue


class Command(BaseCommand):
    help = "Issue (rotate) agent keys for allowlisted endpoint ids and write them to a JSON file (mode 600)."

    def add_arguments(self, parser):
        parser.add_argument("endpoint_ids", nargs="*", help="Default: every allowlisted endpoint id.")
        parser.add_argument("--out", required=True)

    def handle(self, *args, endpoint_ids, out, **options):
        entries = AllowlistEntry.objects.select_related("environment", "team").filter(enabled=True)
        if endpoint_ids:
            entries = entries.filter(endpoint_id__in=endpoint_ids)
        keys = {}
        for entry in entries:
            _, raw = allowlist_entry_issue(endpoint_id=entry.endpoint_id, environment=entry.environment.name,
                                           team=entry.team.slug)
            keys[entry.endpoint_id] = raw
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(keys, fh, indent=2)
        self.stdout.write(f"Issued {len(keys)} agent key(s) into {path}.")
