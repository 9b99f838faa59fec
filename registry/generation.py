"""A Redis counter bumped by every registry change that routing caches depend on."""

from __future__ import annotations

import redis
from django.conf import settings

GENERATION_KEY = "reach:registry:generation"
_client: redis.Redis | None = None


def redis_client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    return _client


def bump_generation() -> None:
    redis_client().incr(GENERATION_KEY)
