"""Caller token authentication with a short in-process cache: the invoke path is hot, and a token lookup is a
database round trip per request. A revoked or deactivated token stops working within TOKEN_CACHE_SECONDS."""

from __future__ import annotations

import time

from rest_framework.authentication import TokenAuthentication

TOKEN_CACHE_SECONDS = 10.0
_cache: dict[str, tuple[float, object, object]] = {}


class CachedTokenAuthentication(TokenAuthentication):
    def authenticate_credentials(self, key):
        hit = _cache.get(key)
        now = time.monotonic()
        if hit is not None and now - hit[0] < TOKEN_CACHE_SECONDS:
            return hit[1], hit[2]
        user, token = super().authenticate_credentials(key)
        if len(_cache) > 10000:
            _cache.clear()
        _cache[key] = (now, user, token)
        return user, token
