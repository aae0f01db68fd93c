"""Turn: one user input and every model step and tool call it leads to.

Theory of operation. A turn starts ``generating`` (a model step streams). When the step's
stream ends the turn is ``awaiting`` (``step_done``) until every call of the step is final;
then ``next_step`` feeds the results back and generates again, or ``finish`` ends it (a step
without calls, or ``max_steps`` reached; a step without calls may also finish straight from
``generating``). ``interrupt`` moves a live turn to ``interrupting``: its cancel scope is
cancelled and its calls are cancelled at once; ``unwound`` ends it ``interrupted`` once its
nursery has exited. ``error`` (the model raised, or the engine hit a bug) ends it ``failed``.

Invariants:

- a turn ends exactly once, in ``finished``, ``interrupted`` or ``failed``;
- ``interrupted`` is reachable only through ``interrupting``, i.e. only after the nursery
  that owned the turn's calls has exited;
- no step starts after an interrupt: ``next_step`` is refused in ``interrupting``.
"""

from statemachine import State

from machines.base import VrtChart


class Turn(VrtChart):
    """The lifecycle of one turn."""

    generating = State(initial=True)
    awaiting = State()
    interrupting = State()
    finished = State(final=True)
    interrupted = State(final=True)
    failed = State(final=True)

    step_done = generating.to(awaiting)
    next_step = awaiting.to(generating)
    finish = generating.to(finished) | awaiting.to(finished)
    interrupt = generating.to(interrupting) | awaiting.to(interrupting)
    unwound = interrupting.to(interrupted)
    error = generating.to(failed) | awaiting.to(failed) | interrupting.to(failed)
