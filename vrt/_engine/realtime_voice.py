"""What a realtime model said aloud, per audio item: the bookkeeping that lets an interrupt
truncate the model's memory of its voice to what the user heard.

A plain object (no trio, no socket) that the session's
:class:`~vrt._engine.realtime.Upstream` feeds with each audio delta it passes on and asks,
on an interrupt, which item to truncate and where; the Upstream sends the truncation.
"""

from __future__ import annotations


class Voice:
    """The active response's audio items (milliseconds sent of each, where each starts in
    its turn's audio), and the turn whose audio was sent last."""

    def __init__(self, items_kept: int) -> None:
        self._items_kept = items_kept  # past it, a response's new items are not tracked
        self._audio_ms: dict[str, float] = {}  # the active response's audio, per item
        self._item_at: dict[str, float] = {}  # where each of those starts in its turn's audio
        self._last_item = ""
        self._spoken: tuple[object, float] = (None, 0.0)  # a turn, and its audio so far

    def new_response(self) -> None:
        """A response began: its items are new (the turn's audio so far is kept)."""
        self._audio_ms, self._item_at = {}, {}

    def sent(self, turn: object, item: str, ms: float) -> None:
        """``ms`` of audio item ``item`` of ``turn`` went to the app."""
        spoken_turn, spoken = self._spoken
        if spoken_turn is not turn:
            spoken = 0.0
        if item not in self._audio_ms:
            if len(self._audio_ms) >= self._items_kept:  # a response of endless items
                return
            self._item_at[item] = spoken
        self._audio_ms[item] = self._audio_ms.get(item, 0.0) + ms
        self._spoken = (turn, spoken + ms)
        self._last_item = item

    def cut(self, heard_ms: int | None, *, active: bool, turn: object) -> tuple[str, int] | None:
        """The item to truncate and the milliseconds of it to keep, or None (then nothing
        is forgotten); see :meth:`Upstream._truncate <.realtime.Upstream._truncate>`.
        ``active``: a response is active; ``turn``: the session's open turn."""
        item = self._last_item
        sent = self._audio_ms.get(item)
        if not item or sent is None:
            return None
        if not active and (heard_ms is None or self._spoken[0] is not turn):
            return None
        if heard_ms is None:
            ms = sent
        else:
            starts = self._item_at
            held = [i for i in self._audio_ms if starts.get(i, 0.0) <= heard_ms]
            item = held[-1] if held else next(iter(self._audio_ms))
            ms = min(max(0.0, heard_ms - starts.get(item, 0.0)), self._audio_ms[item])
        self._audio_ms, self._item_at = {}, {}
        return item, int(ms)
