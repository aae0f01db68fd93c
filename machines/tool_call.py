"""ToolCall: the server's authority over one tool call, from the model's first token to its result.

Theory of operation. A call is created when the model begins it (stream phase ``start``).
Argument fragments arrive as ``delta`` (``arguments-delta``); ``complete`` issues the call
(``arguments-complete``), or ``abandon`` fails it when the model stopped before finishing the
arguments (``failed``). An issued call passes the ``before_tool_call`` hook: ``allow`` lets it
run (no stream event), ``decline`` settles it without running (REJECTED, or FAILED for a tool
nobody hosts). A running call reports ``progress`` and ends with ``finish`` (ok, INVALID,
FAILED or TIMEOUT). ``interrupt`` cancels any call that is not final.

Invariants:

- every path ends in exactly one of ``settled``, ``cancelled`` or ``failed``, and each final
  state is entered by exactly one stream event, so a call has exactly one terminal event;
- a final state accepts no event: a tool that ignored its signal and returned late is
  refused by the machine, so it cannot produce a second terminal event or a second result;
- ``progress`` only while running, ``delta`` only before ``complete``.
"""

from statemachine import State

from machines.base import VrtChart


class ToolCall(VrtChart):
    """One tool call on the server; stream phases map one to one onto its transitions."""

    started = State(initial=True)
    streaming = State()
    issued = State()
    running = State()
    settled = State(final=True)
    cancelled = State(final=True)
    failed = State(final=True)

    delta = started.to(streaming) | streaming.to.itself()
    complete = started.to(issued) | streaming.to(issued)
    abandon = started.to(failed) | streaming.to(failed)
    allow = issued.to(running)
    decline = issued.to(settled)
    progress = running.to.itself()
    finish = running.to(settled)
    interrupt = (
        started.to(cancelled)
        | streaming.to(cancelled)
        | issued.to(cancelled)
        | running.to(cancelled)
    )
