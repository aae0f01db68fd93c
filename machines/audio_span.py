"""AudioSpan: one turn's voice on the wire (``audio-v1``), on either side.

Theory of operation. A turn that may speak has a span from its start. The server's span is
``quiet`` until the model's first audio of the turn: ``speak`` then moves it to
``speaking``, and that first move is what sends ``audio.start`` before the frame; later
frames ``speak`` again and go as they are. When the turn ends, ``end`` closes the span: a
span that spoke is ``ended`` (``audio.end`` goes, with ``sentMs``); one that never spoke is
``unheard`` (nothing goes: it had no span on the wire).

The client's span is the server's as seen from the wire: ``audio.start`` opens one
(``speak``: ``quiet`` to ``speaking``), each binary frame is a ``speak`` it must take (a
frame when no span is ``speaking`` is the server's error, BAD_MESSAGE), and ``audio.end`` or
the turn's ``turn.ended`` ends it.

Whether a frame plays is the epoch gate's, not this machine's: a span of an interrupted
turn still takes its frames, and the gate drops them.

Invariants:

- ``audio.start`` goes once per span, before its first frame;
- ``audio.end`` goes once, and only for a span that spoke;
- no frame is taken outside a speaking span, nor after its end.
"""

from statemachine import State

from machines.base import VrtChart


class AudioSpan(VrtChart):
    """One turn's audio span on the wire."""

    quiet = State(initial=True)
    speaking = State()
    ended = State(final=True)
    unheard = State(final=True)

    speak = quiet.to(speaking) | speaking.to.itself()
    end = speaking.to(ended) | quiet.to(unheard)
