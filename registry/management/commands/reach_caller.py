"""python manage.py reach_caller NAME [--budget 50]: create a caller (a user with an API token, optionally with a
monthly budget) and print its token, alone on stdout, so that ``TOKEN=$(... reach_caller NAME)`` works."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.core.management.base import BaseCommand, CommandError

from ledger.services import budget_set
from reach_platform.errors import ApplicationError
from registry.services import caller_create


def _amount(raw: str) -> Decimal:
    try:
        return Decimal(raw)
    except InvalidOperation:
        raise CommandError(f"--budget takes an amount, not {raw!r}")


class Command(BaseCommand):
    help = "Create a caller with an API token (and optionally a monthly budget) and print the token."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--budget", type=_amount, help="Monthly spending cap (the ledger's currency).")
        parser.add_argument("--warn-ratio", type=float, help="Warn from this share of the budget (default 0.8).")

    def handle(self, *args, name: str, budget: Decimal | None, warn_ratio: float | None, **options):
        try:
            user, token, created = caller_create(name=name)
            if budget is not None:
                budget_set(caller=user, monthly_limit=budget, warn_ratio=warn_ratio)
        except ApplicationError as exc:
            raise CommandError(exc.message)
        note = "created" if created else "exists, same token"
        note += f", monthly budget {budget}" if budget is not None else ""
        self.stderr.write(f"caller {name} ({note}); token:")
        self.stdout.write(token)
