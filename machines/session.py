"""Session: the server's view of one conversation, which may outlive its connections.

Theory of operation. A session is ``handshaking`` until its hello is accepted (``accept``);
in process it is accepted at once. While ``open`` it runs turns. Losing the connection
(``drop``) leaves it ``detached``: turns and server tools go on, and a ``resume`` within the
window reattaches a new connection; ``expire`` ends it when the window runs out. ``close``
ends it for good from any live state (client, server, shutdown, overflow).

With a store (``handover-v1``) a session can move between processes. At a turn boundary
its process saves it and lets it go (``hand_over``: the connection is closed with 1012,
and no ``closed`` is sent, since the session goes on elsewhere). Another process restores
it from the store (``adopt``: it waits, ``detached``, for the client's resume), either from
a handover or, after the process that ran it died, from its last saved boundary.

Invariants:

- ``closed`` is final: a closed session is never resumed;
- ``handed_over`` is final here: the session lives on only in the store and the process
  that adopts it;
- only an ``open`` session can be detached, only a ``detached`` one resumed or expired;
- an adopted session is ``detached`` until its client resumes it.
"""

from statemachine import State

from machines.base import VrtChart


class Session(VrtChart):
    """The server-side lifecycle of a session."""

    handshaking = State(initial=True)
    open = State()
    detached = State()
    closed = State(final=True)
    handed_over = State(final=True)

    accept = handshaking.to(open)
    adopt = handshaking.to(detached)
    drop = open.to(detached)
    resume = detached.to(open)
    expire = detached.to(closed)
    close = handshaking.to(closed) | open.to(closed) | detached.to(closed)
    hand_over = open.to(handed_over) | detached.to(handed_over)
