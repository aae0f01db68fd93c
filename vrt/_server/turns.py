"""The turns a client asks for, started one at a time while the session is owned here.

A client's ``input`` interrupts the open turn at once (barge-in) and waits in line; one
task at a time starts the waiting inputs' turns, in arrival order, each to its end, while
the session's Movement machine says it is here and may run a turn (``start`` from
``idle``, ``rest`` when the line is empty). A session asked to move meanwhile
(``moving``) starts no new turn: at the end of the one that runs, its keeper hands it over,
and the inputs still waiting go with it, in its saved state.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import trio

from vrt._engine.session import Session
from vrt._errors import SessionClosed

if TYPE_CHECKING:
    from vrt._cluster.keeper import Keeper
    from vrt._core.tables import Machine, StrictMachine
    from vrt._engine.turn import Turn


class Turns:
    """One session's line of inputs and the task that turns them into turns."""

    __slots__ = ("_inputs", "_interrupts", "_nursery", "_session", "keeper", "movement", "turned")

    def __init__(self, movement: Machine | StrictMachine, keeper: Keeper | None) -> None:
        self.movement = movement
        self.keeper = keeper
        self.turned = False
        """A turn was asked for (an ``input``): the first-turn limit no longer applies."""
        self._inputs: list[tuple[str, int]] = []
        """Inputs whose turns have not started, with the interrupt count when each came."""
        self._interrupts = 0
        self._session: Session | None = None
        self._nursery: trio.Nursery | None = None

    def run_in(self, session: Session, nursery: trio.Nursery) -> None:
        """Start turns of ``session`` in ``nursery`` (the session's) from now on."""
        self._session, self._nursery = session, nursery
        session.model_turn_opened = self.model_turn

    def model_turn(self, turn: Turn) -> None:
        """A realtime model opened a turn of its own (it heard the user): the session is
        busy until it ends, as for an input's (a session moving meanwhile goes at its
        end)."""
        self.turned = True
        self._busy()

    @property
    def waiting(self) -> tuple[str, ...]:
        """The inputs whose turns have not started, in order."""
        return tuple(text for text, _ in self._inputs)

    def input(self, text: str) -> None:
        """The client's ``input``: the open turn is interrupted now (barge-in), and
        ``text``'s turn starts after it."""
        assert self._session is not None
        self.turned = True
        self._session.interrupt()  # at once, before the new turn is queued
        self._inputs.append((text, self._interrupts))
        self.start()

    def interrupt(self, epoch: int, *, heard_ms: int | None = None) -> None:
        """The client's ``interrupt`` (its new ``epoch``): the open turn, and a turn of an
        input that came before it and has not started yet, are interrupted. ``heard_ms``:
        how much of the open turn's audio the user heard (``audio-v1``)."""
        assert self._session is not None
        self._interrupts += 1
        self._session.interrupt(max(epoch, self._session.epoch + 1), heard_ms=heard_ms)

    def extend(self, texts: Iterable[str]) -> None:
        """Inputs that moved with the session (adopted from the store): in line now."""
        self._inputs.extend((text, self._interrupts) for text in texts)
        if self._inputs:
            self.turned = True
            self.start()

    def start(self) -> None:
        """Start the waiting inputs' turns, if the session is between turns here (Movement
        ``start``); while it is moving they wait, and go with it in its saved state."""
        if self._inputs:
            self._busy()

    def _busy(self) -> None:
        """Movement ``start``, if the session is between turns here, and the task that
        runs its turns while it is ``busy``."""
        if self.movement.can("start"):
            self.movement.send("start")
            assert self._nursery is not None
            assert self._session is not None
            self._nursery.start_soon(self._run, self._session)

    async def _run(self, session: Session) -> None:
        """While ``busy``: the waiting inputs' turns, one at a time in arrival order
        (``start_turn`` waits for a barge-in's turn to end), each to its end. Then the
        session is between turns again (``rest``); or, asked to move meanwhile
        (``moving``), it is handed over now (the keeper's
        :meth:`~vrt._cluster.keeper.Keeper.leave`)."""
        movement = self.movement
        try:
            while True:
                if self._inputs and movement.state == "busy":
                    text, generation = self._inputs.pop(0)
                    started = await session.start_turn(text)
                    if generation != self._interrupts:
                        started.interrupt()  # the user interrupted after sending it
                elif (turn := session.turn) is not None:
                    await turn.wait()
                else:
                    break
        except SessionClosed:
            self._inputs.clear()  # closed while they waited (the client's close): no turns
            return
        if movement.can("rest"):
            movement.send("rest")
            if movement.state == "handing_over":  # it was moving: it goes now
                assert self.keeper is not None
                await self.keeper.leave()
