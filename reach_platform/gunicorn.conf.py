"""Gunicorn settings recommended for a 2-core machine (see README, "Serving"): sync invokes wait on agents, so
threads matter more than processes; two processes use both cores."""

import os

workers = int(os.environ.get("WEB_WORKERS", "2"))
worker_class = "gthread"
threads = int(os.environ.get("WEB_THREADS", "16"))
timeout = 120
keepalive = 30
accesslog = None


def post_worker_init(worker):
    """Load the embedding models before the first request, not during it (a few seconds with torch)."""
    import gc

    from registry.embedding import get_embedder

    get_embedder().encode(["warm up"])
    # The models' and Django's start-up objects live as long as the process: keep them out of every collection
    # (otherwise each full collection walks the whole torch/transformers heap).
    gc.freeze()
