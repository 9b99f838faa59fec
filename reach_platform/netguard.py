"""The address guard for every URL the platform calls on someone's word: callers' ``callback_url`` and agents'
``url`` / ``health_url`` / ``status_url`` (SSRF).

``check_url(url, allowed_networks)`` parses the URL (http/https, a host, a port in range, a host name that is
valid IDNA), resolves it once and refuses it when any address is link-local or a cloud metadata address (always),
or not public and outside ``allowed_networks``. It returns a ``CheckedURL`` pinned to the address that passed.

``pinned(checked, headers)`` gives the keyword arguments for an httpx request (``httpx.Client`` or
``httpx.AsyncClient``) that connects to that address, not to whatever the name resolves to a moment later (DNS
rebinding), while the server still sees the original ``Host`` header and, for https, the original name in SNI and
in the certificate check. Redirects must not be followed (a redirect is an unchecked URL).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

from reach_platform.errors import InvalidInput

# Always refused, whatever the configuration: link-local (cloud metadata lives there), "this network" and the
# metadata host names.
ALWAYS_REFUSED = [ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"),
                  ipaddress.ip_network("fd00:ec2::254/128"), ipaddress.ip_network("0.0.0.0/8"),
                  ipaddress.ip_network("::/128")]
METADATA_HOSTS = {"metadata.google.internal", "metadata", "instance-data", "metadata.azure.internal"}
DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class CheckedURL:
    url: str  # as given
    scheme: str
    host: str  # ASCII (IDNA) host name or address literal, lower case, no brackets
    port: int
    address: str  # the resolved address that passed the guard


def networks(specs: Iterable[str]) -> list:
    return [ipaddress.ip_network(s.strip(), strict=False) for s in specs if s and s.strip()]


def parse_url(url: str, *, what: str = "url", code: str = "url_refused") -> tuple[str, str, int]:
    """(scheme, ASCII host, port) of an http(s) URL, without resolving it; InvalidInput when it has none."""
    try:
        parts = urlsplit(url)
        port = parts.port
        host = parts.hostname
    except ValueError as exc:  # a port over 65535, a bad IPv6 literal
        raise InvalidInput(f"{what} is not a valid URL: {exc}.", code=code)
    if parts.scheme not in DEFAULT_PORTS or not host:
        raise InvalidInput(f"{what} must be an http(s) URL with a host.", code=code)
    if port == 0:
        raise InvalidInput(f"{what} has port 0.", code=code)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise InvalidInput(f"{what} has a host name that is not valid IDNA.", code=code)
    return parts.scheme, host.lower(), port or DEFAULT_PORTS[parts.scheme]


def refusal(address, allowed: list) -> str | None:
    """Why ``address`` may not be called, or None."""
    if address.version == 6 and address.ipv4_mapped:
        address = address.ipv4_mapped
    if any(address in net for net in ALWAYS_REFUSED):
        return f"link-local/metadata address {address}"
    if any(address in net for net in allowed if net.version == address.version):
        return None
    if not address.is_global:
        return f"non-public address {address}"
    return None


def check_url(url: str, allowed_networks: Iterable, *, what: str = "url", code: str = "url_refused",
              setting: str = "") -> CheckedURL:
    """Resolve once and check every address (see the module docstring). ``allowed_networks``: networks or
    strings such as ``10.0.0.0/8``; ``setting`` names the setting that lists them, for the error message."""
    allowed = [n if not isinstance(n, str) else ipaddress.ip_network(n, strict=False) for n in allowed_networks]
    scheme, host, port = parse_url(url, what=what, code=code)
    if host in METADATA_HOSTS:
        raise InvalidInput(f"{what} host '{host}' is a metadata service.", code=code)
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        raise InvalidInput(f"{what} host '{host}' does not resolve.", code=code)
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    for address in addresses:
        why = refusal(address, allowed)
        if why:
            hint = f"; allow its network in {setting} to use it" if setting and "non-public" in why else ""
            raise InvalidInput(f"{what} resolves to {why}{hint}.", code=code)
    return CheckedURL(url=url, scheme=scheme, host=host, port=port, address=str(addresses[0]))


def pinned(checked: CheckedURL, headers: Mapping[str, str] | None = None) -> dict:
    """``url``, ``headers`` and ``extensions`` for ``client.request(method, **pinned(...))``: the connection goes
    to ``checked.address``; Host, SNI and the certificate check use the original host name."""
    parts = urlsplit(checked.url)
    literal = f"[{checked.address}]" if ":" in checked.address else checked.address
    netloc = literal if checked.port == DEFAULT_PORTS[checked.scheme] else f"{literal}:{checked.port}"
    host_header = f"[{checked.host}]" if ":" in checked.host else checked.host
    if checked.port != DEFAULT_PORTS[checked.scheme]:
        host_header += f":{checked.port}"
    extensions = {"sni_hostname": checked.host} if checked.scheme == "https" else {}
    return {"url": urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, "")),
            "headers": {**(headers or {}), "Host": host_header}, "extensions": extensions}


def request(method: str, url: str, *, allowed_networks: Iterable, client: httpx.Client | None = None,
            headers: Mapping[str, str] | None = None, what: str = "url", setting: str = "",
            **kwargs) -> httpx.Response:
    """Check ``url`` and make one request to the checked address (sync; never follows redirects). Raises
    InvalidInput when the address is refused, httpx errors as usual."""
    checked = check_url(url, allowed_networks, what=what, setting=setting)
    if client is None:
        with httpx.Client(follow_redirects=False) as own:
            return own.request(method, **pinned(checked, headers), follow_redirects=False, **kwargs)
    return client.request(method, **pinned(checked, headers), follow_redirects=False, **kwargs)


async def arequest(method: str, url: str, *, allowed_networks: Iterable, client: httpx.AsyncClient,
                   headers: Mapping[str, str] | None = None, what: str = "url", setting: str = "",
                   **kwargs) -> httpx.Response:
    """The same on an ``httpx.AsyncClient``. DNS resolution runs in a thread (getaddrinfo blocks)."""
    checked = await asyncio.to_thread(check_url, url, allowed_networks, what=what, setting=setting)
    return await client.request(method, **pinned(checked, headers), follow_redirects=False, **kwargs)


async def apost(url: str, *, allowed_networks: Iterable, body: bytes, headers: Mapping[str, str], timeout: float,
                what: str = "url", setting: str = "") -> int:
    """Check ``url`` and POST ``body`` to the checked address on the engine loop's aiohttp session (a tenth of
    httpx's CPU per call: ``engine.post_json``): the same pinning as ``pinned`` (Host header, and the original
    name for TLS). Resolution runs in a thread unless the host is an address. Returns the status; raises
    InvalidInput when refused, ``engine.CallTimeout`` / ``engine.ConnectFailed`` when the call fails."""
    from reach_platform import engine

    if _is_address(url):
        checked = check_url(url, allowed_networks, what=what, setting=setting)
    else:
        checked = await asyncio.to_thread(check_url, url, allowed_networks, what=what, setting=setting)
    target = pinned(checked, headers)
    status, _ = await engine.post_json(target["url"], body, target["headers"], timeout=timeout,
                                       connect_timeout=min(timeout, 2.0),
                                       server_hostname=checked.host if checked.scheme == "https" else None)
    return status


def _is_address(url: str) -> bool:
    try:
        ipaddress.ip_address((urlsplit(url).hostname or "").split("%")[0])
    except ValueError:
        return False
    return True
