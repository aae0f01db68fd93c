"""The Trio transport: sessions hosted over WebSocket connections, and the client.

:func:`~.serve.serve` accepts connections and hosts one session actor per session
(:mod:`.actor`), carried by one connection at a time (:mod:`.link`: reader, writer, rate
limit); :func:`~.dial.connect` opens the client's connections and :mod:`.client` pumps the
client's protocol core. Both sides pump the sans-IO cores of :mod:`vrt._wire`; the server
runs the engine of :mod:`vrt._engine` for each session.
"""
