"""What only ``vrt.serve`` takes (its listeners, TLS, its place among the nodes of a store),
declared as :mod:`vrt._net.options` declares what every front takes, and the lists of
options each front takes, read by ``vrt.serve``, ``vrt.asgi.app``, the generated
TypedDicts (``vrt/_server/option_types.py``) and ``vrt serve``'s flags.

These live here rather than beside :class:`~vrt._net.options.Options` because they name
the store (``vrt._cluster``), which the plumbing room must not import.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from vrt._cluster.store import Store
from vrt._cluster.trust import cluster_secret, read_secret
from vrt._net.options import (
    SECONDS,
    Flag,
    Options,
    Rule,
    about,
    checked,
    make_options,
    option,
    refuse_unknown,
)
from vrt._net.tls import server_context


def _tls(name: str, value: object) -> ssl.SSLContext | None:
    return None if value is None else server_context(value)


def _listening(name: str, value: object) -> tuple[socket.socket, ...] | None:
    if value is None:
        return None
    sockets = tuple(value) if isinstance(value, list | tuple) else None
    if not sockets or not all(isinstance(sock, socket.socket) for sock in sockets):
        raise ValueError(f"{name} must be a list of listening sockets, not {value!r}")
    for sock in sockets:
        try:
            listens = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        except OSError:  # closed
            listens = 0
        if sock.type != socket.SOCK_STREAM or not listens:
            raise ValueError(f"{name}: {sock!r} is not a listening TCP socket")
    return sockets


@attrs.frozen(kw_only=True)
class ServeOptions:
    """What one ``vrt.serve`` was started with besides its :class:`Options`."""

    ssl_context: ssl.SSLContext | None = option(
        None,
        group="serving",
        rule=Rule(_tls),
        doc="""Serve TLS (``wss://``, and ``https://`` for the HTTP front) with this
        server-side context (``ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)`` with
        ``load_cert_chain``; ``vrt serve --certfile F --keyfile F``); :attr:`vrt.Server.url` then
        says ``wss://``. The TLS handshake is part of the connection's handshake: it counts
        in ``handshake_timeout`` and in the pool of pending connections, and a peer that
        fails it (plain HTTP, garbage, a certificate it refuses) is dropped quietly, like a
        bad upgrade. TypeError if it is not an SSLContext, ValueError if it is a client's or
        has no certificate. With a store, the port other nodes relay resumes to
        (``relay_host``) serves TLS with it too: the nodes relaying there check that the
        certificate is the one the node published in its lease (its SHA-256), not a CA's
        signature or a name.""",
    )
    store: str | Store | None = option(
        None,
        group="production",
        flag=Flag(
            metavar="URL",
            help="redis://HOST:PORT[/DB] or valkey://...: where sessions are saved, shared by "
            "every node (default: none, sessions live in this process)",
        ),
        doc="""``"redis://HOST:PORT[/DB]"`` or ``"valkey://..."`` (valkey-glide: ``pip install
        'trio-vrt[redis]'``), or a store object shared by servers of one process
        (``vrt._cluster.store.MemoryStore``). Each
        session is saved there at every turn boundary; a resume that reaches another server
        sharing the store is relayed to the one running the session, or adopts it there
        once it was handed over (:meth:`vrt.Server.drain`) or its server died (after a lease of
        5 s: the turn that was running ends ``interrupted``). Records expire with
        ``resume_window``. Raises :class:`~vrt._cluster.store.StoreError` at once if the
        store does not answer, or valkey-glide is not installed. Without a store,
        sessions live in this process only.""",
    )
    node: str | None = option(
        None,
        group="production",
        flag=Flag(
            metavar="NAME",
            help="this process's name in the store and in log lines (default: host:pid; a "
            "worker's NAME:i or host:pid:i)",
        ),
        doc="""This server's name in the store and in logs (default ``host:pid``).""",
    )
    drain_timeout: float = option(
        30.0,
        group="production",
        rule=SECONDS,
        flag=Flag(help="seconds a drain waits for a turn before interrupting it"),
        doc="""Seconds a drain waits for a turn to end before it interrupts it.""",
    )
    relay_host: str | None = option(
        None,
        group="production",
        flag=Flag(
            metavar="HOST",
            help="the address other nodes reach this one at (default: --host, or this "
            "machine's address for a wildcard)",
        ),
        doc="""The address other servers reach this one at for relayed resumes (a port of
        its own is opened there; default: ``host``, or this machine's address when ``host``
        is a wildcard). That port serves nothing but relays with their proof (see
        ``cluster_secret``), with TLS when the server has ``ssl_context``, and bounds its
        pending connections as the public port does.""",
    )
    cluster_secret: str | None = option(
        None,
        group="production",
        rule=Rule(cluster_secret, read_secret),
        secret=True,
        flag=Flag(
            metavar="SECRET",
            env="VRT_CLUSTER_SECRET",
            help="a secret every node shares, to prove relays with (prefer the "
            "environment variable: ps shows flags; default: a key per node, in the store)",
        ),
        doc="""A secret of at least 16 characters shared by every node of the store
        (``vrt serve --cluster-secret``, or ``VRT_CLUSTER_SECRET``): the key nodes prove
        their relays with (``x-vrt-relay``, an HMAC over the session, the nodes' names, the
        client's address, the path and the time; a relay without a valid proof is a plain
        client's, refused on the relay port). By default each node makes a random key and
        publishes it in its lease in the store: whoever can read the store is a node, which
        is true anyway. With a secret no key is in the store. Every node must have the same
        one, or none. Never logged, in no ``repr``.""",
    )
    sockets: Sequence[socket.socket] | None = option(
        None,
        group="production",
        rule=Rule(_listening),
        doc="""Serve on these listening TCP sockets instead of binding ``host:port``: sockets
        someone else bound and holds (``vrt serve --workers``: the parent's, one set shared by
        every worker; systemd's socket activation). The kernel queues new connections on
        each socket while any process holds it open, and whichever process accepts first
        gets them. The server closes its copies when it returns, and at once on
        :meth:`vrt.Server.drain` (it stops accepting: the others holding them take the new
        connections). ValueError if one is not a listening TCP socket.""",
    )


SERVE: tuple[attrs.Attribute[Any], ...] = (*attrs.fields(Options), *attrs.fields(ServeOptions))
"""Every option of ``vrt.serve``, in declaration order."""
APP: tuple[attrs.Attribute[Any], ...] = tuple(
    field for field in attrs.fields(Options) if not about(field).serve_only
)
"""Every option of ``vrt.asgi.app``: those of :class:`Options` its ASGI server does not
own."""


def serve_options(given: Mapping[str, object]) -> tuple[Options, ServeOptions]:
    """``vrt.serve``'s options: TypeError for an unknown name, ValueError for a bad value."""
    refuse_unknown(given, "serve", SERVE)
    return make_options(given), checked(ServeOptions, given)


def app_options(given: Mapping[str, object]) -> Options:
    """``vrt.asgi.app``'s options: TypeError for an unknown name (or one of
    ``vrt.serve``'s only), ValueError for a bad value."""
    refuse_unknown(
        given,
        "app",
        APP,
        elsewhere=[field.name for field in SERVE],
        where="vrt.serve's only",
    )
    return make_options(given)
