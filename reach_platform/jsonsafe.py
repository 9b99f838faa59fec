"""JSON request bodies that PostgreSQL can store and every renderer can write back, or a clear 4xx.

``parse_json`` is the one gate: DRF's default parser (``SafeJSONParser``) and any view that reads a raw body call
it. It refuses, before anything reaches a service or the database:
- a body over ``REACH_MAX_BODY_BYTES`` (413 ``payload_too_large``);
- bytes that are not UTF-8, text that is not JSON, ``NaN`` / ``Infinity`` / ``1e400`` (400 ``bad_json``);
- nesting deeper than ``MAX_DEPTH`` (400 ``too_deep``; deep JSON made the renderers and jsonschema recurse out);
- a NUL character (PostgreSQL ``jsonb`` and ``text`` cannot hold it) or a lone UTF-16 surrogate (``"\\ud800"``,
  which no UTF-8 encoder can write back), in any string or key (400 ``bad_characters``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import orjson
from django.conf import settings
from rest_framework.parsers import JSONParser

from reach_platform.errors import ApplicationError, InvalidInput

# Deeper than any descriptor, schema or payload we serve; far below the interpreter's recursion limit.
MAX_DEPTH = 64
_BAD_CHARS = re.compile("[\x00\ud800-\udfff]")


class PayloadTooLarge(ApplicationError):
    status_code = 413
    code = "payload_too_large"


def max_body_bytes() -> int:
    return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)


def _refuse_constant(name: str):
    raise InvalidInput(f"The request body is not valid JSON: {name} is not a JSON number.", code="bad_json")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: no JSON renderer can write it back
        raise InvalidInput("The request body holds a number out of the range of a double.", code="bad_json")
    return value


# One decoder for every body: ``json.loads`` with hooks builds a decoder (and its scanner) per call, 1.3 % of a
# gateway process's CPU (bench/slow_agents.py under py-spy)
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def dumps(value: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """Compact UTF-8 JSON, as ``json.dumps(value, default=default, ensure_ascii=False, separators=(",", ":"))``
    writes it, by orjson (a C encoder: the invoke path writes its rows, the agent's request and the caller's answer
    with it, where the json module's encoder was 5 % of a gateway process's CPU). What orjson refuses and the json
    module writes (an integer beyond 64 bits) is written by the json module."""
    try:
        return orjson.dumps(value, default=default, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:
        return json.dumps(value, default=default, ensure_ascii=False, separators=(",", ":")).encode()


def check_value(value: Any, *, max_depth: int = MAX_DEPTH, where: str = "body") -> None:
    """Walk a decoded JSON value (iteratively): depth, NUL characters and lone surrogates in strings and keys."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if _BAD_CHARS.search(item):
                raise InvalidInput(f"The {where} contains a NUL character or a lone surrogate (\\u0000, "
                                   "\\ud800-\\udfff), which cannot be stored.", code="bad_characters")
            continue
        if isinstance(item, dict | list):
            if depth > max_depth:
                raise InvalidInput(f"The {where} nests deeper than {max_depth} levels.", code="too_deep")
            children = item.items() if isinstance(item, dict) else ((None, v) for v in item)
            for key, child in children:
                if key is not None:
                    stack.append((key, depth))
                stack.append((child, depth + 1))


def parse_json(raw: bytes, *, max_bytes: int | None = None, max_depth: int = MAX_DEPTH) -> Any:
    """Decode a JSON body, or raise a 4xx ApplicationError (see the module docstring)."""
    limit = max_body_bytes() if max_bytes is None else max_bytes
    if len(raw) > limit:
        raise PayloadTooLarge(f"The request body is over the limit of {limit} bytes.",
                              details={"limit_bytes": limit})
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput("The request body is not valid UTF-8.", code="bad_json")
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise InvalidInput(f"The request body nests deeper than {max_depth} levels.", code="too_deep")
    except ValueError as exc:  # JSONDecodeError; the message gives only a position, never the content
        raise InvalidInput(f"The request body is not valid JSON: {exc}", code="bad_json")
    check_value(value, max_depth=max_depth)
    return value


def read_limited(stream, content_length: int | None, *, max_bytes: int | None = None) -> bytes:
    """Read a request body, refusing (413) as soon as it is known to be over the limit."""
    limit = max_body_bytes() if max_bytes is None else max_bytes
    if content_length is not None and content_length > limit:
        raise PayloadTooLarge(f"The request body is over the limit of {limit} bytes.",
                              details={"limit_bytes": limit})
    raw = stream.read(limit + 1)
    if len(raw) > limit:
        raise PayloadTooLarge(f"The request body is over the limit of {limit} bytes.",
                              details={"limit_bytes": limit})
    return raw


def clean_form_json(form, names) -> None:
    """The same checks for the JSON fields of an admin form: a form error instead of a database error."""
    for name in names:
        if name in form.cleaned_data:
            try:
                check_value(form.cleaned_data[name], where=name)
            except ApplicationError as exc:
                form.add_error(name, exc.message)


class SafeJSONParser(JSONParser):
    """DRF's JSON parser, through ``parse_json``. The default (and only) parser of the API."""

    def parse(self, stream, media_type=None, parser_context=None):
        if stream is None:
            return {}
        request = (parser_context or {}).get("request")
        length = None
        if request is not None:
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0) or None
            except ValueError:
                length = None
        return parse_json(read_limited(stream, length))
