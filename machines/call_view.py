"""CallView: what the app sees of one call, server or app, through its tool stream.

Theory of operation. A view is created by the ``start`` phase. ``delta`` is
``arguments-delta``, ``complete`` is ``arguments-complete``, ``progress`` only follows
``complete``, and each view ends with exactly one of ``settle`` (``settled``), ``cancel``
(``cancelled``: its turn was interrupted, locally or by the server) or ``fail`` (``failed``:
the model stopped before completing the arguments).

Invariants:

- exactly one terminal phase per call; a second one is refused, so the client can cancel
  locally at once and drop the server's late terminal for the same call;
- no ``arguments-delta`` after ``arguments-complete``, no ``progress`` before it.

:func:`vrt.testing.assert_stream_valid` checks event logs against this machine.
"""

from statemachine import State

from machines.base import VrtChart


class CallView(VrtChart):
    """The app-facing lifecycle of one call."""

    started = State(initial=True)
    streaming = State()
    issued = State()
    settled = State(final=True)
    cancelled = State(final=True)
    failed = State(final=True)

    delta = started.to(streaming) | streaming.to.itself()
    complete = started.to(issued) | streaming.to(issued)
    progress = issued.to.itself()
    settle = issued.to(settled)
    cancel = started.to(cancelled) | streaming.to(cancelled) | issued.to(cancelled)
    fail = started.to(failed) | streaming.to(failed)
