"""The address guard (issue 12, items 7 and 8): one module for callbacks and agent URLs; DNS is resolved once,
checked, and the connection goes to the checked address; loopback only when configured."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from reach_platform import netguard
from reach_platform.errors import InvalidInput
from tests.helpers import BASE, free_port

LOOPBACK = ["127.0.0.0/8", "::1/128"]


@pytest.fixture
def server():
    """A local HTTP server that records the Host header of every request and answers ``status``."""
    seen: list[str] = []
    state = {"status": 200, "location": ""}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            return

        def _answer(self):
            seen.append(self.headers["Host"])
            self.send_response(state["status"])
            if state["location"]:
                self.send_header("Location", state["location"])
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        do_GET = do_POST = _answer

    httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1], seen, state
    httpd.shutdown()


@pytest.fixture
def rebinding_dns(monkeypatch):
    """DNS outside the product: 'rebind.test' answers 127.0.0.1 once, then the metadata address."""
    real = socket.getaddrinfo
    answers = {"rebind.test": ["127.0.0.1"]}

    def fake(host, port, *args, **kwargs):
        if host == "rebind.test":
            address = answers["rebind.test"].pop(0) if answers["rebind.test"] else "169.254.169.254"
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return answers


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/", "http://[fe80::1]/", "http://metadata.google.internal/",
    "http://0.0.0.0:8000/", "http://10.0.0.5/", "http://[::ffff:169.254.169.254]/", "ftp://example.com/",
    "http://example.com:99999/", "http://" + "a" * 64 + ".example/",
])
def test_internal_and_malformed_urls_are_refused(url):
    with pytest.raises(InvalidInput):
        netguard.check_url(url, LOOPBACK)


def test_loopback_needs_to_be_listed():
    with pytest.raises(InvalidInput, match="non-public"):
        netguard.check_url("http://127.0.0.1:8000/admin/login/", [])
    assert netguard.check_url("http://127.0.0.1:8000/x", LOOPBACK).address == "127.0.0.1"


def test_the_connection_goes_to_the_checked_address_with_the_original_host(server, rebinding_dns):
    port, seen, _ = server
    response = netguard.request("POST", f"http://rebind.test:{port}/hook", allowed_networks=LOOPBACK,
                                content=b"{}", timeout=5)
    assert response.status_code == 200
    assert seen == [f"rebind.test:{port}"]  # one resolution: a second one would have given 169.254.169.254
    with pytest.raises(InvalidInput, match="link-local"):  # the next request checks again, and refuses
        netguard.request("GET", f"http://rebind.test:{port}/hook", allowed_networks=LOOPBACK, timeout=5)


def test_pinned_keeps_sni_and_host_for_https():
    checked = netguard.CheckedURL(url="https://hooks.example.com/a?b=1", scheme="https", host="hooks.example.com",
                                  port=443, address="93.184.216.34")
    args = netguard.pinned(checked, {"X-A": "1"})
    assert args["url"] == "https://93.184.216.34/a?b=1"
    assert args["headers"] == {"X-A": "1", "Host": "hooks.example.com"}
    assert args["extensions"] == {"sni_hostname": "hooks.example.com"}


def test_async_request_is_pinned_too(server, rebinding_dns):
    port, seen, _ = server

    async def call():
        async with httpx.AsyncClient() as client:
            return await netguard.arequest("GET", f"http://rebind.test:{port}/", allowed_networks=LOOPBACK,
                                           client=client, timeout=5)

    with ThreadPoolExecutor(1) as pool:  # a loop of its own, whatever the test process runs
        assert pool.submit(asyncio.run, call()).result().status_code == 200
    assert seen == [f"rebind.test:{port}"]


def test_redirects_are_not_followed(server):
    port, seen, state = server
    state.update(status=302, location="http://169.254.169.254/")
    assert netguard.request("GET", f"http://127.0.0.1:{port}/", allowed_networks=LOOPBACK).status_code == 302
    assert len(seen) == 1


@pytest.mark.django_db
def test_callback_delivery_rechecks_and_pins_the_address(server, rebinding_dns, user):
    from routing.callbacks import check_callback_url, delivery_attempt
    from routing.models import CallbackDelivery, Task

    port, seen, _ = server
    url = f"http://rebind.test:{port}/hook"
    check_callback_url(url)  # at invoke: 127.0.0.1, allowed in test runs
    task = Task.objects.create(request_id="cb-rebind", caller=user, status="succeeded", callback_url=url)
    delivery = CallbackDelivery.objects.create(task=task, url=url, body={"request_id": "cb-rebind"})
    assert delivery_attempt(delivery.pk) is False  # the name now points at the metadata address
    delivery.refresh_from_db()
    assert "link-local" in delivery.last_error and seen == []


def test_loopback_is_not_allowed_because_debug_is_on():
    """Outside a test run, with DEBUG on and nothing configured, no private network is allowed."""
    from django.conf import settings

    env = {"PATH": "/usr/bin:/bin", "DEBUG": "true", "DJANGO_SETTINGS_MODULE": "reach_platform.settings",
           "DATABASE_URL": settings.DATABASE_URL, "REDIS_URL": settings.REDIS_URL, "PYTHONPATH": str(BASE)}
    code = ("import django; django.setup(); from django.conf import settings as s; import json; "
            "print(json.dumps([s.DEBUG, s.REACH['CALLBACK_ALLOWED_NETWORKS'], s.REACH['AGENT_ALLOWED_NETWORKS']]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=BASE, env=env, capture_output=True, text=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, [], []], out.stderr[-2000:]
