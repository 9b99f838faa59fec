"""The web tier's process group: uvicorn's supervisor, each worker process listening on a socket of its own.

``python -m reach_platform.webserver --host H --port P --workers N`` (``reach_platform.serving.web_command`` builds
the line). uvicorn's ``--workers`` binds one socket in the parent and shares it: every worker accepts from one
queue, and the kernel wakes the most recently idle one first, so a burst of new connections lands mostly on one
process (measured with ``bench/slow_agents.py`` at 1,024 callers: one process at 75-95 % of a core, the other at
15-40 %; which one changed from run to run, and the ratio with it, 0.67 to 0.85). Here each worker binds its own
``SO_REUSEPORT`` socket on the same address, and the kernel spreads connections over the workers by their
addresses' hash. Restarts, signals and health checks stay uvicorn's (``uvicorn.supervisors.Multiprocess``); the
parent holds no socket of its own (it would take a share of the connections and never accept them).

Without ``SO_REUSEPORT`` (not Linux) or with one worker, this is plain uvicorn.
"""

from __future__ import annotations

import argparse
import socket
import sys

import uvicorn
from uvicorn.supervisors import multiprocess

APP = "reach_platform.asgi:application"


def reuse_port_socket(config: uvicorn.Config) -> socket.socket:
    """A listening-ready TCP socket on the config's address that shares the port with the other workers."""
    family = socket.AF_INET6 if config.host and ":" in config.host else socket.AF_INET
    sock = socket.socket(family=family, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((config.host, config.port))
    sock.set_inheritable(True)
    return sock


class ReusePortProcess(multiprocess.Process):
    """One worker of the group: binds its own socket when it starts (in the child), then serves as uvicorn does."""

    def target(self, sockets=None) -> None:  # pragma: no cover - runs in the worker process
        super().target([reuse_port_socket(self.config)])


class ReusePortSupervisor(multiprocess.Multiprocess):
    """uvicorn's supervisor, its worker processes built as ``ReusePortProcess``: it names ``Process`` at each
    (re)start, so the name is swapped while it runs (only in this, the supervising process)."""

    def run(self) -> None:
        original = multiprocess.Process
        setattr(multiprocess, "Process", ReusePortProcess)  # noqa: B010 (a module attribute swapped on purpose)
        try:
            super().run()
        finally:
            setattr(multiprocess, "Process", original)  # noqa: B010


def options(argv: list[str] | None = None) -> dict:
    """The server's settings from the command line, as ``uvicorn.Config`` (and ``uvicorn.run``) take them."""
    parser = argparse.ArgumentParser(prog="python -m reach_platform.webserver", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--backlog", type=int, default=4096)
    parser.add_argument("--timeout-keep-alive", type=int, default=30)
    parser.add_argument("--log-level", default="warning")
    return {**vars(parser.parse_args(argv)), "loop": "uvloop", "http": "httptools", "lifespan": "on",
            "access_log": False}


def main(argv: list[str] | None = None) -> None:
    settings = options(argv)
    config = uvicorn.Config(APP, **settings)
    if config.workers <= 1 or not hasattr(socket, "SO_REUSEPORT") or config.port == 0:
        # one process, or no per-process sockets here (port 0 would give each worker a port of its own)
        uvicorn.run(APP, **settings)
        return
    try:  # fail at once, with the reason, if another program holds the address (each worker would fail and restart)
        reuse_port_socket(config).close()
    except OSError as exc:
        sys.exit(f"reach_platform.webserver: cannot listen on {config.host}:{config.port}: {exc}")
    try:
        ReusePortSupervisor(config, sockets=[]).run()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
