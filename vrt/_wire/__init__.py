"""The vrt/1 wire protocol, sans-IO: messages, codec and each side's protocol state.

Nothing in this package imports trio or does I/O (a test enforces it): bytes and messages
go in, messages and text frames come out, so a client core and a server core can talk to
each other in memory, like h11's ``ConnectionPair``. The Trio actors in ``vrt._server.serve``
and ``vrt._client.client`` only pump them.
"""
