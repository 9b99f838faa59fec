"""Capability descriptors as YAML (one file per agent) and their import.

File layout (see ``examples/descriptors/``)::

    agent: {endpoint_id, team, environment, display_name?, description?}
    server: {...}            # read only by the example agent server, ignored here
    capabilities:
      - name: order.query     # unique across the registry
        version: "1.0.0"
        action: query         # from registry.choices.ACTIONS
        description, domains, tags, keywords, languages,
        examples (>= 10), negative_cases (>= 1), reject_conditions (JSON Schemas),
        input_schema, output_schema, idempotent, confidence_weight,
        runtime: {timeout_ms, max_retries, avg_latency_ms, p95_latency_ms, avg_tokens_per_call, cost_per_call,
                  model, price_per_1k_input_tokens, price_per_1k_output_tokens}
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml
from django.db import transaction
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from reach_platform.errors import Conflict
from registry.audit import audit_row, audit_rows_write
from registry.choices import ACTIONS, VersionState
from registry.models import Agent, AllowlistEntry, Capability, CapabilityVersion, Environment, Team

MIN_EXAMPLES = 10
MIN_NEGATIVES = 1
RUNTIME_FIELDS = {
    "timeout_ms": int, "max_retries": int, "avg_latency_ms": float, "p95_latency_ms": float,
    "avg_tokens_per_call": int, "cost_per_call": Decimal, "price_per_1k_input_tokens": Decimal,
    "price_per_1k_output_tokens": Decimal, "model": str,
}


@dataclass
class DescriptorError:
    file: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.message}"


@dataclass
class ParsedDescriptor:
    path: str
    agent: dict[str, Any]
    capabilities: list[dict[str, Any]] = field(default_factory=list)


def _remote_refs(schema) -> list[str]:
    """``$ref`` / ``$dynamicRef`` values that point outside the schema (they would be fetched, or fail, at
    invoke time)."""
    found, stack = [], [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key in ("$ref", "$dynamicRef") and isinstance(value, str) and not value.startswith("#"):
                    found.append(value)
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _one_schema_problem(schema) -> str | None:
    if not isinstance(schema, dict):
        return "must be a JSON Schema object"
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return f"is not a valid JSON Schema: {exc.message}"
    remote = _remote_refs(schema)
    if remote:
        return f"refers outside itself ({remote[0]}); only local references (#...) are allowed"
    return None


def schema_problems(input_schema, output_schema, reject_conditions) -> list[tuple[str, str]]:
    """(field, problem) for the schemas of a capability version: the input and output schemas and every reject
    condition must be JSON Schemas (draft 2020-12) with local references only. Shared by the import and by
    submission, so that nothing that would fail at invoke time gets as far as review."""
    problems = []
    for where, schema in (("input_schema", input_schema or {}), ("output_schema", output_schema or {})):
        problem = _one_schema_problem(schema)
        if problem:
            problems.append((where, problem))
    if not isinstance(reject_conditions, list):
        problems.append(("reject_conditions", "must be a list of JSON Schemas"))
        return problems
    for i, schema in enumerate(reject_conditions):
        problem = _one_schema_problem(schema)
        if problem:
            problems.append((f"reject_conditions[{i}]", problem))
    return problems

def validate_capability(cap: Any, where: str, errors: list[DescriptorError], file: str) -> dict | None:
    """Check one capability descriptor; append errors (with the field path) and return the cleaned dict."""
    def err(fld: str, msg: str) -> None:
        errors.append(DescriptorError(file, f"{where}.{fld}" if fld else where, msg))

    if not isinstance(cap, dict):
        err("", "must be a mapping")
        return None
    before = len(errors)
    name = cap.get("name")
    if not isinstance(name, str) or not name.strip():
        err("name", "is required (e.g. 'order.query')")
    version = cap.get("version")
    if version is None or not str(version).strip():
        err("version", "is required (e.g. '1.0.0')")
    action = cap.get("action")
    if action not in ACTIONS:
        err("action", f"'{action}' is not in the preset list: {', '.join(ACTIONS)}")
    for list_field in ("domains", "tags", "keywords", "languages"):
        value = cap.get(list_field, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            err(list_field, "must be a list of strings")
    examples = cap.get("examples")
    if not isinstance(examples, list) or not all(isinstance(e, str) and e.strip() for e in examples):
        err("examples", "must be a list of non-empty strings")
    elif len(set(examples)) < MIN_EXAMPLES:
        err("examples", f"needs at least {MIN_EXAMPLES} distinct example requests, found {len(set(examples))}")
    negatives = cap.get("negative_cases")
    if not isinstance(negatives, list) or not all(isinstance(e, str) and e.strip() for e in negatives):
        err("negative_cases", "must be a list of non-empty strings")
    elif len(negatives) < MIN_NEGATIVES:
        err("negative_cases", f"needs at least {MIN_NEGATIVES} negative case")
    for schema_field, problem in schema_problems(cap.get("input_schema", {}), cap.get("output_schema", {}),
                                                 cap.get("reject_conditions", [])):
        err(schema_field, problem)
    if "idempotent" in cap and not isinstance(cap["idempotent"], bool):
        err("idempotent", "must be true or false")
    weight = cap.get("confidence_weight", 1.0)
    if not isinstance(weight, int | float) or not 0 <= weight <= 1:
        err("confidence_weight", "must be a number between 0 and 1")
    runtime = cap.get("runtime", {}) or {}
    if not isinstance(runtime, dict):
        err("runtime", "must be a mapping")
        runtime = {}
    for key, value in runtime.items():
        kind = RUNTIME_FIELDS.get(key)
        if kind is None:
            err(f"runtime.{key}", f"unknown field; known: {', '.join(RUNTIME_FIELDS)}")
            continue
        try:
            converted = kind(value) if kind is not Decimal else Decimal(str(value))
            if kind is not str and converted < 0:
                raise ValueError
        except (ValueError, TypeError, InvalidOperation):
            err(f"runtime.{key}", f"must be a non-negative {kind.__name__}")
    return cap if len(errors) == before else None


def parse_file(path: Path, errors: list[DescriptorError]) -> ParsedDescriptor | None:
    file = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        errors.append(DescriptorError(file, "", f"cannot be read: {exc}"))
        return None
    except yaml.YAMLError as exc:
        errors.append(DescriptorError(file, "", f"is not valid YAML: {exc}"))
        return None
    if not isinstance(data, dict):
        errors.append(DescriptorError(file, "", "must be a mapping with 'agent' and 'capabilities'"))
        return None
    before = len(errors)
    agent = data.get("agent")
    if not isinstance(agent, dict):
        errors.append(DescriptorError(file, "agent", "is required (endpoint_id, team, environment)"))
        agent = {}
    for key in ("endpoint_id", "team", "environment"):
        if not isinstance(agent.get(key), str) or not agent.get(key):
            errors.append(DescriptorError(file, f"agent.{key}", "is required"))
    env = agent.get("environment")
    if isinstance(env, str) and env and not Environment.objects.filter(name=env).exists():
        known = ", ".join(Environment.objects.values_list("name", flat=True))
        errors.append(DescriptorError(file, "agent.environment", f"unknown environment '{env}' (known: {known})"))
    caps = data.get("capabilities")
    if not isinstance(caps, list) or not caps:
        errors.append(DescriptorError(file, "capabilities", "must be a non-empty list"))
        caps = []
    cleaned = []
    for i, cap in enumerate(caps):
        ok = validate_capability(cap, f"capabilities[{i}]", errors, file)
        if ok is not None:
            cleaned.append(ok)
    if len(errors) > before:
        return None
    return ParsedDescriptor(path=file, agent=agent, capabilities=cleaned)


def descriptor_digest(cap: dict) -> str:
    return hashlib.sha256(json.dumps(cap, sort_keys=True, default=str).encode()).hexdigest()


def version_fields(cap: dict) -> dict[str, Any]:
    runtime = cap.get("runtime", {}) or {}
    return dict(
        description=cap.get("description", "") or "",
        action=cap["action"],
        domains=cap.get("domains", []),
        tags=cap.get("tags", []),
        keywords=cap.get("keywords", []),
        languages=cap.get("languages", []),
        examples=cap["examples"],
        negative_cases=cap["negative_cases"],
        reject_conditions=cap.get("reject_conditions", []),
        input_schema=cap.get("input_schema", {}) or {},
        output_schema=cap.get("output_schema", {}) or {},
        idempotent=cap.get("idempotent", True),
        confidence_weight=float(cap.get("confidence_weight", 1.0)),
        timeout_ms=int(runtime.get("timeout_ms", 30000)),
        max_retries=int(runtime.get("max_retries", 2)),
        avg_latency_ms=float(runtime.get("avg_latency_ms", 0)),
        p95_latency_ms=float(runtime.get("p95_latency_ms", 0)),
        avg_tokens_per_call=int(runtime.get("avg_tokens_per_call", 0)),
        cost_per_call=Decimal(str(runtime.get("cost_per_call", 0))),
        price_per_1k_input_tokens=Decimal(str(runtime.get("price_per_1k_input_tokens", 0))),
        price_per_1k_output_tokens=Decimal(str(runtime.get("price_per_1k_output_tokens", 0))),
        model_name=str(runtime.get("model", "")),
    )


@dataclass
class ImportResult:
    created: list[CapabilityVersion] = field(default_factory=list)
    unchanged: list[CapabilityVersion] = field(default_factory=list)
    activated: list[CapabilityVersion] = field(default_factory=list)


@transaction.atomic
def descriptors_import(*, parsed: list[ParsedDescriptor], activate: bool = False, actor=None,
                       progress=None) -> ImportResult:
    """Import parsed descriptors. Idempotent: the same version with the same content is a no-op; a new version is a
    new row; the same version with other content is refused (versions are immutable: bump the version).

    In bulk: the rows that exist are read in a few queries, the new teams, agents, allowlist entries, capabilities,
    versions and their audit rows are written with ``bulk_create``, and activation goes through
    ``capability_versions_activate`` (one lock, one update, embedding in batches). Registering 10,000 capabilities
    is a few dozen statements, not a dozen per capability (issue 15 item 5)."""
    from registry.services import capability_versions_activate

    result = ImportResult()
    audits: list = []
    specs = [desc.agent for desc in parsed]
    envs = {e.name: e for e in Environment.objects.filter(name__in={s["environment"] for s in specs})}
    teams = {t.slug: t for t in Team.objects.filter(slug__in={s["team"] for s in specs})}
    new_teams = [Team(slug=slug, name=slug) for slug in dict.fromkeys(s["team"] for s in specs) if slug not in teams]
    teams.update({t.slug: t for t in Team.objects.bulk_create(new_teams)})

    # agents: existing ones must belong to the descriptor's team and environment
    agents = {a.endpoint_id: a for a in Agent.objects.select_related("team", "environment").filter(
        endpoint_id__in={s["endpoint_id"] for s in specs})}
    new_agents: dict[str, tuple[Agent, str]] = {}
    for desc in parsed:
        spec = desc.agent
        env, team = envs[spec["environment"]], teams[spec["team"]]
        agent = agents.get(spec["endpoint_id"])
        if agent is None:
            agent = Agent(endpoint_id=spec["endpoint_id"], team=team, environment=env,
                          display_name=spec.get("display_name", spec["endpoint_id"]),
                          description=spec.get("description", ""))
            agents[agent.endpoint_id] = agent
            new_agents[agent.endpoint_id] = (agent, desc.path)
        elif agent.environment_id != env.pk or agent.team_id != team.pk:
            raise Conflict(f"{desc.path}: agent.endpoint_id: '{agent.endpoint_id}' already belongs to "
                           f"{agent.team.slug}/{agent.environment.name}")
    Agent.objects.bulk_create([agent for agent, _ in new_agents.values()], batch_size=1000)
    audits += [audit_row(action="agent.created", target=agent, actor=actor, after={"source": path})
               for agent, path in new_agents.values()]

    # allowlist entries (environment, endpoint id): created with the descriptor's team when missing
    wanted = {(envs[s["environment"]].pk, s["endpoint_id"]): teams[s["team"]] for s in reversed(specs)}
    have = set(AllowlistEntry.objects.filter(endpoint_id__in={e for _, e in wanted}).values_list(
        "environment_id", "endpoint_id"))
    AllowlistEntry.objects.bulk_create([AllowlistEntry(environment_id=env_id, endpoint_id=endpoint, team=team)
                                        for (env_id, endpoint), team in wanted.items() if (env_id, endpoint) not in have],
                                       batch_size=1000)

    # capabilities: a name belongs to one agent
    names = {cap["name"] for desc in parsed for cap in desc.capabilities}
    capabilities = {c.name: c for c in Capability.objects.select_related("agent").filter(name__in=names)}
    new_capabilities = []
    for desc in parsed:
        agent = agents[desc.agent["endpoint_id"]]
        for cap in desc.capabilities:
            capability = capabilities.get(cap["name"])
            if capability is None:
                capability = capabilities[cap["name"]] = Capability(name=cap["name"], agent=agent)
                new_capabilities.append(capability)
            elif capability.agent_id != agent.pk:
                raise Conflict(f"{desc.path}: capabilities.name: '{cap['name']}' belongs to agent "
                               f"'{capability.agent.endpoint_id}'")
    Capability.objects.bulk_create(new_capabilities, batch_size=1000)

    # versions: the same (capability, version) with the same content is unchanged, with other content refused
    versions = {(v.capability_id, v.version): v for v in CapabilityVersion.objects.select_related("capability").filter(
        capability_id__in=[c.pk for c in capabilities.values()], version__in={str(cap["version"]) for desc in parsed
                                                                           for cap in desc.capabilities})}
    submitted_by = actor if getattr(actor, "is_authenticated", False) else None
    to_activate: list[CapabilityVersion] = []
    activating: set[tuple[int, str]] = set()
    new_versions: list[tuple[CapabilityVersion, str]] = []
    for desc in parsed:
        for cap in desc.capabilities:
            capability = capabilities[cap["name"]]
            digest = descriptor_digest(cap)
            version = versions.get((capability.pk, str(cap["version"])))
            if version is not None:
                if version.source_digest != digest:
                    raise Conflict(f"{desc.path}: capabilities[{cap['name']}].version: version {cap['version']} "
                                   "already exists with other content; bump the version")
                result.unchanged.append(version)
                key = (capability.pk, version.version)
                if activate and version.state in (VersionState.DRAFT, VersionState.SUBMITTED, VersionState.APPROVED) \
                        and key not in activating:
                    activating.add(key)
                    to_activate.append(version)
            else:
                version = CapabilityVersion(capability=capability, version=str(cap["version"]), source_digest=digest,
                                            submitted_by=submitted_by, **version_fields(cap))
                versions[(capability.pk, version.version)] = version
                new_versions.append((version, desc.path))
                if activate:
                    activating.add((capability.pk, version.version))
                    to_activate.append(version)
            if progress:
                progress()
    CapabilityVersion.objects.bulk_create([v for v, _ in new_versions], batch_size=500)
    result.created = [v for v, _ in new_versions]
    audits += [audit_row(action="version.imported", target=v, actor=actor, after={"source": path})
               for v, path in new_versions]
    audit_rows_write(audits)
    if to_activate:
        result.activated = capability_versions_activate(versions=to_activate, actor=actor,
                                                        actor_label="reach_import --activate")
    return result
