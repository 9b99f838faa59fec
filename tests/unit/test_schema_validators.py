"""The invoke path's schema validators (routing.schemas): the compiled fast check only ever confirms what
jsonschema says, on seeded random instances against schemas of every kind it takes, and leaves the others to
jsonschema."""

from __future__ import annotations

import random

import pytest
from jsonschema import Draft202012Validator

from routing.schemas import Validator, validator_for

PLAIN = [
    {"type": "object", "properties": {"order_id": {"type": "string", "minLength": 1, "maxLength": 8}},
     "required": ["order_id"], "additionalProperties": False},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "exclusiveMaximum": 10},
                                      "tags": {"type": "array", "items": {"enum": ["a", "b", 1]}, "maxItems": 2}}},
    {"anyOf": [{"type": "string"}, {"type": "number", "maximum": 1.5}], "not": {"const": 0}},
    {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "null"}], "minItems": 1},
    {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 2}]},
]
NOT_PLAIN = [
    {"type": "string", "pattern": "^[0-9]+$"},
    {"type": "number", "multipleOf": 0.1},
    {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
    {"type": "string", "format": "email"},
    {"$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/a"},
]


def _value(rng: random.Random, depth: int = 0):
    kinds = ["str", "int", "float", "bool", "null"] + (["list", "dict"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "str":
        return rng.choice(["", "a", "b", "12345", "123456789", "é✓", "x" * 3])
    if kind == "int":
        return rng.choice([0, 1, -1, 2, 9, 10, 11, 10**30])
    if kind == "float":
        return rng.choice([0.0, 1.0, 1.5, 1.6, 2.0, 0.3, -0.5])
    if kind == "bool":
        return rng.choice([True, False])
    if kind == "null":
        return None
    if kind == "list":
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    keys = ["order_id", "n", "tags", "x1", "other"]
    return {rng.choice(keys): _value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


@pytest.mark.parametrize("schema", PLAIN + NOT_PLAIN)
def test_verdicts_and_messages_are_jsonschemas(schema):
    rng = random.Random(7)
    reference = Draft202012Validator(schema)
    ours = Validator(schema)
    valid_seen = invalid_seen = 0
    for _ in range(3000):
        instance = _value(rng)
        expected = reference.is_valid(instance)
        valid_seen += expected
        invalid_seen += not expected
        assert ours.is_valid(instance) is expected, instance
        assert [e.message for e in ours.iter_errors(instance)] == [e.message for e in reference.iter_errors(instance)]
    assert valid_seen and invalid_seen  # the instances test both verdicts


def test_fast_check_only_where_the_libraries_agree():
    assert all(Validator(schema).fast is not None for schema in PLAIN)
    assert all(Validator(schema).fast is None for schema in NOT_PLAIN)
    # a value JSON has no type for is left to jsonschema, which treats it as it always has
    assert validator_for({"type": "object"}).is_valid(object()) is False

