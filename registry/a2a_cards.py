"""A2A agent cards: import an agent from its card, and check later that it still serves the card it was registered
with. The registered card is the truth: a changed name, URL or skill list is flagged for a human, never followed."""

from __future__ import annotations

import hashlib
import json
import re
from urllib.parse import urlparse

import httpx
from a2a.types import AgentCard as CardProto
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify
from google.protobuf import json_format

from reach_platform.errors import Conflict, InvalidInput
from registry.audit import audit
from registry.choices import ACTIONS, Transport
from registry.models import Agent, AgentCard, AllowlistEntry, Capability, Environment, Team

CARD_TIMEOUT_S = 10.0
CARD_MAX_BYTES = 1_000_000


def guard_url(url: str) -> None:
    """The address guard for every URL taken from a card: the agents' guard (reach_platform.netguard; no
    metadata or link-local address ever, non-public networks only when listed in REACH_AGENT_ALLOWED_NETWORKS)."""
    from registry.services import check_agent_url

    try:
        check_agent_url(url, what="card URL")
    except InvalidInput as exc:
        raise InvalidInput(exc.message, code="card_url_refused") from exc


def card_location(url: str) -> str:
    """The card URL for an agent's base URL (or the card URL itself)."""
    url = url.strip()
    if url.endswith(".json"):
        return url
    return url.rstrip("/") + AGENT_CARD_WELL_KNOWN_PATH


def card_fetch(url: str) -> dict:
    """GET a card through the address guard; a card that does not parse as an A2A v1.0 AgentCard is refused."""
    location = card_location(url)
    guard_url(location)
    try:
        response = httpx.get(location, timeout=CARD_TIMEOUT_S, follow_redirects=False,
                             headers={"Accept": "application/json", "A2A-Version": "1.0"})
    except httpx.HTTPError as exc:
        raise InvalidInput(f"Could not fetch the agent card at {location}: {exc}", code="card_unreachable") from exc
    if response.status_code != 200:
        raise InvalidInput(f"{location} answered {response.status_code}, not an agent card.", code="card_unreachable")
    if len(response.content) > CARD_MAX_BYTES:
        raise InvalidInput(f"The agent card at {location} is larger than {CARD_MAX_BYTES} bytes.", code="card_invalid")
    try:
        raw = response.json()
        card = json_format.ParseDict(raw, CardProto(), ignore_unknown_fields=True)
    except (ValueError, json_format.ParseError) as exc:
        raise InvalidInput(f"{location} is not an A2A agent card: {exc}", code="card_invalid") from exc
    if not card.name or not rpc_interface(raw):
        raise InvalidInput(f"The agent card at {location} names no agent or no JSON-RPC interface.",
                           code="card_invalid")
    return raw


def rpc_interface(card: dict) -> str:
    """The URL of the card's JSON-RPC 1.0 interface ("" when it declares none)."""
    for interface in card.get("supportedInterfaces") or []:
        if interface.get("protocolBinding") == "JSONRPC" and str(interface.get("protocolVersion", "1.0")) >= "1.0":
            return interface.get("url", "")
    return ""


def skills_digest(card: dict) -> str:
    skills = sorted((s.get("id", ""), s.get("name", ""), s.get("description", "")) for s in card.get("skills") or [])
    return hashlib.sha256(json.dumps(skills).encode()).hexdigest()


def _action_for(skill: dict) -> str:
    """An action from the preset list named by the skill (id, name, tags), else "query": a reviewer corrects the
    draft before it is submitted."""
    words = set(re.split(r"[^a-z]+", " ".join([skill.get("id", ""), skill.get("name", ""),
                                                *skill.get("tags", [])]).lower()))
    return next((a for a in ACTIONS if a in words), "query")


def endpoint_id_for(card: dict) -> str:
    return slugify(card["name"])[:100] or "a2a-agent"


@transaction.atomic
def agent_card_import(*, url: str, team: str, environment: str, actor=None, actor_label: str = "",
                      card: dict | None = None) -> AgentCard:
    """Create an agent from its A2A card: the agent, its allowlist entry, an ``a2a`` instance at the card's JSON-RPC
    URL, one DRAFT capability version per skill, and the card as registered. ``actor`` (when given) must be able
    to edit ``team``."""
    from registry.permissions import ensure_can_edit_team
    from registry.services import agent_register, capability_version_draft_create

    card = card if card is not None else card_fetch(url)
    rpc_url = rpc_interface(card)
    guard_url(rpc_url)
    env = Environment.objects.filter(name=environment).first()
    if env is None:
        raise InvalidInput(f"Unknown environment '{environment}'.", code="unknown_environment")
    team_obj, _ = Team.objects.get_or_create(slug=team, defaults={"name": team})
    if actor is not None:
        ensure_can_edit_team(actor, team_obj.pk, f"team '{team}'")
    label = actor_label or (actor.get_username() if getattr(actor, "is_authenticated", False) else "reach_import_card")
    endpoint_id = endpoint_id_for(card)
    if Agent.objects.filter(endpoint_id=endpoint_id).exists():
        raise Conflict(f"Agent '{endpoint_id}' exists already; its card is not imported twice.", code="agent_exists")
    skills = card.get("skills") or []
    taken = list(Capability.objects.filter(name__in=[s.get("id") or s.get("name") for s in skills])
                 .values_list("name", flat=True))
    if taken:
        raise Conflict(f"Capabilities {', '.join(sorted(taken))} belong to other agents.", code="capability_exists")
    agent = Agent.objects.create(endpoint_id=endpoint_id, team=team_obj, environment=env,
                                 display_name=card["name"][:200], description=card.get("description", ""))
    audit(action="agent.created", target=agent, actor=actor, actor_label=label,
          after={"source": "a2a_card", "card_url": card_location(url)})
    entry, created = AllowlistEntry.objects.get_or_create(environment=env, endpoint_id=endpoint_id,
                                                          defaults={"team": team_obj})
    if created:
        audit(action="allowlist.created", target=entry, actor=actor, actor_label=label,
              after={"endpoint_id": endpoint_id, "environment": environment, "source": "a2a_card"})
    parts = urlparse(rpc_url)
    agent_register(entry=entry, endpoint_id=endpoint_id, environment=environment,
                   instance_id=f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}",
                   url=rpc_url, transport=Transport.A2A, reg_version=1, started_at=timezone.now(),
                   display_name=card["name"][:200])
    default_in = card.get("defaultInputModes") or []
    default_out = card.get("defaultOutputModes") or []
    for skill in skills:
        name = (skill.get("id") or skill.get("name"))[:120]
        capability = Capability.objects.create(name=name, agent=agent)
        capability_version_draft_create(
            capability=capability, actor=actor, version=str(card.get("version") or "1.0.0")[:40], team_check=False,
            description=skill.get("description", "") or skill.get("name", ""), action=_action_for(skill),
            tags=[t[:60] for t in skill.get("tags") or []], examples=list(skill.get("examples") or []),
            input_modes=list(skill.get("inputModes") or default_in),
            output_modes=list(skill.get("outputModes") or default_out))
    record = AgentCard.objects.create(agent=agent, card_url=card_location(url), card=card, name=card["name"],
                                      rpc_url=rpc_url, skills_digest=skills_digest(card),
                                      last_checked_at=timezone.now())
    audit(action="a2a_card.registered", target=record, actor=actor, actor_label=label,
          after={"name": card["name"], "rpc_url": rpc_url, "skills": [s.get("id") for s in skills]})
    return record


def card_differences(record: AgentCard, served: dict) -> list[str]:
    """How a served card departs from the registered one (name, JSON-RPC URL, skills)."""
    changes = []
    if served.get("name") != record.name:
        changes.append(f"name '{record.name}' -> '{served.get('name')}'")
    if rpc_interface(served) != record.rpc_url:
        changes.append(f"JSON-RPC URL {record.rpc_url} -> {rpc_interface(served) or 'none'}")
    if skills_digest(served) != record.skills_digest:
        before = sorted(s.get("id", "") for s in record.card.get("skills") or [])
        after = sorted(s.get("id", "") for s in served.get("skills") or [])
        changes.append(f"skills {before} -> {after}" if before != after else "skill names or descriptions changed")
    return changes


@transaction.atomic
def agent_card_check(*, record: AgentCard, served: dict | None = None, actor=None) -> AgentCard:
    """Fetch the card again and compare it with the registered one. A change flags the record (with an audit row
    and what was served); nothing registered follows it. An unreachable card is not a change."""
    if served is None:
        served = card_fetch(record.card_url)
    record = AgentCard.objects.select_for_update().get(pk=record.pk)
    record.last_checked_at = timezone.now()
    changes = card_differences(record, served)
    if changes and (not record.flagged or record.served_card != served):
        record.flagged = True
        record.flag_reason = "; ".join(changes)
        record.served_card = served
        audit(action="a2a_card.changed", target=record, actor=actor, actor_label="" if actor else "card check",
              before={"name": record.name, "rpc_url": record.rpc_url}, after={"changes": changes})
    record.save()
    return record
