"""Upstream: a session's connection to a realtime model, and the response it may have open.

Theory of operation. A session whose model is a realtime one (OpenAI Realtime, Gemini
Live) holds one connection to it. The connection is ``connecting`` until the model session
is set up (``ready``); then it is ``idle``: no response is active.

A response starts either because we asked (``create``: the user's text, or a turn's answers
sent with a request for the next step; ``requested`` until the model starts it) or on the
model's own initiative (its voice detector heard the user): ``started`` from ``idle`` is a
response nobody asked for, which opens a new turn. While ``responding``, its events feed the
turn's step; ``done`` ends it (``idle``). A ``done`` may come with no ``started`` before it
(a real server's quirk): from ``requested`` it ends the step all the same.

Barge-in. The app's interrupt during a response cancels it (``interrupt``: ``cancelling``,
``response.cancel`` sent); the model's own speech-start (``speech``) moves it to
``cancelling`` too, but the model cancels its response itself, so nothing is sent. An
interrupt while a response is only ``requested`` makes it ``unwanted``: when it starts it is
cancelled (a cancel before then would be refused: no response is active); a model that
cannot cancel (Gemini) forgets the request instead (``forget``: ``idle``), since what it
says next answers the user's new words. ``cancelling`` waits for the response's ``done``;
every event of a response no longer wanted is dropped.

A lost connection (``drop``: ``lost``) drops whatever was open; ``reconnect`` opens a new one,
seeded with the session's history. ``close`` ends it with the session.

Invariants (what the real servers refuse, never sent):

- ``create`` only from ``idle``: never a second request while a response is active,
  requested, or being cancelled, and never while an interrupt is being settled;
- ``interrupt`` sends a cancel only from ``responding`` (a response the model started and
  has not ended); in every other state there is nothing to cancel;
- ``closed`` is final.
"""

from statemachine import State

from machines.base import VrtChart


class Upstream(VrtChart):
    """A realtime model connection and its one open response."""

    connecting = State(initial=True)
    idle = State()
    requested = State()
    responding = State()
    unwanted = State()
    cancelling = State()
    lost = State()
    closed = State(final=True)

    ready = connecting.to(idle)
    create = idle.to(requested)
    started = idle.to(responding) | requested.to(responding) | unwanted.to(cancelling)
    done = responding.to(idle) | requested.to(idle) | unwanted.to(idle) | cancelling.to(idle)
    interrupt = (
        responding.to(cancelling)
        | requested.to(unwanted)
        | unwanted.to.itself()
        | cancelling.to.itself()
    )
    speech = (
        idle.to.itself()
        | responding.to(cancelling)
        | requested.to(unwanted)
        | unwanted.to.itself()
        | cancelling.to.itself()
    )
    forget = requested.to(idle) | unwanted.to(idle)
    drop = (
        connecting.to(lost)
        | idle.to(lost)
        | requested.to(lost)
        | responding.to(lost)
        | unwanted.to(lost)
        | cancelling.to(lost)
    )
    reconnect = lost.to(connecting)
    close = (
        connecting.to(closed)
        | idle.to(closed)
        | requested.to(closed)
        | responding.to(closed)
        | unwanted.to(closed)
        | cancelling.to(closed)
        | lost.to(closed)
    )
