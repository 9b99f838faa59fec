"""Writes to the registry: agent self-registration, heartbeats, liveness, allowlisting and version lifecycle."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db import models, transaction
from django.db.models import F
from django.utils import timezone

from reach_platform import netguard
from reach_platform.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from registry.audit import audit, audit_row, audit_rows_write, snapshot
from registry.choices import AgentStatus, Liveness, Transport, VersionState
from registry.descriptors import schema_problems
from registry.generation import announce_versions_changed, bump_generation
from registry.models import (
    Agent,
    AllowlistEntry,
    Capability,
    CapabilityVersion,
    Environment,
    Instance,
    Team,
    hash_key,
)
from registry.permissions import ensure_can_edit_team, is_admin

logger = logging.getLogger(__name__)

INSTANCE_AUDIT_FIELDS = ["url", "transport", "health_url", "weight", "max_concurrency", "max_qps",
                         "versions", "reg_version", "liveness"]


def allowlist_entry_for_key(raw_key: str) -> AllowlistEntry | None:
    if not raw_key:
        return None
    return (AllowlistEntry.objects.select_related("environment", "team")
            .filter(key_hash=hash_key(raw_key), enabled=True).first())


@transaction.atomic
def allowlist_entry_issue(*, endpoint_id: str, environment: str, team: str, actor=None) -> tuple[AllowlistEntry, str]:
    """Allowlist ``endpoint_id`` in ``environment`` and issue (or rotate) its agent key. Returns the raw key."""
    env, _ = Environment.objects.get_or_create(name=environment)
    team_obj, _ = Team.objects.get_or_create(slug=team, defaults={"name": team})
    entry, created = AllowlistEntry.objects.get_or_create(
        environment=env, endpoint_id=endpoint_id, defaults={"team": team_obj}
    )
    if not created and entry.team_id != team_obj.pk:
        raise Conflict(f"'{endpoint_id}' is allowlisted in '{environment}' for team '{entry.team.slug}'.")
    raw = entry.issue_key()
    entry.enabled = True
    entry.save()
    audit(action="allowlist.key_issued" if created else "allowlist.key_rotated", target=entry, actor=actor,
          after={"endpoint_id": endpoint_id, "environment": environment, "key_prefix": entry.key_prefix})
    return entry, raw


@transaction.atomic
def agent_register(
    *,
    entry: AllowlistEntry,
    endpoint_id: str,
    environment: str,
    instance_id: str,
    url: str,
    transport: str = Transport.HTTP,
    health_url: str = "",
    status_url: str = "",
    weight: int = 100,
    max_concurrency: int = 16,
    max_qps: float = 100.0,
    reg_version: int,
    started_at: datetime | None = None,
    display_name: str = "",
    versions: list[str] | None = None,
) -> Instance:
    """Register (or re-register) one instance of an agent, enforcing the allowlist and environment rules.

    - the credential's allowlist entry must be for this endpoint id in this environment;
    - an agent registered in another environment is never overwritten (a dev agent must not take prod traffic);
    - a registration older than the stored one (``reg_version``) is refused;
    - when another instance of the agent holds the same address, the newer ``started_at`` wins (port drift).
    """
    for field, value in (("url", url), ("health_url", health_url), ("status_url", status_url)):
        if value:
            check_agent_url(value, what=field)
    if entry.endpoint_id != endpoint_id or entry.environment.name != environment:
        raise PermissionDenied(
            f"'{endpoint_id}' is not allowlisted for environment '{environment}' with this credential.",
            code="not_allowlisted",
        )
    agent = Agent.objects.select_for_update().filter(endpoint_id=endpoint_id).select_related("environment").first()
    if agent is None:
        agent = Agent.objects.create(endpoint_id=endpoint_id, team=entry.team, environment=entry.environment,
                                     display_name=display_name or endpoint_id)
        audit(action="agent.created", target=agent, actor_label=f"agent:{endpoint_id}",
              after=snapshot(agent, ["endpoint_id", "team", "environment"]))
    elif agent.environment_id != entry.environment_id:
        raise Conflict(
            f"Agent '{endpoint_id}' is registered in environment '{agent.environment.name}'; a registration from "
            f"'{environment}' may not overwrite it.",
            code="environment_conflict",
        )
    if agent.status == AgentStatus.DISABLED:
        raise PermissionDenied(f"Agent '{endpoint_id}' is disabled.", code="agent_disabled")

    # The same address may not be claimed across environments either.
    foreign = (Instance.objects.filter(url=url, deregistered_at__isnull=True)
               .exclude(agent__environment_id=agent.environment_id).select_related("agent__environment").first())
    if foreign is not None:
        raise Conflict(
            f"Address {url} is registered to '{foreign.agent.endpoint_id}' in environment "
            f"'{foreign.agent.environment.name}'.",
            code="environment_conflict",
        )

    now = timezone.now()
    instance = Instance.objects.select_for_update().filter(agent=agent, instance_id=instance_id).first()
    before = snapshot(instance, INSTANCE_AUDIT_FIELDS) if instance else None
    if instance is not None and reg_version < instance.reg_version:
        raise Conflict(
            f"reg_version {reg_version} is older than the registered {instance.reg_version}; refused.",
            code="stale_registration",
        )

    # Port drift: another instance of this agent still holds the address. The newer start wins.
    holders = list(Instance.objects.select_for_update().filter(agent=agent, url=url, deregistered_at__isnull=True)
                   .exclude(instance_id=instance_id))
    for holder in holders:
        if started_at and holder.started_at and holder.started_at > started_at:
            raise Conflict(
                f"Address {url} is held by instance '{holder.instance_id}' started later ({holder.started_at:%Y-%m-%dT%H:%M:%S}).",
                code="stale_registration",
            )
        holder.deregistered_at = now
        holder.liveness = Liveness.OFFLINE
        holder.save(update_fields=["deregistered_at", "liveness"])
        audit(action="instance.replaced", target=holder, actor_label=f"agent:{endpoint_id}",
              before={"url": url, "instance_id": holder.instance_id}, after={"replaced_by": instance_id})

    fields: dict[str, Any] = dict(url=url, transport=transport, health_url=health_url, status_url=status_url, weight=weight,
                  versions=sorted(set(versions or [])),
                  max_concurrency=max_concurrency, max_qps=max_qps, reg_version=reg_version, started_at=started_at,
                  last_heartbeat_at=now, last_seen_at=now, liveness=Liveness.ONLINE, suspect_since=None,
                  deregistered_at=None)
    if instance is None:
        instance = Instance.objects.create(agent=agent, instance_id=instance_id, **fields)
    else:
        for key, value in fields.items():
            setattr(instance, key, value)
        instance.save()
    audit(action="instance.registered", target=instance, actor_label=f"agent:{endpoint_id}", before=before,
          after=snapshot(instance, INSTANCE_AUDIT_FIELDS))
    return instance


def _own_instance(entry: AllowlistEntry, instance_id: str) -> Instance:
    instance = (Instance.objects.select_related("agent")
                .filter(agent__endpoint_id=entry.endpoint_id, agent__environment_id=entry.environment_id,
                        instance_id=instance_id).first())
    if instance is None:
        raise NotFound(f"No instance '{instance_id}' registered for '{entry.endpoint_id}'. Register first.")
    return instance


def agent_heartbeat(*, entry: AllowlistEntry, instance_id: str, in_flight: int = 0, load: float = 0.0) -> Instance:
    """Record a heartbeat. Cheap on purpose: one UPDATE, plus an audit row only when liveness changes."""
    instance = _own_instance(entry, instance_id)
    if instance.deregistered_at is not None:
        raise Conflict(f"Instance '{instance_id}' is deregistered; register again.", code="deregistered")
    now = timezone.now()
    Instance.objects.filter(pk=instance.pk).update(
        last_heartbeat_at=now, last_seen_at=now, in_flight=in_flight, load=load,
        liveness=Liveness.ONLINE, suspect_since=None,
    )
    if instance.liveness != Liveness.ONLINE:
        bump_generation()
        audit(action="instance.liveness", target=instance, actor_label=f"agent:{entry.endpoint_id}",
              before={"liveness": instance.liveness}, after={"liveness": Liveness.ONLINE, "reason": "heartbeat"})
    instance.liveness = Liveness.ONLINE
    instance.in_flight, instance.load, instance.last_heartbeat_at = in_flight, load, now
    return instance


@transaction.atomic
def agent_deregister(*, entry: AllowlistEntry, instance_id: str) -> Instance:
    instance = _own_instance(entry, instance_id)
    before = snapshot(instance, INSTANCE_AUDIT_FIELDS)
    instance.deregistered_at = timezone.now()
    instance.liveness = Liveness.OFFLINE
    instance.save(update_fields=["deregistered_at", "liveness"])
    audit(action="instance.deregistered", target=instance, actor_label=f"agent:{entry.endpoint_id}", before=before,
          after=snapshot(instance, INSTANCE_AUDIT_FIELDS))
    return instance


# --- liveness --------------------------------------------------------------------------------------------

def _reach(name: str) -> float:
    return float(settings.REACH[name])


def _set_liveness(instance: Instance, new: str, reason: str, **extra) -> None:
    old = instance.liveness
    updated = Instance.objects.filter(pk=instance.pk, liveness=old).update(liveness=new, **extra)
    if updated:
        bump_generation()
        audit(action="instance.liveness", target=instance, actor_label="system:liveness",
              before={"liveness": old}, after={"liveness": new, "reason": reason})
        logger.info("instance liveness changed", extra={"instance": str(instance), "from": old, "to": new,
                                                        "reason": reason})


def liveness_sweep(*, now: datetime | None = None) -> dict[str, int]:
    """ONLINE -> SUSPECT after SUSPECT_AFTER_S without a heartbeat or good probe. SUSPECT -> OFFLINE when it stays
    silent and its probes keep failing for OFFLINE_AFTER_S more. Returns the ids that need a probe."""
    now = now or timezone.now()
    suspect_cutoff = now - timedelta(seconds=_reach("SUSPECT_AFTER_S"))
    changed = {"suspect": 0, "offline": 0}
    live = Instance.objects.filter(deregistered_at__isnull=True)
    for instance in live.filter(liveness=Liveness.ONLINE, last_seen_at__lt=suspect_cutoff):
        _set_liveness(instance, Liveness.SUSPECT, "no heartbeat", suspect_since=now)
        changed["suspect"] += 1
    offline_cutoff = now - timedelta(seconds=_reach("OFFLINE_AFTER_S"))
    # Probes run in their own task; only a failing probe made after the instance turned SUSPECT counts.
    for instance in live.filter(liveness=Liveness.SUSPECT, suspect_since__lt=offline_cutoff,
                                last_probe_ok=False, last_probe_at__gte=F("suspect_since")):
        _set_liveness(instance, Liveness.OFFLINE, "heartbeat and probes failing")
        changed["offline"] += 1
    return changed


def instances_to_probe(*, now: datetime | None = None) -> list[int]:
    """Instances whose liveness is in doubt (SUSPECT, or OFFLINE: a good probe brings one back) and whose last probe
    is older than PROBE_INTERVAL_S."""
    now = now or timezone.now()
    due = now - timedelta(seconds=_reach("PROBE_INTERVAL_S"))
    return list(Instance.objects.filter(deregistered_at__isnull=True,
                                        liveness__in=[Liveness.SUSPECT, Liveness.OFFLINE])
                .filter(models.Q(last_probe_at__isnull=True) | models.Q(last_probe_at__lt=due)
                        | models.Q(last_probe_at__lt=F("suspect_since")))
                .exclude(health_url="").values_list("pk", flat=True))


def instance_probe_record(*, instance_id: int, ok: bool, now: datetime | None = None) -> Instance:
    """Record a probe result: a success brings the instance ONLINE at once; failures count toward OFFLINE."""
    now = now or timezone.now()
    instance = Instance.objects.select_related("agent").get(pk=instance_id)
    if ok:
        Instance.objects.filter(pk=instance.pk).update(last_probe_at=now, last_probe_ok=True, last_seen_at=now)
        if instance.liveness != Liveness.ONLINE:
            _set_liveness(instance, Liveness.ONLINE, "probe ok", suspect_since=None)
    else:
        Instance.objects.filter(pk=instance.pk).update(last_probe_at=now, last_probe_ok=False)
        instance.last_probe_ok = False
        if (instance.liveness == Liveness.SUSPECT and instance.suspect_since
                and (now - instance.suspect_since).total_seconds() >= _reach("OFFLINE_AFTER_S")):
            _set_liveness(instance, Liveness.OFFLINE, "heartbeat and probes failing")
    instance.refresh_from_db()
    return instance


AGENT_ALLOWED_SETTING = "REACH_AGENT_ALLOWED_NETWORKS"


def agent_networks() -> list:
    return netguard.networks(settings.REACH["AGENT_ALLOWED_NETWORKS"])


def check_agent_url(url: str, *, what: str = "url") -> netguard.CheckedURL:
    """The address guard for the URLs an agent registers (the gateway POSTs callers' payloads there and the
    prober GETs them): link-local/metadata never, non-public networks only when listed in the setting."""
    return netguard.check_url(url, agent_networks(), what=what, code="agent_url_refused",
                              setting=AGENT_ALLOWED_SETTING)


def probe_health(url: str) -> bool:
    """Healthy means a 2xx from the checked address: a redirect (to a login page, say) is not health."""
    try:
        response = netguard.request("GET", url, allowed_networks=agent_networks(), what="health_url",
                                    timeout=_reach("PROBE_TIMEOUT_S"))
        return 200 <= response.status_code < 300
    except (httpx.HTTPError, InvalidInput):
        return False


# --- version lifecycle (the review workflow in reviews/ builds on these) ------------------------------------

@transaction.atomic
def capability_version_activate(*, version: CapabilityVersion, actor=None, actor_label: str = "") -> CapabilityVersion:
    """Make a version ACTIVE (retiring the previous ACTIVE one unless this is a canary) and embed it."""
    return capability_versions_activate(versions=[version], actor=actor, actor_label=actor_label)[0]


EMBED_TASK_VERSIONS = 500  # versions per embedding task: the encoder batches their texts (registry.embedding_service)


@transaction.atomic
def capability_versions_activate(*, versions: list[CapabilityVersion], actor=None,
                                 actor_label: str = "") -> list[CapabilityVersion]:
    """Make versions ACTIVE in the order given, as if each were activated on its own (a later non-canary version of
    a capability retires the one before it), in a few statements: an import of thousands of versions locks, checks,
    updates and audits them in bulk, and embeds them in batches of ``EMBED_TASK_VERSIONS``."""
    ids = [v.pk for v in versions]
    locked = {v.pk: v for v in CapabilityVersion.objects.select_for_update().select_related("capability").filter(
        pk__in=ids)}
    capability_ids = {v.capability_id for v in locked.values()}
    # the ACTIVE version(s) per capability before this call, locked: they may be retired below
    active: dict[int, list[CapabilityVersion]] = {}
    for old in CapabilityVersion.objects.select_for_update().select_related("capability").filter(
            capability_id__in=capability_ids, state=VersionState.ACTIVE).order_by("pk"):
        active.setdefault(old.capability_id, []).append(locked.get(old.pk, old))
    now = timezone.now()
    rows, out = [], []
    checked: dict[str, list] = {}
    activated: set[int] = set()
    retired: set[int] = set()
    for pk in ids:
        version = locked[pk]
        if version.state not in (VersionState.APPROVED, VersionState.DRAFT, VersionState.SUBMITTED):
            raise InvalidInput(f"Version {version} is {version.state}; only an approved version can be activated.")
        schemas = json.dumps([version.input_schema, version.output_schema, version.reject_conditions], sort_keys=True)
        if schemas not in checked:  # an import's versions mostly share their schemas: each set is checked once
            checked[schemas] = schema_problems(version.input_schema, version.output_schema, version.reject_conditions)
        problems = checked[schemas]
        if problems:  # what routes must validate payloads without failing (admins may activate unreviewed drafts)
            raise InvalidInput(f"Version {version} has invalid schemas.", code="invalid_schema",
                               details=[f"{where} {problem}" for where, problem in problems])
        before = {"state": version.state}
        current = active.setdefault(version.capability_id, [])
        if not version.is_canary:
            for old in [v for v in current if v.pk != version.pk]:
                old.state = VersionState.RETIRED
                retired.add(old.pk)
                rows.append(audit_row(action="version.retired", target=old, actor=actor, actor_label=actor_label,
                                      before={"state": VersionState.ACTIVE}, after={"state": VersionState.RETIRED}))
            current[:] = [v for v in current if v.pk == version.pk]
        version.state = VersionState.ACTIVE
        version.activated_at = now
        current.append(version)
        activated.add(version.pk)
        retired.discard(version.pk)
        rows.append(audit_row(action="version.activated", target=version, actor=actor, actor_label=actor_label,
                              before=before, after={"state": VersionState.ACTIVE, "canary": version.is_canary}))
        out.append(version)
    # the final states in at most three statements (a version activated and retired by a later one in this call
    # keeps its activation time, as one call per version would have left it)
    rows_of = CapabilityVersion.objects.filter
    rows_of(pk__in=activated - retired).update(state=VersionState.ACTIVE, activated_at=now, updated_at=now)
    rows_of(pk__in=activated & retired).update(state=VersionState.RETIRED, activated_at=now, updated_at=now)
    rows_of(pk__in=retired - activated).update(state=VersionState.RETIRED, updated_at=now)
    for version in out:
        version.updated_at = now
    audit_rows_write(rows)
    bump_generation()  # update() sends no post_save: routing's snapshot must still see the new states
    for start in range(0, len(ids), EMBED_TASK_VERSIONS):
        transaction.on_commit(_embed_later(ids[start:start + EMBED_TASK_VERSIONS]))
    announce_versions_changed()  # MCP sessions hear that their tools changed (on commit)
    return out


def _embed_later(version_ids: list[int]):
    """The on-commit callback that enqueues the embedding of ``version_ids`` (one task for one version, as before)."""
    from registry.tasks import embed_capability_version, embed_capability_versions

    def enqueue() -> None:
        if len(version_ids) == 1:
            embed_capability_version.delay(version_ids[0])
        else:
            embed_capability_versions.delay(version_ids)

    return enqueue


# --- edits by people (object-level rules in registry.permissions) ---------------------------------------------

AGENT_EDITABLE = ("display_name", "description", "status")
# What a team writes in a capability version; the review workflow owns state, reviewer fields and weights.
DRAFT_FIELDS = ("description", "action", "domains", "tags", "keywords", "languages", "examples", "negative_cases",
                "reject_conditions", "input_schema", "output_schema", "input_modes", "output_modes", "idempotent", "timeout_ms", "max_retries",
                "avg_latency_ms", "p95_latency_ms", "avg_tokens_per_call", "cost_per_call",
                "price_per_1k_input_tokens", "price_per_1k_output_tokens", "model_name")


@transaction.atomic
def agent_update(*, agent: Agent, actor, **fields) -> Agent:
    """A member of the owning team (or an admin) changes an agent's description or status."""
    from registry.permissions import ensure_can_edit_team

    ensure_can_edit_team(actor, agent.team_id, f"agent '{agent.endpoint_id}'")
    unknown = set(fields) - set(AGENT_EDITABLE)
    if unknown:
        raise InvalidInput(f"These agent fields cannot be changed here: {', '.join(sorted(unknown))}.")
    agent = Agent.objects.select_for_update().get(pk=agent.pk)
    before = snapshot(agent, list(fields))
    for key, value in fields.items():
        setattr(agent, key, value)
    agent.save()
    audit(action="agent.changed", target=agent, actor=actor, before=before, after=snapshot(agent, list(fields)))
    bump_generation()
    return agent


def _next_version_label(capability) -> str:
    """1.2.0 -> 1.3.0 after the newest version; an unparsable label gets a '.next' suffix."""
    labels = list(capability.versions.values_list("version", flat=True))
    newest = capability.versions.order_by("-created_at").values_list("version", flat=True).first() or "0.0.0"
    parts = newest.split(".")
    candidate = f"{newest}.next"
    if len(parts) == 3 and all(p.isdigit() for p in parts):
        candidate = f"{parts[0]}.{int(parts[1]) + 1}.0"
    while candidate in labels:
        candidate += ".1"
    return candidate


@transaction.atomic
def capability_version_draft_create(*, capability, actor, version: str = "", base: CapabilityVersion | None = None,
                                    team_check: bool = True, **fields) -> CapabilityVersion:
    """A new DRAFT of a capability, copied from ``base`` (default: the ACTIVE stable version) with ``fields``
    changed. Only the owning team (or an admin) may draft; the draft routes nothing until it is reviewed.
    ``team_check=False`` is for callers that authorised the actor themselves (a reviewer promoting feedback)."""
    from registry.permissions import ensure_can_edit_team

    if team_check:
        ensure_can_edit_team(actor, capability.agent.team_id, f"capability '{capability.name}'")
    unknown = set(fields) - set(DRAFT_FIELDS)
    if unknown:
        raise InvalidInput(f"Unknown or protected version fields: {', '.join(sorted(unknown))}.")
    base = base or (capability.versions.filter(state=VersionState.ACTIVE, is_canary=False).first()
                    or capability.versions.order_by("-created_at").first())
    values = {name: getattr(base, name) for name in DRAFT_FIELDS} if base else {}
    values.update(fields)
    if "action" not in values:
        raise InvalidInput("A first version needs an action.")
    label = version or _next_version_label(capability)
    if capability.versions.filter(version=label).exists():
        raise Conflict(f"{capability.name}@{label} exists already.", code="version_exists")
    draft = CapabilityVersion.objects.create(capability=capability, version=label, state=VersionState.DRAFT,
                                             **values)
    audit(action="version.drafted", target=draft, actor=actor, before=None,
          after={"state": VersionState.DRAFT, "base": str(base) if base else None, "changed": sorted(fields)})
    return draft


@transaction.atomic
def capability_version_draft_update(*, version: CapabilityVersion, actor, **fields) -> CapabilityVersion:
    """Edit a DRAFT (or a REJECTED version, which goes back to DRAFT). Anything further along is immutable:
    a change to what routes goes through a new version and its review."""
    from registry.permissions import ensure_can_edit_team

    version = CapabilityVersion.objects.select_for_update().select_related("capability__agent").get(pk=version.pk)
    ensure_can_edit_team(actor, version.capability.agent.team_id, f"capability '{version.capability.name}'")
    if version.state not in (VersionState.DRAFT, VersionState.REJECTED):
        raise Conflict(f"{version} is {version.state}; only drafts can be edited. Create a new version instead.",
                       code="state_conflict")
    unknown = set(fields) - set(DRAFT_FIELDS)
    if unknown:
        raise InvalidInput(f"Unknown or protected version fields: {', '.join(sorted(unknown))}.")
    before = snapshot(version, [*fields, "state"])
    for key, value in fields.items():
        setattr(version, key, value)
    version.state = VersionState.DRAFT
    version.save()
    audit(action="version.edited", target=version, actor=actor, before=before,
          after=snapshot(version, [*fields, "state"]))
    return version


# --- callers -----------------------------------------------------------------------------------------------

@transaction.atomic
def caller_create(*, name: str, actor=None) -> tuple[object, str, bool]:
    """A caller: a user without admin access holding an API token. Returns (user, token key, created); an existing
    caller keeps its token (running this twice hands out the same one)."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    if not name or len(name) > 150:
        raise InvalidInput("A caller needs a name of 1 to 150 characters.", code="invalid_caller")
    user, created = get_user_model().objects.get_or_create(username=name, defaults={"is_staff": False})
    if user.is_staff or user.is_superuser:
        raise Conflict(f"'{name}' is a person with admin access, not a caller; pick another name.",
                       code="not_a_caller")
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    token, token_created = Token.objects.get_or_create(user=user)
    if created or token_created:
        audit(action="caller.created" if created else "caller.token_issued", target=user, actor=actor,
              after={"username": name, "token_prefix": token.key[:6]})
    return user, token.key, created


# --- onboarding: an agent end to end without YAML ----------------------------------------------------------

# Environments a team may allowlist its own agents in; prod is for admins.
TEAM_ONBOARDING_ENVIRONMENTS = ("dev", "staging")


@transaction.atomic
def agent_onboard(*, actor, endpoint_id: str, team: Team, environment: str, capability: str,
                  display_name: str = "", agent_description: str = "", **draft_fields) -> tuple[AllowlistEntry, str,
                                                                                             CapabilityVersion]:
    """Allowlist a new agent for its team, issue its key, create the agent and its first capability with a DRAFT
    1.0.0 (``draft_fields``: see DRAFT_FIELDS). Returns (entry, raw key, draft); the key is never stored."""
    ensure_can_edit_team(actor, team.pk, f"team '{team.slug}'")
    if environment not in TEAM_ONBOARDING_ENVIRONMENTS and not is_admin(actor):
        raise PermissionDenied(f"Only admins allowlist agents in '{environment}'.", code="admin_only")
    if Agent.objects.filter(endpoint_id=endpoint_id).exists():
        raise Conflict(f"An agent '{endpoint_id}' exists already.", code="agent_exists")
    if Capability.objects.filter(name=capability).exists():
        raise Conflict(f"A capability '{capability}' exists already; draft its next version instead.",
                       code="capability_exists")
    entry, raw = allowlist_entry_issue(endpoint_id=endpoint_id, environment=environment, team=team.slug,
                                       actor=actor)
    agent = Agent.objects.create(endpoint_id=endpoint_id, team=team, environment=entry.environment,
                                 display_name=display_name or endpoint_id, description=agent_description)
    audit(action="agent.created", target=agent, actor=actor,
          after=snapshot(agent, ["endpoint_id", "team", "environment", "display_name"]))
    cap = Capability.objects.create(agent=agent, name=capability)
    audit(action="capability.created", target=cap, actor=actor, after={"name": capability, "agent": endpoint_id})
    draft = capability_version_draft_create(capability=cap, actor=actor, version="1.0.0", **draft_fields)
    return entry, raw, draft
