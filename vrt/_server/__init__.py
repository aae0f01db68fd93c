"""The server: sessions hosted over WebSocket connections.

:func:`~.serve.serve` listens and accepts; the :class:`~.hub.Hub` takes each connection
through its handshake and opens, resumes or adopts its session; a
:class:`~.actor.SessionActor` pumps one session's protocol core and drives its engine
session, across connections; a :class:`~.link.Link` is one connection carrying it (writer,
reader, :class:`~.ratelimit.RateLimit`); :mod:`.frames` turns engine events into vrt/1
messages. What lets a session move to another process (store, handover, adoption) is
:mod:`vrt._cluster`'s: the actor calls its session's keeper.

:mod:`.options` declares the options only ``vrt.serve`` takes (TLS, the store) beside those
of :mod:`vrt._net.options`, and lists what each front takes; :mod:`.option_types` is
generated from both (the TypedDicts ``vrt.ServerOptions`` and ``vrt.asgi.AppOptions``).
"""
