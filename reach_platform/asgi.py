"""The ASGI application (served by uvicorn: see README "Serving").

Django's ASGI application serves everything (admin, read API, agents' registration and callbacks), except the
one hot path: ``POST /api/v1/invoke`` with a caller token goes to ``routing.api.fastlane``, which awaits the
agent call on this server's event loop instead of holding Django's per-process sync thread for seconds; and
``/mcp`` (the MCP server, ``routing.mcp_server``) is served on the loop the same way.
The server's loop becomes the engine loop of the process (``reach_platform.engine``).
"""

import asyncio
import contextlib
import logging
import os

from django.conf import settings
from django.core.asgi import get_asgi_application
from django.core.handlers.asgi import ASGIHandler
from django.core.signals import request_finished
from django.db import connections

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reach_platform.settings")
django_application = get_asgi_application()
logger = logging.getLogger(__name__)

from reach_platform import engine, serving  # noqa: E402  (after Django is set up)
from routing import a2a_front, mcp_server, snapshot  # noqa: E402
from routing.api import fastlane  # noqa: E402


def close_request_connections(**_) -> None:
    """Close the database connections of a request Django's ASGI handler served, as it ends.

    Under ASGI each request runs its sync code in a thread and context of its own, so a connection kept open for
    reuse (``CONN_MAX_AGE``) is never used again: it stayed open until the garbage collector found it, which in a
    serving process (``serving.tune_gc``) takes a long time when traffic is light. Heartbeats of six agents and
    read-API calls left a web process holding 60 and more connections within minutes, until PostgreSQL refused
    new ones ("too many clients"). Django's documentation: "When using ASGI, persistent connections should be
    disabled". Connected for Django's ASGI handler only: the invoke path's statements run on the loop's own pool
    and in the engine's database threads, whose connections stay open."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


request_finished.connect(close_request_connections, sender=ASGIHandler, dispatch_uid="reach-asgi-close-request")


def _warm_up() -> None:
    """Load the embedding models before the first request, not during it (a few seconds with torch), then keep
    the start-up heap out of every garbage collection (otherwise each full collection walks the torch heap) and
    collect less often (``serving.tune_gc``)."""
    import gc

    from registry.embedding import get_embedder

    if os.environ.get("REACH_WARM_UP", "1") != "0":
        get_embedder().encode(["warm up"])
    gc.collect()
    gc.freeze()
    serving.tune_gc()


async def _lifespan(receive, send) -> None:
    async with contextlib.AsyncExitStack() as stack:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                engine.bind(asyncio.get_running_loop())
                await asyncio.get_running_loop().run_in_executor(None, _warm_up)
                if settings.REACH["WARM_CONNECTIONS"]:
                    try:
                        await engine.warm_up()
                        await engine.db(snapshot.current)
                    except Exception:  # e.g. PostgreSQL not up yet: serve anyway, opening them on demand
                        logger.warning("warm-up failed; connections open on first use", exc_info=True)
                await stack.enter_async_context(mcp_server.running())  # the MCP session manager's task group
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await stack.aclose()
                await engine.close_clients()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def application(scope, receive, send):
    if scope["type"] == "lifespan":
        return await _lifespan(receive, send)
    if not engine.on_loop():
        engine.bind(asyncio.get_running_loop())
    if fastlane.wants(scope):
        return await fastlane.serve(scope, receive, send)
    if mcp_server.wants(scope):
        return await mcp_server.serve(scope, receive, send)
    if a2a_front.wants(scope):
        return await a2a_front.serve(scope, receive, send)
    return await django_application(scope, receive, send)
