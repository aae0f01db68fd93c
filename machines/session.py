"""Session: the server's view of one conversation, which may outlive its connections.

Theory of operation. A session is ``handshaking`` until its hello is accepted (``accept``);
in process it is accepted at once. While ``open`` it runs turns. Losing the connection
(``drop``) leaves it ``detached``: turns and server tools go on, and a ``resume`` within the
window reattaches a new connection; ``expire`` ends it when the window runs out. ``close``
ends it for good from any live state (client, server, shutdown, overflow).

Invariants:

- ``closed`` is final: a closed session is never resumed;
- only an ``open`` session can be detached, only a ``detached`` one resumed or expired.
"""

from statemachine import State

from machines.base import VrtChart


class Session(VrtChart):
    """The server-side lifecycle of a session."""

    handshaking = State(initial=True)
    open = State()
    detached = State()
    closed = State(final=True)

    accept = handshaking.to(open)
    drop = open.to(detached)
    resume = detached.to(open)
    expire = detached.to(closed)
    close = handshaking.to(closed) | open.to(closed) | detached.to(closed)
