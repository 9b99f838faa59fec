"""Compiled JSON Schema validators, built once per distinct schema (they sit on the invoke path)."""

from __future__ import annotations

import functools
import json

from jsonschema import Draft202012Validator


@functools.lru_cache(maxsize=4096)
def _compiled(key: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads(key))


def validator_for(schema: dict) -> Draft202012Validator:
    return _compiled(json.dumps(schema, sort_keys=True))
