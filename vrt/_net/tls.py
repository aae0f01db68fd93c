"""TLS for ``vrt.serve`` and ``vrt.connect``: the checks their ``ssl_context`` gets at once,
and ``vrt serve --certfile --keyfile``'s context.

The handshake itself runs on each connection (:meth:`vrt._net.accept.GuardedStream.start_tls`
on the server, inside the handshake deadline; :mod:`vrt._client.dial` on the client). What is
checked here is what would otherwise fail every connection later and quietly: a server
context that is a client's, or that has no certificate (each handshake would be dropped at
DEBUG, as a peer's fault).
"""

from __future__ import annotations

import functools
import hashlib
import ssl


def server_context(ssl_context: object) -> ssl.SSLContext:
    """``ssl_context`` if a server can use it: TypeError if it is not an SSLContext,
    ValueError if it is a client's or has no certificate (``load_cert_chain``)."""
    if not isinstance(ssl_context, ssl.SSLContext):
        raise TypeError(f"ssl_context must be an ssl.SSLContext, not {type(ssl_context).__name__}")
    if ssl_context.protocol == ssl.PROTOCOL_TLS_CLIENT:
        raise ValueError(
            "ssl_context is a client's (ssl.create_default_context() makes one): use "
            "ssl.create_default_context(ssl.Purpose.CLIENT_AUTH) and load_cert_chain"
        )
    reason = _trial_handshake(ssl_context)
    if reason == "NO_SHARED_CIPHER":
        raise ValueError("ssl_context has no certificate: call its load_cert_chain first")
    return ssl_context


def client_context(ssl_context: object) -> ssl.SSLContext:
    """``ssl_context`` if a client can use it: TypeError if it is not an SSLContext,
    ValueError if it is a server's."""
    if not isinstance(ssl_context, ssl.SSLContext):
        raise TypeError(f"ssl_context must be an ssl.SSLContext, not {type(ssl_context).__name__}")
    if ssl_context.protocol == ssl.PROTOCOL_TLS_SERVER:
        raise ValueError(
            "ssl_context is a server's: use ssl.create_default_context() (and "
            "load_verify_locations for a private CA)"
        )
    return ssl_context


def load_server_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    """A server context with the PEM certificate chain in ``certfile`` and its key in
    ``keyfile``; ValueError with a one-line reason if they cannot be read or used."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.set_alpn_protocols(["http/1.1"])  # WebSockets and the HTTP front are HTTP/1.1
    try:
        context.load_cert_chain(certfile, keyfile)
    except ssl.SSLError as exc:
        raise ValueError(
            f"{certfile} and {keyfile} are not a PEM certificate and its key ({exc.reason or exc})"
        ) from None
    except OSError as exc:
        raise ValueError(f"cannot read {exc.filename or certfile}: {exc.strerror or exc}") from None
    return context


def certificate_pin(server: ssl.SSLContext) -> str:
    """The SHA-256 (hex) of the certificate ``server`` presents: what a node publishes in
    its lease, so that the nodes relaying to it check that very certificate
    (:func:`pin_of`). ValueError if a handshake in memory shows none."""
    _, client_side = _handshake(server)
    der = client_side.getpeercert(binary_form=True)
    if der is None:
        raise ValueError("ssl_context presents no certificate")
    return hashlib.sha256(der).hexdigest()


def pin_of(stream: ssl.SSLObject | ssl.SSLSocket | object) -> str | None:
    """The SHA-256 (hex) of the certificate the other side of a TLS connection presented
    (a ``trio.SSLStream`` after its handshake), or None."""
    getpeercert = getattr(stream, "getpeercert", None)
    der = getpeercert(binary_form=True) if getpeercert is not None else None
    return hashlib.sha256(der).hexdigest() if der else None


@functools.cache
def pinning_context() -> ssl.SSLContext:
    """The client context of a relay to a node with TLS: no CA, no name checked, because
    the certificate is checked against the one the node published (:func:`pin_of`):
    nodes reach each other at addresses a certificate rarely names, with certificates a
    private CA or nobody signed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["http/1.1"])
    return context


def _trial_handshake(server: ssl.SSLContext) -> str | None:
    """Run a TLS handshake in memory against ``server`` (a client that checks nothing): the
    server side's error reason, or None if it got as far as it could without the network.
    Only NO_SHARED_CIPHER (no certificate) is taken as the context's fault: a server that
    asks for client certificates fails this client too, rightly."""
    return _handshake(server)[0]


def _handshake(server: ssl.SSLContext) -> tuple[str | None, ssl.SSLObject]:
    """A TLS handshake in memory against ``server``: the server side's error reason (or
    None), and the client side (which has the server's certificate, if it got that far)."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_side = client.wrap_bio(to_client, to_server, server_side=False)
    server_side = server.wrap_bio(to_server, to_client, server_side=True)
    for _ in range(4):  # a handshake is two round trips at most
        for side, is_server in ((client_side, False), (server_side, True)):
            try:
                side.do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                pass
            except ssl.SSLError as exc:
                return (exc.reason if is_server else None), client_side
    return None, client_side
