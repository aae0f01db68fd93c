"""Movement: a server session's place among the processes that may run it.

Theory of operation. A session's actor starts ``new``. Opened here, it is ``idle``
(``open``); restored from the store it waits for its client's resume, ``adopted`` from a
planned handover (``adopt``) or ``recovering`` after the process that ran it died
(``adopt_lost``); at the resume (``resume``) it is ``idle`` here, the lost turn of a
``recovering`` one settled first.

Owned here, the session is ``idle`` between turns and ``busy`` while a turn is open or
being started (``start``, ``rest``). Each turn boundary is saved to the store (``save``)
while it is owned. Asked to move (a drain, or its client's resume reached another process)
an ``idle`` session is handed over at once (``hand_over``); a ``busy`` one is ``moving``
(``move``): no new turn starts, and when the one that runs ends (``rest``) it is handed
over. ``handing_over`` writes its last save, the client's frames held unread meanwhile;
then it is let go
(``let_go``: its connection closes with 1012, the client resumes elsewhere), or, if the
store failed, it stays here, ``idle`` (``stay``), and reads what it held. A save that
finds another process owning the session (this one's lease ran out) lets it go at once,
a turn and all (``taken``: ``taken_over``; that process settles the turn). A drain that
ends with the session still here (its handover could not be written, the store failing;
or its turn would not end) lets it go unsaved (``abandon``: ``abandoned``): its client
resumes elsewhere, and the process its resume reaches adopts it from its last save, as
after a crash, once this one's lease is over. ``close`` ends it here for good.

Without a store the session only ever goes ``new``, ``idle``, ``busy`` and ``closed``.

Invariants:

- a session moves only between turns: ``handing_over`` is reached only from ``idle``, or
  from ``moving`` when its turn ends;
- no turn starts unless it is owned here and between turns (``start`` from ``idle`` only),
  so nothing starts while it is moving, being handed over, or waiting for its resume;
- ``handed_over``, ``taken_over``, ``abandoned`` and ``closed`` are final: a session let
  go never runs here again, and no save is written for it;
- a session restored from the store runs nothing before its client's resume.
"""

from statemachine import State

from machines.base import VrtChart


class Movement(VrtChart):
    """Where a server session runs, and whether it may move now."""

    new = State(initial=True)
    adopted = State()
    recovering = State()
    idle = State()
    busy = State()
    moving = State()
    handing_over = State()
    handed_over = State(final=True)
    taken_over = State(final=True)
    abandoned = State(final=True)
    closed = State(final=True)

    open = new.to(idle)
    adopt = new.to(adopted)
    adopt_lost = new.to(recovering)
    resume = adopted.to(idle) | recovering.to(idle)
    start = idle.to(busy)
    rest = busy.to(idle) | moving.to(handing_over)
    save = idle.to.itself() | busy.to.itself() | moving.to.itself()
    move = busy.to(moving)
    hand_over = idle.to(handing_over)
    let_go = handing_over.to(handed_over)
    stay = handing_over.to(idle)
    taken = (
        idle.to(taken_over)
        | busy.to(taken_over)
        | moving.to(taken_over)
        | handing_over.to(taken_over)
    )
    abandon = (
        idle.to(abandoned) | busy.to(abandoned) | moving.to(abandoned) | handing_over.to(abandoned)
    )
    close = (
        new.to(closed)
        | adopted.to(closed)
        | recovering.to(closed)
        | idle.to(closed)
        | busy.to(closed)
        | moving.to(closed)
        | handing_over.to(closed)
    )
