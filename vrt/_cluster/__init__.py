"""What lets a session move between server processes (``handover-v1``).

:mod:`.store` is the port (a :class:`~.store.Store`) and its in-memory implementation,
:mod:`.redis` the Redis and Valkey one (valkey-glide), :mod:`.record` the record codec (a
session's state and history as the store keeps them), :mod:`.node` this process's lease
among the nodes and where a resumed session is, :mod:`.resume` a resume that reaches a node
its session is not on (relay it, or adopt the session), :mod:`.relay` the connection
relayed to the node that runs a session, and :mod:`.keeper` one keeper per session: it
saves the session at its turn boundaries, hands it over and adopts it, driving the
Movement machine (``machines/movement.py``). The server calls into this room through the
keeper's narrow interface; nothing here imports the server.
"""
