"""Connection: the client's link to its session, across reconnects.

Theory of operation. A client is ``connecting`` until the server's ``welcome``. While
``open``, a lost socket (``lost``) moves it to ``reconnecting``, where it retries with
backoff; ``resumed`` returns it to ``open`` on the same session. ``close`` ends it from any
live state: the client closed, the server sent ``closed``, or resuming failed for good.

Invariants:

- ``closed`` is final: a closed connection never reopens (a new ``connect`` is a new session);
- ``resumed`` is only possible after ``lost``, so the app sees every loss before its resume.
"""

from statemachine import State

from machines.base import VrtChart


class Connection(VrtChart):
    """The client-side lifecycle of a connection to a session."""

    connecting = State(initial=True)
    open = State()
    reconnecting = State()
    closed = State(final=True)

    welcome = connecting.to(open)
    lost = open.to(reconnecting)
    resumed = reconnecting.to(open)
    close = connecting.to(closed) | open.to(closed) | reconnecting.to(closed)
