"""The in-process Trio engine: an agent's sessions, turns and calls.

A :class:`~.session.Session` owns a nursery; each :class:`~.turn.Turn` runs in its own
cancel scope inside it; each :class:`~.call.Call` is a task in its turn's nursery, driving
its ToolCall machine (the machine decides, the task acts). Below it: :mod:`vrt._core`
(tables, records) and :mod:`vrt.models` (the model protocol). It knows nothing of the wire
or of sockets: :mod:`vrt._server` hosts sessions over a connection.
"""
