"""Which legacy ``tool.preview`` events of a call are shown: the server's choice of frames
without ``local-preview-v1``, and the client's of the previews it makes itself with it, so
the app sees the same previews at the same moments either way."""

from __future__ import annotations

from vrt._core.events import TERMINAL_PHASES, ToolPreview, ToolStream, preview_length

PREVIEW_STEP = 64
"""A preview of a call's growing arguments goes out once they grew this many characters and
a quarter of what was last sent: a geometric series, so the previews of arguments of length
L add up to under 6 L (plus their headers), however many fragments the model sent."""
_COMPLETE = -1


class Previews:
    """Which legacy ``tool.preview`` frames of each call go on the wire.

    Always the first, the one with ``complete: true`` (once: later phases repeat the same
    text), and the last text of a call that ended before its arguments completed; between
    them only when the text grew enough (:data:`PREVIEW_STEP`). The latest text wins, as
    the protocol allows a sender. Per call: the length last sent, forgotten at the call's
    end.
    """

    __slots__ = ("_ending", "_sent")

    def __init__(self) -> None:
        self._sent: dict[str, int] = {}
        self._ending: set[str] = set()

    def stream(self, event: ToolStream) -> None:
        """Note a call's stream event (its terminal phase comes just before its preview)."""
        if event.phase in TERMINAL_PHASES:
            self._ending.add(event.call_id)

    def forget(self, call_id: str) -> None:
        """Drop what is kept of a call that ends with no preview (cancelled locally)."""
        self._sent.pop(call_id, None)
        self._ending.discard(call_id)

    def wanted(self, event: ToolPreview) -> bool:
        """Whether ``event`` goes out."""
        call_id = event.call_id
        last = self._sent.get(call_id)
        size = preview_length(event)
        if call_id in self._ending:  # its last preview: the call is over
            self._ending.discard(call_id)
            self._sent.pop(call_id, None)
            return last is None or (last != _COMPLETE and (event.complete or size != last))
        if last == _COMPLETE:
            return False
        if last is None or event.complete or size - last >= max(PREVIEW_STEP, last // 4):
            self._sent[call_id] = _COMPLETE if event.complete else size
            return True
        return False
