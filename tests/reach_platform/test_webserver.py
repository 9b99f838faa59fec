"""The web tier's worker processes each listen on a socket of their own (reach_platform.webserver), so new
connections are spread over them instead of piling onto whichever process woke first."""

from __future__ import annotations

import socket

import httpx
import psutil
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.authtoken.models import Token

from reach_platform import webserver
from tests.helpers import GatewayProcess, free_port, subprocess_env, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _listeners(port: int) -> set[int]:
    return {c.pid for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid}


def _server_pid(port: int, client_port: int) -> int | None:
    for c in psutil.net_connections("tcp"):
        if c.laddr.port == port and c.raddr and c.raddr.port == client_port:
            return c.pid
    return None


def test_each_worker_listens_on_its_own_socket_and_takes_a_share_of_new_connections():
    node = GatewayProcess(workers=2).start()
    try:
        supervisor = node.proc.pid
        workers = wait_until(lambda: len(_listeners(node.port)) == 2, timeout=60, message="both workers to listen")
        workers = _listeners(node.port)
        assert supervisor not in workers  # the parent holds no socket that would take connections it never accepts

        clients, served_by = [], []
        try:
            for _ in range(40):  # connections opened one after another, as a burst of new callers does
                sock = socket.create_connection(("127.0.0.1", node.port))
                sock.sendall(b"GET /admin/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert sock.recv(12).startswith(b"HTTP/1.1 200")
                clients.append(sock)
                served_by.append(_server_pid(node.port, sock.getsockname()[1]))
        finally:
            for sock in clients:
                sock.close()
        assert set(served_by) == workers, served_by  # both workers serve (all 40 on one: odds 2**-39 if fair)
    finally:
        node.stop()


def test_an_address_another_program_holds_is_refused_with_the_reason(capsys):
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(SystemExit) as exit_:
            webserver.main(["--host", "127.0.0.1", "--port", str(port), "--workers", "2"])
    assert f"cannot listen on 127.0.0.1:{port}" in str(exit_.value.code)


def test_a_served_process_closes_the_database_connection_of_each_request_django_serves():
    """Django's ASGI handler runs a request's sync code in a thread and context of its own, so a connection kept
    open for reuse (CONN_MAX_AGE) was never reused: it stayed open until a garbage collection, and read-API calls
    and agents' heartbeats ran PostgreSQL out of connections ("too many clients"). The node's connections are
    told apart by their application_name."""
    url = subprocess_env()["DATABASE_URL"]
    name = f"reach-node-{free_port()}"
    node = GatewayProcess(DATABASE_URL=f"{url}{'&' if '?' in url else '?'}application_name={name}").start()
    token = Token.objects.create(user=get_user_model().objects.create_user("reader", is_superuser=True)).key

    def held() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name])
            return cursor.fetchone()[0]

    try:
        with httpx.Client(base_url=node.url, headers={"Authorization": f"Token {token}"}, timeout=30) as client:
            for _ in range(10):
                assert client.get("/api/v1/agents/").status_code == 200
            before = held()
            for _ in range(100):
                assert client.get("/api/v1/agents/").status_code == 200
            after = held()
        assert after <= before + 1, (before, after)  # one request's connection may still be closing
    finally:
        node.stop()
