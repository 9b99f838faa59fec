"""python manage.py reach_import_card URL [--team T --environment E] | --check"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from reach_platform.errors import ApplicationError
from registry.a2a_cards import agent_card_check, agent_card_import
from registry.models import AgentCard


class Command(BaseCommand):
    help = ("Register an A2A agent from its card (URL of the agent or of its /.well-known/agent-card.json): the "
            "agent, its allowlist entry, an a2a instance and one DRAFT capability version per skill. With --check, "
            "fetch the cards of the agents registered so and flag those that changed.")

    def add_arguments(self, parser):
        parser.add_argument("url", nargs="?", default="")
        parser.add_argument("--team", default="a2a")
        parser.add_argument("--environment", default="dev")
        parser.add_argument("--check", action="store_true", help="Re-check every registered card instead.")

    def handle(self, *args, url, team, environment, check, **options):
        try:
            if check:
                for record in AgentCard.objects.select_related("agent"):
                    record = agent_card_check(record=record)
                    state = f"CHANGED: {record.flag_reason}" if record.flagged else "as registered"
                    self.stdout.write(f"{record.agent.endpoint_id}: {state}")
                return
            if not url:
                raise CommandError("Give the agent's URL (or --check).")
            record = agent_card_import(url=url, team=team, environment=environment)
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        skills = [s.get("id") for s in record.card.get("skills") or []]
        self.stdout.write(f"agent {record.agent.endpoint_id} ({record.rpc_url}): {len(skills)} draft capability "
                          f"version(s): {', '.join(skills)}")
