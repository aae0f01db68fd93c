"""The plumbing both sides use: sockets in, WebSocket frames out.

:mod:`.accept` takes TCP connections in under a pool of pending handshakes; :mod:`.tls`
makes the contexts; :mod:`.upgrade` takes an HTTP request to a WebSocket (or to
:mod:`.web`, the plain-HTTP front: the browser client's files, ``/healthz``,
``/metrics`` from :mod:`.metrics`); :mod:`.pumps` moves frames between a channel and a
connection and keeps the shared ack timer; :mod:`.memory` is the in-memory transport for
tests and embedding; :mod:`.options` declares the server's options, each once (those
only ``vrt.serve`` takes, which name the store, are in :mod:`vrt._server.options`).

Above it, three rooms: :mod:`vrt._server` (the server), :mod:`vrt._client` (the client)
and :mod:`vrt._cluster` (what lets a session move between processes).
"""
