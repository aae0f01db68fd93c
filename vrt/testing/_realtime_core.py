"""What both of :class:`~vrt.testing.FakeRealtime`'s servers share, with no I/O.

Each API's server (``_realtime_openai``, ``_realtime_gemini``) is a plain object per
connection: a decoded client message in, server messages out. It answers at once through
its *outbox* (acknowledgements, errors) and plays a response through its *plan*, a queue of
thunks and pauses pulled one at a time: a thunk builds its message and updates the
server's record of what was sent (the audio an item holds, the arguments streamed so far)
when it is pulled, so a cancel always knows exactly where the response stood. The outbox
goes before the plan. The Trio shell (``_realtime``) only pumps :meth:`ServerCore.pull`,
sleeping until the time it returns or until something arrives.

Also here: the script cursor shared by every connection, the tone the fake speaks with,
and the voice detector that hears the user in the audio a client sends.
"""

from __future__ import annotations

import math
import re
import sys
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from vrt.models._scripted import Say, ScriptedCall, ScriptItem, script_steps

Message = dict[str, Any]
"""One JSON message, decoded."""
Thunk = Callable[[], Message | None]
"""A plan entry that builds (and accounts for) one message when it is pulled; None: nothing
to send after all."""

OUTPUT_RATE = 24000
"""Both APIs speak PCM16 mono at 24 kHz."""
WORD_MS = 60
"""How long the fake takes to say one word."""
QUIRKS = frozenset(
    {"no-created", "no-cancellation", "late-cancellation", "duplicate-call", "late-done"}
)


@attrs.frozen(kw_only=True)
class Config:
    """The fake's settings, the same for every connection."""

    audio: bool
    quirks: frozenset[str]
    vad_threshold: float
    chunk_ms: int
    delay: float


class Script:
    """The steps every connection plays, one per response, in order across connections (a
    reconnect goes on where the last connection was); then ``say("ok")`` for ever."""

    def __init__(self, steps: Sequence[Sequence[ScriptItem]]) -> None:
        self.steps = script_steps(steps)
        self.served = 0
        self._ids = 0

    def next_step(self) -> list[ScriptItem]:
        """The next step to play (counted as a response started)."""
        step: list[ScriptItem] = [Say(text="ok")]
        if self.served < len(self.steps):
            step = self.steps[self.served]
        self.served += 1
        return step

    def new_id(self, prefix: str) -> str:
        """An id no other connection of this fake has seen (servers' ids are global)."""
        self._ids += 1
        return f"{prefix}{self._ids:04d}"

    def call_id(self, item: ScriptedCall, prefix: str) -> str:
        """A call's id: the script's, else a new one."""
        return item.call_id or self.new_id(prefix)


class ServerCore:
    """The outbox, the plan and :meth:`pull`; an API's server adds what its messages mean."""

    binary = False
    """Whether messages go out as binary frames (Gemini's do) rather than text."""

    def __init__(self, script: Script, config: Config, violations: list[str]) -> None:
        self.script = script
        self.config = config
        self.violations = violations
        self.outbox: deque[Message] = deque()
        self.plan: deque[Thunk | float] = deque()
        self.closing: tuple[int, str] | None = None
        """Set when the server must close the connection: (code, reason)."""
        self.audio_received = 0
        """Bytes of audio the client sent (decoded)."""
        self._until: float | None = None

    def violation(self, text: str) -> None:
        """Record a protocol misuse of the client."""
        self.violations.append(text)

    def pull(self, now: float) -> Message | float | None:
        """The next message to send; or the time until which the plan pauses (pull again
        then, or sooner if something arrives); or None: nothing to do until something
        arrives."""
        if self.outbox:
            return self.stamp(self.outbox.popleft())
        while self.plan:
            head = self.plan[0]
            if isinstance(head, float):
                if self._until is None:
                    self._until = now + head
                if now < self._until:
                    return self._until
                self._until = None
                self.plan.popleft()
                continue
            self.plan.popleft()
            message = head()
            if message is not None:
                return self.stamp(message)
        return None

    def replace_plan(self, entries: Sequence[Thunk | float] = ()) -> None:
        """Drop what the plan still held (a pause too) and play ``entries`` instead."""
        self.plan.clear()
        self._until = None
        self.plan.extend(entries)

    def paced(self, thunks: Sequence[Thunk | float]) -> list[Thunk | float]:
        """``thunks`` with the fake's ``delay`` before each message."""
        if not self.config.delay:
            return list(thunks)
        paced: list[Thunk | float] = []
        for entry in thunks:
            if not isinstance(entry, float):
                paced.append(float(self.config.delay))
            paced.append(entry)
        return paced

    def stamp(self, message: Message) -> Message:
        """The message as it goes out (OpenAI numbers its events)."""
        return message

    @property
    def awaiting_setup(self) -> bool:
        """Whether the client's first message is still due (Gemini's ``setup``)."""
        return False

    # -- what the shell and the test tell every server -------------------------------------------

    def opened(self) -> None:
        """The WebSocket is open."""

    def receive(self, message: Any) -> None:
        """One decoded client message."""
        raise NotImplementedError

    def malformed(self, reason: str) -> None:
        """A frame that is not a JSON object."""
        raise NotImplementedError

    def speech_started(self) -> None:
        """The server's voice detector heard the user start."""
        raise NotImplementedError

    def speech_stopped(self) -> None:
        """The server's voice detector heard the user stop."""
        raise NotImplementedError

    def user_said(self, text: str) -> None:
        """What the transcription of the user's next utterance says."""
        raise NotImplementedError


# -- speech out --------------------------------------------------------------------------------

_TONE_HZ = 400  # 60 samples a period at 24 kHz: a chunk of any whole ms starts in phase
_PERIOD = OUTPUT_RATE // _TONE_HZ
_WAVE = array(
    "h", (round(0.3 * 32767 * math.sin(2 * math.pi * i / _PERIOD)) for i in range(_PERIOD))
)
if sys.byteorder == "big":  # pragma: no cover
    _WAVE.byteswap()
_WAVE_BYTES = _WAVE.tobytes()


def tone(start: int, count: int) -> bytes:
    """``count`` samples of the fake's voice (a 400 Hz sine at amplitude 0.3, PCM16
    little-endian mono at 24 kHz), from sample ``start`` of the utterance on."""
    offset = start % _PERIOD
    periods = (offset + count) // _PERIOD + 1
    return (_WAVE_BYTES * periods)[2 * offset : 2 * (offset + count)]


def words(text: str) -> list[str]:
    """``text`` in pieces of one word each (with the spaces after it): what a model
    streams, and what takes :data:`WORD_MS` to say. Joined, they give ``text`` back."""
    return re.findall(r"\S+\s*|\s+", text)


@attrs.frozen(kw_only=True)
class Chunk:
    """A piece of an utterance: the transcript to send before its audio, and its samples."""

    transcript: str
    start: int
    samples: int


def utterance(text: str, chunk_ms: int) -> list[Chunk]:
    """How the fake says ``text``: :data:`WORD_MS` a word, in chunks of ``chunk_ms``, each
    word's transcript sent before the chunk its sound starts in."""
    pieces = words(text)
    spoken = [piece for piece in pieces if piece.strip()]
    per_word = OUTPUT_RATE * WORD_MS // 1000
    per_chunk = max(1, OUTPUT_RATE * chunk_ms // 1000)
    total = per_word * len(spoken)
    chunks: list[Chunk] = []
    waiting = deque(pieces)
    word = 0
    for start in range(0, total, per_chunk):
        said = ""
        while waiting and (not waiting[0].strip() or word * per_word < start + per_chunk):
            piece = waiting.popleft()
            said += piece
            word += bool(piece.strip())
        chunks.append(Chunk(transcript=said, start=start, samples=min(per_chunk, total - start)))
    if waiting:
        if chunks:
            last = chunks[-1]
            chunks[-1] = attrs.evolve(last, transcript=last.transcript + "".join(waiting))
        else:
            chunks.append(Chunk(transcript="".join(waiting), start=0, samples=0))
    return chunks


# -- speech in ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Heard:
    """What the voice detector heard: the user ``started`` or stopped speaking, ``at_ms``
    into the audio the connection received."""

    started: bool
    at_ms: int


class VoiceDetector:
    """An energy-based voice detector over PCM16 little-endian mono.

    Theory: the audio is cut into windows of ``window_ms``; a window is loud when the RMS
    of its samples (on a scale where full scale is 1.0) is above ``threshold``. While
    quiet, ``start_ms`` of loud windows in a row mean the user started, at the first of
    them; while speaking, ``stop_ms`` of quiet windows in a row mean the user stopped, at
    the end of the last. Time is the audio's own (samples received), never the clock's,
    so a test can send seconds of audio at once. Invariant: ``started`` and stopped
    alternate, starting with started.
    """

    def __init__(
        self,
        rate: int,
        threshold: float,
        *,
        start_ms: int = 100,
        stop_ms: int = 300,
        window_ms: int = 20,
    ) -> None:
        self.rate = rate
        self.threshold = threshold
        self.start_ms = start_ms
        self.stop_ms = stop_ms
        self.window = max(1, rate * window_ms // 1000)
        self.speaking = False
        self._rest = b""
        self._samples = 0  # windows done so far, in samples
        self._run = 0  # samples in the current run of loud (quiet) or quiet (speaking) windows

    @property
    def heard_ms(self) -> int:
        """Milliseconds of audio judged so far."""
        return self._samples * 1000 // self.rate

    def force(self, speaking: bool) -> None:
        """The test says the user started (stopped): judge what follows from there."""
        self.speaking = speaking
        self._run = 0

    def feed(self, pcm: bytes) -> list[Heard]:
        """Judge ``pcm`` (any length; a partial window waits for the next call)."""
        data = self._rest + pcm
        size = 2 * self.window
        whole = len(data) - len(data) % size
        self._rest = data[whole:]
        heard: list[Heard] = []
        for offset in range(0, whole, size):
            samples = array("h", data[offset : offset + size])
            if sys.byteorder == "big":  # pragma: no cover
                samples.byteswap()
            rms = math.sqrt(sum(s * s for s in samples) / len(samples)) / 32768
            loud = rms > self.threshold
            self._samples += self.window
            if loud != self.speaking:
                self._run += self.window
            else:
                self._run = 0
            limit = self.stop_ms if self.speaking else self.start_ms
            if self._run * 1000 >= limit * self.rate:
                at = self._samples - (0 if self.speaking else self._run)
                self.speaking = not self.speaking
                self._run = 0
                heard.append(Heard(started=self.speaking, at_ms=at * 1000 // self.rate))
        return heard
