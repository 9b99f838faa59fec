"""Compiled JSON Schema validators, built once per distinct schema (they sit on the invoke path).

A valid payload or output (the common case) is told apart by ``jsonschema_rs`` (a compiled validator: 0.6 against
24 us for a small object with ``jsonschema``), when the schema uses only keywords whose meaning the two libraries
share exactly (types, properties, bounds, combinators; not ``pattern``, ``format``, ``multipleOf`` or references,
where regex dialects, float arithmetic or resolution may differ). ``jsonschema`` decides everything else, and
writes every error message: what ``jsonschema_rs`` refuses, ``jsonschema`` checks again, so a disagreement can
only ever fall back to ``jsonschema``'s verdict.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator

import jsonschema_rs
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

# keywords whose validation jsonschema_rs and jsonschema agree on, and which of them hold subschemas
_PLAIN = {"type", "required", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
          "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "title", "description",
          "default", "examples", "$comment", "readOnly", "writeOnly", "deprecated"}
_SUBSCHEMA = {"items", "additionalProperties", "not"}
_SUBSCHEMAS = {"prefixItems", "anyOf", "oneOf", "allOf"}


def _plain(schema) -> bool:
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    for keyword, value in schema.items():
        if keyword in _PLAIN:
            continue
        if keyword == "properties":
            if not isinstance(value, dict) or not all(_plain(sub) for sub in value.values()):
                return False
        elif keyword in _SUBSCHEMA:
            if not _plain(value):
                return False
        elif keyword in _SUBSCHEMAS:
            if not isinstance(value, list) or not all(_plain(sub) for sub in value):
                return False
        else:
            return False
    return True


class Validator:
    """``is_valid`` and ``iter_errors`` as ``Draft202012Validator``'s, a valid instance told apart quickly."""

    __slots__ = ("full", "fast")

    def __init__(self, schema: dict) -> None:
        self.full = Draft202012Validator(schema)
        self.fast = None
        if _plain(schema):
            try:
                self.fast = jsonschema_rs.Draft202012Validator(schema)
            except Exception:  # a schema it will not compile: jsonschema alone
                pass

    def _surely_valid(self, instance) -> bool:
        if self.fast is None:
            return False
        try:
            return self.fast.is_valid(instance)
        except Exception:  # a value jsonschema_rs cannot take (a type JSON has not): jsonschema decides
            return False

    def is_valid(self, instance) -> bool:
        return self._surely_valid(instance) or self.full.is_valid(instance)

    def iter_errors(self, instance) -> Iterator[ValidationError]:
        return iter(()) if self._surely_valid(instance) else self.full.iter_errors(instance)

_IDENTITY_MAX = 4096
# validators by the schema object's identity: the routing snapshot hands the same dicts to every request, and
# writing a schema out as a cache key (json.dumps, sorted) cost more than validating a small payload against it.
# The entry holds the schema itself, so its id cannot be reused while it is cached, and compares a copy of it, so
# a schema changed in place gets a validator of its own.
_by_identity: dict[int, tuple[dict, dict, Validator]] = {}


@functools.lru_cache(maxsize=4096)
def _compiled(key: str) -> Validator:
    return Validator(json.loads(key))


def validator_for(schema: dict) -> Validator:
    hit = _by_identity.get(id(schema))
    if hit is not None and hit[0] is schema and hit[1] == schema:
        return hit[2]
    validator = _compiled(json.dumps(schema, sort_keys=True))
    if len(_by_identity) >= _IDENTITY_MAX:
        _by_identity.clear()
    _by_identity[id(schema)] = (schema, json.loads(json.dumps(schema)), validator)
    return validator
