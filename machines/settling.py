"""Settling: whether a realtime model that cancels calls on its own may still cancel some.

Theory of operation. Gemini Live has no cancel message for the app to send: when its voice
detector hears the user, it stops its own response and may then name the calls it
cancelled (``toolCallCancellation``) before it says it has settled (``turnComplete``).
Until then, an answer to one of those calls would be an answer to a call the model has
dropped. So the session's Upstream driver keeps this machine beside its Upstream
machine: the model's speech-start moves it from ``settled`` to ``unsettled`` (``heard``;
again if it hears the user again), and its settling, or a lost connection (whose next
model session starts settled), moves it back (``settle``). While ``unsettled``, the
INTERRUPTED answers of the cut turn's calls are held; at ``settle`` they go, less the
ones the model cancelled. ``close`` ends it with the session's connection to the model.

A model that cancels nothing on its own (OpenAI Realtime) never moves it.

Invariants (the driver's, with this machine):

- no INTERRUPTED answer of a call of the cut turn goes to the model while it is
  ``unsettled`` (a later step's own answers are not held: they answer calls the model
  made after it settled);
- at ``settle`` from the model the held answers go, each once, less the calls it
  cancelled; at ``settle`` from a lost connection they are dropped, and the next model
  session learns of those calls from the seeded history.
"""

from statemachine import State

from machines.base import VrtChart


class Settling(VrtChart):
    """Whether the model may still cancel calls of the turn it cut (Gemini)."""

    settled = State(initial=True)
    unsettled = State()
    closed = State(final=True)

    heard = settled.to(unsettled) | unsettled.to.itself()
    settle = unsettled.to(settled) | settled.to.itself()
    close = settled.to(closed) | unsettled.to(closed)
