"""AppCall: the client's runner for one app tool call, behind the epoch gate.

Theory of operation. A ``tool.call`` arrives ``received``. The epoch gate decides at once:
a call of an old epoch is ``stale`` and answered INTERRUPTED without running; a current one
is ``admit``-ted to the serial queue. Calls ``begin`` one at a time, in arrival order, only
after the previous call has its result; ``answer`` records the result that goes back to the
server. ``abort`` ends a call that has not answered: the user interrupted (queued calls are
dropped, the running one's signal aborts) or the server sent ``tool.abort``.

Invariants:

- a stale call never reaches ``running``;
- a call is answered at most once, and never after it was aborted.
"""

from statemachine import State

from machines.base import VrtChart


class AppCall(VrtChart):
    """One app tool call inside the client."""

    received = State(initial=True)
    queued = State()
    running = State()
    answered = State(final=True)
    aborted = State(final=True)

    admit = received.to(queued)
    stale = received.to(answered)
    begin = queued.to(running)
    answer = running.to(answered)
    abort = received.to(aborted) | queued.to(aborted) | running.to(aborted)
