"""Compiled JSON Schema validators, built once per distinct schema (they sit on the invoke path)."""

from __future__ import annotations

import functools
import json

from jsonschema import Draft202012Validator

_IDENTITY_MAX = 4096
# validators by the schema object's identity: the routing snapshot hands the same dicts to every request, and
# writing a schema out as a cache key (json.dumps, sorted) cost more than validating a small payload against it.
# The entry holds the schema itself, so its id cannot be reused while it is cached, and compares a copy of it, so
# a schema changed in place gets a validator of its own.
_by_identity: dict[int, tuple[dict, dict, Draft202012Validator]] = {}


@functools.lru_cache(maxsize=4096)
def _compiled(key: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads(key))


def validator_for(schema: dict) -> Draft202012Validator:
    hit = _by_identity.get(id(schema))
    if hit is not None and hit[0] is schema and hit[1] == schema:
        return hit[2]
    validator = _compiled(json.dumps(schema, sort_keys=True))
    if len(_by_identity) >= _IDENTITY_MAX:
        _by_identity.clear()
    _by_identity[id(schema)] = (schema, json.loads(json.dumps(schema)), validator)
    return validator
