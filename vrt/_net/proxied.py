"""Who a connection is from when it comes through a proxy the server trusts
(``trusted_proxies``): the client's address, for the per-peer limits and the logs.

A proxy's word is taken only on a connection from one of the trusted networks: anyone else
could send the same headers and be counted as anyone. Two ways to say it:

- ``X-Forwarded-For``: each proxy appends the address it got the request from, so the
  chain is read from the right, and the first address that is not a trusted proxy is the
  client (whatever is left of it, the client wrote itself). :func:`forwarded_client`.
- The PROXY protocol, version 2 (HAProxy's ``send-proxy-v2``): a binary header before
  the first byte of TLS or HTTP, carrying the client's address and port. Sans-IO here
  (:func:`parse_proxy_header`: bytes in, a header, a count of bytes still needed, or an
  error out); :func:`read_proxy_header` pumps it off a stream, reading no byte past it,
  and gives back what it read when the connection does not start with one. The caller
  bounds it in time (the handshake deadline); :data:`PROXY_HEADER_LIMIT` in bytes.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable

import attrs
import trio

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Networks = tuple[Network, ...]

MAX_HOPS = 32
"""The rightmost entries of ``X-Forwarded-For`` looked at (past them: the last one read)."""
PROXY_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
"""The 12 bytes a PROXY protocol v2 header starts with."""
PROXY_HEADER_LIMIT = 16 + 1024
"""The largest PROXY v2 header taken (bytes): its addresses (at most 216 bytes) and the
TLVs HAProxy adds (ALPN, authority, a unique id, TLS details: a few hundred at most)."""


# -- trusted networks ----------------------------------------------------------------------------


def networks(name: str, value: object) -> Networks:
    """``value`` (None; a string of CIDRs separated by commas; or a collection of such
    strings or of ``ipaddress`` networks) as networks; ValueError naming option ``name``."""
    if value is None:
        return ()
    items: Iterable[object] = [value] if isinstance(value, str) else _iterable(name, value)
    found: list[Network] = []
    for item in items:
        if isinstance(item, ipaddress.IPv4Network | ipaddress.IPv6Network):
            found.append(item)
            continue
        if not isinstance(item, str):
            raise ValueError(f"{name}: expected a network as CIDR text, not {item!r}")
        for text in item.split(","):
            try:
                found.append(ipaddress.ip_network(text.strip()))
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
    return tuple(dict.fromkeys(found))


def _iterable(name: str, value: object) -> Iterable[object]:
    if not isinstance(value, Collection):
        raise ValueError(f"{name} must be a list of networks (CIDR), not {value!r}")
    return value


def read_networks(text: str) -> str:
    """A flag's text (CIDRs separated by commas), checked: ValueError saying which one is
    not a network. The text is kept as given; :func:`networks` reads it."""
    networks("expected CIDR networks", text)
    return text


def ip_of(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``text`` as an IP address (an IPv4-mapped IPv6 address as its IPv4 one), or None."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def trusts(trusted: Networks, host: str) -> bool:
    """Whether ``host`` (an IP address's text) is in one of the ``trusted`` networks."""
    if not trusted:
        return False
    ip = ip_of(host)
    return ip is not None and any(ip in network for network in trusted)


def address_key(host: str) -> str:
    """Who a connection from ``host`` counts as in a per-peer limit: its IP address, or
    for IPv6 its /64 network (what one host is usually given)."""
    ip = ip_of(host)
    if ip is None:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


# -- X-Forwarded-For -----------------------------------------------------------------------------


def forwarded_client(peer: str, headers: Iterable[tuple[str, str]], trusted: Networks) -> str:
    """The client of a request from ``peer`` (an IP address) with ``headers`` (names
    lower-case): ``peer`` itself unless it is a trusted proxy; else, reading
    ``X-Forwarded-For`` from the right, the first address that is not a trusted proxy
    (or the last one read, when every one is, or the next is not an address)."""
    if not trusts(trusted, peer):
        return peer
    hops: list[str] = []
    for key, value in headers:
        if key == "x-forwarded-for":
            hops.extend(value.split(","))
    client = peer
    for hop in reversed(hops[-MAX_HOPS:]):
        ip = _hop(hop)
        if ip is None:
            break  # not an address: the trusted hop on its right is all that is known
        client = ip
        if not trusts(trusted, ip):
            break
    return client


def _hop(text: str) -> str | None:
    """One entry of ``X-Forwarded-For`` as an IP address's text: ``1.2.3.4``,
    ``1.2.3.4:5678``, ``2001:db8::1`` or ``[2001:db8::1]:443``; None if it is none."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    ip = ip_of(text)
    return None if ip is None else str(ip)


# -- PROXY protocol v2 ---------------------------------------------------------------------------


class ProxyHeaderError(ValueError):
    """A PROXY header that is malformed, too long, or cut short: the connection is dropped."""


@attrs.frozen
class ProxyHeader:
    """What a PROXY v2 header said: the client's address and port, or None for both when
    it names none (``LOCAL``: the proxy's own connection, a health check; or an address
    family other than TCP over IPv4 or IPv6): the connection's own address stands."""

    host: str | None
    port: int = 0


def parse_proxy_header(data: bytes) -> ProxyHeader | int | None:
    """Read a PROXY v2 header at the start of ``data``: None if ``data`` does not start
    like one (judged on the bytes there are); the number of bytes the whole header takes
    when ``data`` holds less; else the header (``data`` may hold the whole header only).
    :class:`ProxyHeaderError` if it is malformed or longer than
    :data:`PROXY_HEADER_LIMIT`."""
    head = data[:12]
    if PROXY_SIGNATURE[: len(head)] != head:
        return None
    if len(data) < 16:
        return 16
    version, command = data[12] >> 4, data[12] & 0x0F
    if version != 2 or command > 1:
        raise ProxyHeaderError(f"version {version} command {command}: not PROXY v2")
    size = 16 + int.from_bytes(data[14:16], "big")
    if size > PROXY_HEADER_LIMIT:
        raise ProxyHeaderError(f"a header of {size} bytes (at most {PROXY_HEADER_LIMIT})")
    if len(data) < size:
        return size
    if command == 0:  # LOCAL: the proxy's own connection
        return ProxyHeader(None)
    family, transport = data[13] >> 4, data[13] & 0x0F
    body = data[16:size]
    if transport == 1 and family == 1:  # TCP over IPv4
        if len(body) < 12:
            raise ProxyHeaderError("an IPv4 header too short for its addresses")
        host = str(ipaddress.IPv4Address(body[0:4]))
        return ProxyHeader(host, int.from_bytes(body[8:10], "big"))
    if transport == 1 and family == 2:  # TCP over IPv6
        if len(body) < 36:
            raise ProxyHeaderError("an IPv6 header too short for its addresses")
        ip = ipaddress.IPv6Address(body[0:16])
        shown = ip.ipv4_mapped if ip.ipv4_mapped is not None else ip
        return ProxyHeader(str(shown), int.from_bytes(body[32:34], "big"))
    return ProxyHeader(None)  # UNSPEC, UNIX, datagrams: nothing to count by


async def read_proxy_header(stream: trio.abc.ReceiveStream) -> tuple[ProxyHeader | None, bytes]:
    """Read a PROXY v2 header off ``stream``, and not a byte past it: the header and
    ``b""``; or None and the bytes read (at most 16) when the connection does not start
    with one, which the caller must read again. :class:`ProxyHeaderError` if the header is
    malformed or the peer leaves within it. Cancelled, whatever was read is lost."""
    data = b""
    while True:
        parsed = parse_proxy_header(data)
        if parsed is None:
            return None, data
        if isinstance(parsed, ProxyHeader):
            return parsed, b""
        try:
            chunk = await stream.receive_some(parsed - len(data))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            chunk = b""
        if not chunk:
            raise ProxyHeaderError(f"the connection ended after {len(data)} bytes of a header")
        data += chunk
