"""What the OpenAPI schema says beyond the views' own annotations: the error answers every operation may give
(one error body, see reach_platform.errors) and the agent-key security scheme. The schema fuzzing test holds the
served API to it."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["code", "message"],
        "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "details": {}},
    }},
}
# Every API operation may answer these with the error body: bad input, no or wrong credentials, a role or team
# that may not, unknown ids, a method the path does not take, a state conflict, a body over the limit, a body
# that is not JSON, quotas (429) and budgets (402).
ERRORS = {
    "400": "Bad input (the error's code and details say what)",
    "401": "No or unknown credentials",
    "402": "Budget exhausted",
    "403": "The caller's role or team may not do this",
    "404": "Not found, or not readable by this caller",
    "405": "Method not allowed",
    "409": "Conflict with the current state",
    "413": "Request body over the size limit",
    "415": "Only application/json bodies are accepted",
    "429": "Over a quota; retry after Retry-After seconds",
}


def add_error_responses(result, generator, request, public):
    """drf-spectacular postprocessing hook: the error body and the error answers on every operation of the schema
    (the /api/v1 API and the A2A agents' push endpoint /a2a-push/...)."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    ref = {"$ref": "#/components/schemas/Error"}
    for _path, operations in result.get("paths", {}).items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            for status, description in ERRORS.items():
                responses.setdefault(status, {"description": description,
                                              "content": {"application/json": {"schema": ref}}})
    return result


class AgentKeyScheme(OpenApiAuthenticationExtension):
    """Agents authenticate with ``Authorization: Agent <key>`` (registry.authentication)."""

    target_class = "registry.authentication.AgentKeyAuthentication"
    name = "agentKey"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "An agent key issued per allowlist entry: `Agent <key>`."}
