"""Nodes prove they are nodes (:mod:`vrt._cluster.trust`): ``x-vrt-relay`` means something
only with its proof, the relay port serves proved relays and nothing else, over TLS with
the certificate the node's lease names, within the public port's pending bounds.

The proof and the lease's text as tables; then servers sharing a :class:`MemoryStore` on
loopback: an outsider's relay header during a drain (it used to get past the 503), the
relay port's refusals, its pending bound, relays between TLS nodes, a shared
``cluster_secret``. No test logs an ERROR (``no_errors``).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest
import trio
from trio_websocket import wrap_client_stream

import vrt
from tests import test_tls
from tests.conftest import Log, every_record, until
from tests.test_handover import ended, move, nodes, texts, via
from tests.test_hostile import UPGRADE, closed_by_server
from vrt._cluster.relay import Unreachable, relay
from vrt._cluster.store import MemoryStore
from vrt._cluster.trust import PROOF_WINDOW, Endpoint, Proven, Trust, cluster_secret
from vrt._net.tls import certificate_pin
from vrt._server.options import ServeOptions

pytestmark = [pytest.mark.network, pytest.mark.usefixtures("no_errors")]

HOST = "127.0.0.1"
SECRET = "correct horse battery staple"
NOW = 1_700_000_000.0


# -- the proof and the lease ---------------------------------------------------------------------


def _proof(trust: Trust, owner: Endpoint, **changes: Any) -> str | None:
    fields: dict[str, Any] = {
        "owner_name": "n0",
        "front": "n1",
        "session_id": "s_0123456789abcdef",
        "client": "203.0.113.7",
        "path": "/agent?room=7",
        "now": NOW,
    }
    return trust.prove(owner, **{**fields, **changes})


def test_a_proof_holds_for_its_owner_path_and_time_only() -> None:
    owner = Trust()
    at = Endpoint.parse(Endpoint(host=HOST, port=1, key=owner.published).encode())
    value = _proof(Trust(), at)  # made by another node, with the key the lease publishes
    assert value is not None

    def check(value: str, **changes: Any) -> Proven | None:
        fields: dict[str, Any] = {"owner_name": "n0", "path": "/agent?room=7", "now": NOW}
        return owner.verify(value, **{**fields, **changes})

    assert check(value) == Proven(front="n1", session_id="s_0123456789abcdef", client="203.0.113.7")
    assert check(value, now=NOW + PROOF_WINDOW) is not None
    assert check(value, now=NOW + PROOF_WINDOW + 1) is None  # too old: a replay
    assert check(value, now=NOW - PROOF_WINDOW - 1) is None  # from the future
    assert check(value, owner_name="n2") is None  # for another node
    assert check(value, path="/agent?room=8") is None  # for another request
    assert Trust().verify(value, owner_name="n0", path="/agent?room=7", now=NOW) is None
    head, mac = value.rsplit(".", 1)
    forged = [
        "n1",  # what an outsider sent: a node's name
        "",
        f"{head}.{mac[:-2]}AA",  # another MAC
        f"{head}.",
        head,
        value.replace("v1.", "v2.", 1),
        value + "." + mac,
        value.replace(f".{int(NOW)}.", ".+1700000000."),
        value.replace(f".{int(NOW)}.", ".1e9."),
        value[:3] + "!" + value[4:],  # not base64url
        value + "A" * 2000,  # too long
    ]
    for bad in forged:
        assert check(bad) is None, bad
    # each field is bound: a proof for another session or client is another MAC
    for change in ({"session_id": "s_1"}, {"client": "198.51.100.1"}, {"front": "n9"}):
        other = _proof(Trust(), at, **change)
        assert other is not None and other.rsplit(".", 1)[1] != mac


def test_a_shared_secret_makes_one_key_and_publishes_none() -> None:
    a, b = Trust(SECRET), Trust(SECRET)
    assert a.published is None
    at = Endpoint(host=HOST, port=1)  # a lease without a key
    value = _proof(b, at)
    assert value is not None
    assert a.verify(value, owner_name="n0", path="/agent?room=7", now=NOW) is not None
    assert (
        Trust("another secret, as long").verify(
            value, owner_name="n0", path="/agent?room=7", now=NOW
        )
        is None
    )
    assert _proof(Trust(), at) is None  # no secret, no key published: nothing to prove with
    for shown in (repr(a), repr(ServeOptions(cluster_secret=SECRET))):
        assert SECRET not in shown and "battery" not in shown, shown
    for bad in ("short", 12345678901234567890, b"correct horse battery staple"):
        with pytest.raises(ValueError, match="at least 16") as raised:
            cluster_secret("cluster_secret", bad)
        assert "short" not in str(raised.value)


@pytest.mark.parametrize(
    "endpoint",
    [
        Endpoint(host="10.0.0.11", port=40123, key=b"k" * 32),
        Endpoint(host="::1", port=1, key=b"\xff" * 32, pin="ab" * 32),
        Endpoint(host="node-3.internal", port=9, pin="cd" * 32),
        Endpoint(host="10.0.0.11", port=40123),
    ],
)
def test_the_lease_says_where_and_how(endpoint: Endpoint) -> None:
    text = endpoint.encode()
    assert Endpoint.parse(text) == endpoint and Endpoint.parse(text).key == endpoint.key
    assert text.startswith("wss://" if endpoint.pin else "ws://")


def test_a_lease_of_an_earlier_version_or_a_bad_one() -> None:
    """``HOST:PORT`` is a lease of 0.1.0 (whose sessions are under other keys anyway)."""
    texts = ["10.0.0.11:40123", "[::1]:5", "", "ws://", "http://h:1", "ws://h:x", "wss://h:1"]
    for text in [*texts, "ws://h:1 pin=ab"]:
        with pytest.raises(ValueError, match="relay address"):
            Endpoint.parse(text)
    with pytest.raises(ValueError, match="base64"):
        Endpoint.parse("ws://h:1 key=!")


# -- servers -------------------------------------------------------------------------------------


async def upgrade_status(port: int, *headers: str, local: str | None = None) -> bytes:
    """A raw upgrade request with ``headers`` (``name: value``): the first line answered,
    or b"" if the connection closed first."""
    stream = await trio.open_tcp_stream(HOST, port, local_address=local)
    request = UPGRADE[:-2] + "".join(f"{h}\r\n" for h in headers).encode() + b"\r\n"
    async with stream:
        await stream.send_all(request)
        data = b""
        with trio.fail_after(2):
            while b"\r\n" not in data:
                try:
                    chunk = await stream.receive_some(4096)
                except trio.BrokenResourceError:
                    break
                if not chunk:
                    break
                data += chunk
    return data.split(b"\r\n", 1)[0]


async def lease(store: MemoryStore, node: str = "n0") -> Endpoint:
    text = await store.node_address(node)
    assert text is not None
    return Endpoint.parse(text)


def proof_for(owner: Endpoint, session_id: str, *, owner_name: str = "n0") -> str:
    value = Trust().prove(
        owner,
        owner_name=owner_name,
        front="n1",
        session_id=session_id,
        client="127.0.0.1",
        path="/",
        now=time.time(),
    )
    assert value is not None
    return value


async def test_an_outsiders_relay_header_does_not_get_past_a_drain() -> None:
    """Found: ``x-vrt-relay`` from an outside client got past the drain's 503 (three such
    sessions held a drain to its timeout). Now the header without its proof means
    nothing: 503, as for anyone; with a node's proof, for a session of this node, the
    upgrade goes on (a relayed resume, which a drain takes)."""
    async with nodes(1, drain_timeout=5.0) as ([a], store), via(a) as proxy:
        async with vrt.connect(f"ws://{HOST}:{proxy.port}/") as client:
            async with client.subscribe() as channel:
                events = Log(channel)
                await client.send_text("slow one")  # a turn of a second: the drain waits
                await until(events, lambda e: isinstance(e, vrt.TextDelta))
                a.server.drain()
                await trio.sleep(0.05)
                owner = await lease(store)
                assert await upgrade_status(a.server.port) == b"HTTP/1.1 503 "
                for forged in ("n1", "n0", proof_for(owner, "s_0", owner_name="n1")):
                    status = await upgrade_status(a.server.port, f"x-vrt-relay: {forged}")
                    assert status == b"HTTP/1.1 503 ", forged
                assert client.session_id is not None
                proved = proof_for(owner, client.session_id)
                status = await upgrade_status(a.server.port, f"x-vrt-relay: {proved}")
                assert status.startswith(b"HTTP/1.1 101"), status


async def test_the_relay_port_serves_proved_relays_only() -> None:
    """Found: the relay port opened new sessions for anyone. Now an upgrade without a
    valid proof gets 403 there, a plain HTTP request nothing but a refusal, and a proved
    relay whose hello is not the resume its proof names is refused (a new session as one
    over the limits is: ``RATE_LIMITED``; the resume of another session
    ``RESUME_FAILED``)."""
    async with nodes(1) as (_, store):
        owner = await lease(store)
        assert await upgrade_status(owner.port) == b"HTTP/1.1 403 "
        for forged in ("n1", "v1.a.b.c.1.d", proof_for(owner, "s_1", owner_name="n1")):
            assert await upgrade_status(owner.port, f"x-vrt-relay: {forged}") == b"HTTP/1.1 403 "
        stream = await trio.open_tcp_stream(HOST, owner.port)
        async with stream:
            await stream.send_all(b"GET /vrt.js HTTP/1.1\r\nHost: x\r\n\r\n")
            with trio.fail_after(2):
                answer = await stream.receive_some(4096)
            assert not answer.startswith(b"HTTP/1.1 200"), answer
        for hello, code in (
            ({"type": "hello", "seq": 1, "protocol": "vrt/1", "capabilities": []},
             "RATE_LIMITED"),
            ({"type": "hello", "seq": 1, "protocol": "vrt/1", "capabilities": [],
              "resume": {"sessionId": "s_2", "token": "t", "lastSeq": 0}}, "RESUME_FAILED"),
        ):  # fmt: skip
            tcp = await trio.open_tcp_stream(HOST, owner.port)
            async with tcp, trio.open_nursery() as nursery:
                headers = [(b"x-vrt-relay", proof_for(owner, "s_1").encode())]
                ws = await wrap_client_stream(nursery, tcp, HOST, "/", extra_headers=headers)
                await ws.send_message(json.dumps(hello))
                with trio.fail_after(2):
                    frames = [json.loads(await ws.get_message()) for _ in range(2)]
                assert [f["type"] for f in frames] == ["error", "closed"], frames
                assert frames[0]["code"] == code and frames[1]["reason"] == "rejected"
                nursery.cancel_scope.cancel()


async def test_the_relay_port_bounds_pending_handshakes_per_peer() -> None:
    """Found: the relay port had no per-peer share. Now the public port's bounds hold
    there: a third stalled handshake from one address closes that address's oldest."""
    options = {"max_pending_connections": 5, "max_pending_per_peer": 2, "handshake_timeout": 2}
    async with nodes(1, **options) as (_, store):
        owner = await lease(store)
        stalled = []
        for _ in range(3):
            stream = await trio.open_tcp_stream(HOST, owner.port, local_address="127.0.0.2")
            await stream.send_all(UPGRADE[:-1])
            stalled.append(stream)
            await trio.sleep(0.05)
        assert await closed_by_server(stalled[0], within=1) < 0.5
        for stream in stalled[1:]:
            with pytest.raises(trio.TooSlowError):
                await closed_by_server(stream, within=0.2)
        for stream in stalled:
            await stream.aclose()


async def test_relays_between_tls_nodes_are_wss_to_the_certificate_in_the_lease() -> None:
    """Found: the relay port spoke plain ``ws://`` while the public one had TLS. Now it
    serves TLS with the server's context; the lease pins the certificate, a relay to the
    node checks it (another certificate: the owner is unreachable), and a resume that
    lands on the other node is relayed over ``wss://``: its turn goes on."""
    context = test_tls.server_context()
    async with nodes(2, ssl_context=context) as ([a, b], store), via(a) as proxy:
        owner = await lease(store)
        assert owner.pin == certificate_pin(context)
        assert await upgrade_status(owner.port) == b""  # no HTTP in clear
        wrong = Endpoint(host=owner.host, port=owner.port, key=owner.key, pin="00" * 32)
        with pytest.raises(Unreachable, match="another certificate"):
            await relay(None, wrong, None, "{}", "proof", max_message_size=1 << 20)
        url = f"wss://{HOST}:{proxy.port}/"
        async with vrt.connect(url, ssl_context=test_tls.client_context()) as client:
            async with client.subscribe() as channel:
                events = Log(channel)
                await client.send_text("slow one")
                await until(events, lambda e: isinstance(e, vrt.TextDelta))
                move(proxy, b)  # the resume lands on b, which relays it to a, over TLS
                first = await until(events, ended)
                await until(events, lambda e: isinstance(e, vrt.Resumed))
                await client.send_text("and now?")
                second = await until(events, ended)
    assert first.reason == "finished"
    assert texts(events.events, first.turn_id).startswith("0 1 2 3 4 5 6 7 8 9 ")
    assert texts(events.events, second.turn_id) == "seen 2 inputs, 0 interrupted"


async def test_nodes_sharing_a_secret_relay_with_it_and_never_log_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With ``cluster_secret`` no key is in the store, and relays are proved with the
    secret; it is in no log line."""
    async with nodes(2, cluster_secret=SECRET) as ([a, b], store), via(a) as proxy:
        owner = await lease(store)
        assert owner.key is None
        async with vrt.connect(f"ws://{HOST}:{proxy.port}/") as client:
            async with client.subscribe() as channel:
                events = Log(channel)
                await client.send_text("slow one")
                await until(events, lambda e: isinstance(e, vrt.TextDelta))
                move(proxy, b)
                first = await until(events, ended)
    assert first.reason == "finished"
    assert texts(events.events, first.turn_id).startswith("0 1 2 3 4 5 6 7 8 9 ")
    relayed = [r for r in every_record(caplog) if "relayed by node n1" in r.getMessage()]
    assert relayed, "no relay"
    assert all(SECRET not in r.getMessage() for r in every_record(caplog))
    assert logging.getLogger("vrt").isEnabledFor(logging.DEBUG)
