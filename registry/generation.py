"""A Redis token renewed by every registry change that routing caches depend on.

A random token rather than a counter: a counter restarting after a Redis flush could land on a value a process
already cached and leave it on a stale snapshot."""

from __future__ import annotations

import uuid

import redis
from django.conf import settings
from django.db import transaction

GENERATION_KEY = "reach:registry:generation"
_client: redis.Redis | None = None


def redis_client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    return _client


def bump_generation() -> None:
    """Renew the token once the current transaction commits (at once outside one): a process that rebuilt its
    snapshot from the old rows in between would otherwise keep the stale snapshot until the next change."""
    transaction.on_commit(lambda: redis_client().set(GENERATION_KEY, uuid.uuid4().hex))


TOOLS_CHANNEL = "reach:registry:versions-changed"


def announce_versions_changed() -> None:
    """Tell every gateway node, once the current transaction commits, that the set of ACTIVE capability versions
    changed (an activation, a retirement, a promotion, a rollback): the MCP server tells its clients that the
    tool list changed (routing.mcp_server)."""
    transaction.on_commit(lambda: redis_client().publish(TOOLS_CHANNEL, "changed"))
