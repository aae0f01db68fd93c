"""``vrt check``, part three: breadth-first search over the composed model, and its traces.

:func:`search` explores one :class:`~vrt.check._model.Model` breadth first with a visited
set (a dict from each state to the state and action it was first reached by). With
``reduce`` on, each state is expanded with an ample set instead of every enabled action
(the partial-order reduction :mod:`vrt.check` describes). A violation keeps the path that
led to it; :func:`shorten` then drops every step the violation does not need, so the trace
a user reads is short and replays on its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol

import attrs

from vrt.check._state import CLIENT, SERVER, Action, Broken, State


class Model(Protocol):
    """What the search needs of a model (:class:`vrt.check._model.Model`, the turn's, and
    :class:`vrt.check._realtime.RealtimeModel`): its actions, its initial state, the
    reduction's predicates (never read when ``reduce`` is off), and the check at rest."""

    @property
    def actions(self) -> Sequence[Action]:
        """Every named action, in a fixed order."""
        ...

    def initial(self) -> State:
        """The state the exploration starts from."""
        ...

    def canonical(self, s: State) -> State:
        """``s`` with the fields no action reads again reset."""
        ...

    def subsume(self, s: State) -> State:
        """The state that stands for ``s`` under the reduction."""
        ...

    def down(self, s: State) -> bool:
        """Whether only the actions that may happen while the connection is down count."""
        ...

    def client_first(self, s: State) -> bool:
        """Whether the client's actions alone are an ample set."""
        ...

    def server_first(self, s: State) -> bool:
        """Whether the server's actions alone are an ample set."""
        ...

    def check_at_rest(self, s: State) -> None:
        """Raise :class:`Broken` if ``s``, at rest, breaks an end-state rule."""
        ...

    def marks(self, s: State) -> tuple[bool, bool]:
        """Two marks counted over the states reached (for the figures)."""
        ...


@attrs.frozen(kw_only=True)
class Found:
    """A violation as the search found it: the invariant, what broke, the actions taken."""

    invariant: str
    detail: str
    path: tuple[Action, ...]
    """From the initial state; the last action breaks the invariant, unless the state it
    reaches is at rest and breaks it (``at_rest``)."""
    at_rest: bool


@attrs.frozen(kw_only=True)
class Outcome:
    """What one search did: its figures, whether it ran to the end, the violations."""

    states: int
    transitions: int
    after_handover: int
    """Of the states, those during a handover (see :attr:`vrt.check.Report.after_handover`)."""
    after_crash: int
    """Of the states, those after a crash that lost work (the session not closed)."""
    complete: bool
    found: tuple[Found, ...]


def step(model: Model, action: Action, state: State, reduce: bool) -> State | None:
    """``action`` from ``state`` as the search takes it (canonical, subsumed when reducing);
    raises :class:`Broken` if the action breaks an invariant."""
    following = action.run(state)
    if following is None:
        return None
    following = model.canonical(following)
    return model.subsume(following) if reduce else following


def search(
    model: Model,
    *,
    reduce: bool = True,
    stop_at_first: bool = False,
    at_rest: set[State] | None = None,
) -> Outcome:
    """Explore ``model`` breadth first; keep the first violation of each invariant.

    With ``reduce``, a state is expanded with its ample set; if an action of that set breaks
    an invariant, the state is expanded with every action after all (the path through that
    action ends there, and the others must still be reached). ``at_rest``, if given,
    receives every state at rest (for tests: the reduction must keep exactly these).
    """
    initial = model.initial()
    parent: dict[State, tuple[State, Action] | None] = {initial: None}
    frontier = deque([initial])
    everyone = model.actions
    client = [a for a in everyone if a.side == CLIENT or a.ample]
    server = [a for a in everyone if a.side == SERVER]
    window = [a for a in everyone if a.window]
    transitions = 0
    found: dict[str, Found] = {}

    def path_to(state: State) -> tuple[Action, ...]:
        actions = []
        while (link := parent[state]) is not None:
            state, action = link
            actions.append(action)
        return tuple(reversed(actions))

    def note(exc: Broken, path: tuple[Action, ...], rest: bool) -> None:
        if exc.invariant not in found:  # breadth first: the first is a shortest
            found[exc.invariant] = Found(
                invariant=exc.invariant, detail=exc.detail, path=path, at_rest=rest
            )

    def expand(state: State, actions: Sequence[Action]) -> tuple[bool, bool]:
        """Take every enabled action of ``actions``: (progress made, an invariant broke)."""
        nonlocal transitions
        moved = broke = False
        for action in actions:
            try:
                following = step(model, action, state, reduce)
            except Broken as exc:
                transitions += 1
                moved = broke = True
                note(exc, (*path_to(state), action), rest=False)
                continue
            if following is None:
                continue
            transitions += 1
            moved = moved or not action.env
            if following not in parent:
                parent[following] = (state, action)
                frontier.append(following)
        return moved, broke

    while frontier and not (found and stop_at_first):
        state = frontier.popleft()
        ample = everyone
        if reduce:
            if model.down(state):
                ample = window
            elif model.client_first(state):
                ample = client
            elif model.server_first(state):
                ample = server
        moved, broke = expand(state, ample)
        if broke and ample is not everyone:
            moved |= expand(state, [a for a in everyone if a not in ample])[0]
        if not moved:
            if at_rest is not None:
                at_rest.add(state)
            try:
                model.check_at_rest(state)
            except Broken as exc:
                note(exc, path_to(state), rest=True)
    handed = crashed = 0
    for state in parent:
        handover, crash = model.marks(state)
        handed, crashed = handed + handover, crashed + crash
    return Outcome(
        states=len(parent),
        transitions=transitions,
        after_handover=handed,
        after_crash=crashed,
        complete=not frontier,
        found=tuple(found.values()),
    )


def replay(model: Model, path: Sequence[Action], reduce: bool) -> tuple[list[str], Broken | None]:
    """Take ``path`` from the initial state; return each step's label and what broke, if
    anything (an end state at rest is checked too). Raises ValueError if a step is not
    enabled or a step before the last breaks an invariant."""
    state = model.initial()
    labels: list[str] = []
    for n, action in enumerate(path):
        try:
            following = step(model, action, state, reduce)
        except Broken as exc:
            if n != len(path) - 1:
                raise ValueError("an invariant breaks before the last step") from None
            labels.append(action.describe(state))
            return labels, exc
        if following is None:
            raise ValueError(f"step {n + 1} is not enabled")
        labels.append(action.describe(state))
        state = following
    if any(_enabled(action, state) for action in model.actions if not action.env):
        return labels, None  # not at rest: nothing to check
    try:
        model.check_at_rest(state)
    except Broken as exc:
        return labels, exc
    return labels, None


def _enabled(action: Action, state: State) -> bool:
    try:
        return action.run(state) is not None
    except Broken:
        return True


def shorten(model: Model, found: Found, reduce: bool) -> tuple[tuple[str, ...], str]:
    """The labels of a shortest-we-can trace for ``found``: drop, one at a time, every step
    without which the same invariant still breaks. Returns the labels and the detail."""
    path = list(found.path)
    detail = found.detail
    changed = True
    while changed:
        changed = False
        for n in range(len(path) - 1, -1, -1):
            candidate = path[:n] + path[n + 1 :]
            try:
                _, broken = replay(model, candidate, reduce)
            except ValueError:
                continue
            if broken is not None and broken.invariant == found.invariant:
                path, detail, changed = candidate, broken.detail, True
    labels, _ = replay(model, path, reduce)
    return tuple(labels), detail
