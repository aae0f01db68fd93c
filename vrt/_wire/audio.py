"""``audio-v1``, sans-IO: what an audio frame may be, and the books each side keeps of them.

Once ``audio-v1`` is negotiated a binary frame is audio: PCM16 little-endian mono at its
direction's rate (``welcome.audio``), a whole number of samples, at most :data:`FRAME_MS`
milliseconds. Audio is realtime data: never numbered, acked or replayed. Here, with no
socket and no clock of its own (the caller says what time it is):

- the frame rules (:func:`frame_limit`, :func:`refusal`, :func:`split`);
- :class:`ByteRate`, the bound of one direction in bytes per second (a token bucket);
- :class:`Backlog`, the model's voice queued for one connection's writer, bounded in
  bytes: past the bound the oldest audio of the turn being added goes first (counted),
  so a client that does not read its audio costs a bounded amount of memory and never
  holds the engine;
- :class:`Spans`, the server's books of each turn's audio: ``audio.start`` before its
  first frame, ``audio.end`` with ``sentMs`` after its last, the epoch gate;
- :class:`Gate`, the client's: a frame plays only inside its turn's span and only while
  that turn's epoch is the client's (audio that crossed an ``interrupt`` is dropped).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import attrs

from vrt._core.tables import AUDIO_SPAN, Machine, StrictMachine
from vrt._wire import messages as m

FORMAT = "pcm16"
"""The only audio format of ``audio-v1``: PCM16, little-endian, mono."""
FRAME_MS = 100
"""The longest audio frame, in milliseconds of its direction's rate."""
SPEED_LIMIT = 4.0
"""Default bound of each direction: this many times real time (``audio_speed_limit``)."""
RATE_WINDOW = 2.0
"""Seconds the byte rate is averaged over: a burst of this long at the bound passes."""
VOICE_BACKLOG_SECONDS = 10.0
"""The model's voice one connection may hold unwritten (a client that does not read)."""
MIC_BACKLOG_SECONDS = 5.0
"""The user's voice the Python client holds unwritten (a slow connection)."""


@attrs.frozen(kw_only=True)
class AudioInfo:
    """The audio of a session (``audio-v1``): PCM16 little-endian mono, the user's voice at
    ``input_rate`` samples a second (what ``send_audio`` takes), the model's at
    ``output_rate`` (what :class:`~vrt.AudioDelta` events carry)."""

    input_rate: int
    output_rate: int
    format: str = FORMAT

    def spec(self) -> m.AudioSpec:
        """As ``welcome.audio`` has it."""
        return m.AudioSpec(
            input=m.AudioStream(format=self.format, rate=self.input_rate),
            output=m.AudioStream(format=self.format, rate=self.output_rate),
        )

    @classmethod
    def of(cls, spec: m.AudioSpec) -> AudioInfo:
        """The record of ``welcome.audio``."""
        return cls(input_rate=spec.input.rate, output_rate=spec.output.rate)


@attrs.frozen(kw_only=True)
class AudioIn:
    """An audio frame from the client that passed the rules: the session hears ``pcm``."""

    pcm: bytes = attrs.field(repr=lambda pcm: f"<{len(pcm)} bytes>")


# -- frames ---------------------------------------------------------------------------------------


def bytes_per_second(rate: int) -> int:
    """Bytes a second of PCM16 mono at ``rate``."""
    return 2 * rate


def frame_limit(rate: int) -> int:
    """The most bytes one frame holds at ``rate``: :data:`FRAME_MS` of samples."""
    return 2 * max(1, rate * FRAME_MS // 1000)


def milliseconds(size: int, rate: int) -> float:
    """How long ``size`` bytes of PCM16 mono at ``rate`` last, in milliseconds."""
    return size * 1000 / bytes_per_second(rate)


def refusal(size: int, rate: int) -> tuple[str, str] | None:
    """The error (code, message) an audio frame of ``size`` bytes at ``rate`` gets, or
    None if it is a frame of the rules: an odd size is ``BAD_MESSAGE`` (no whole number
    of samples), over :func:`frame_limit` ``TOO_LARGE``."""
    if size % 2:
        return (
            m.BAD_MESSAGE,
            f"an audio frame of {size} bytes: PCM16 takes a whole number of 2-byte samples",
        )
    limit = frame_limit(rate)
    if size > limit:
        return (
            m.TOO_LARGE,
            f"an audio frame of {size} bytes is over {FRAME_MS} ms ({limit} bytes at {rate} Hz)",
        )
    return None


def split(pcm: bytes, rate: int) -> Iterator[bytes]:
    """``pcm`` (PCM16) in frames of at most :func:`frame_limit` bytes, in order."""
    limit = frame_limit(rate)
    if len(pcm) <= limit:
        yield pcm
        return
    for start in range(0, len(pcm), limit):
        yield pcm[start : start + limit]


# -- the bound in bytes per second ----------------------------------------------------------------


class ByteRate:
    """``rate`` bytes a second on average, ``burst`` bytes at once: a token bucket that
    decides; its owner acts (refuses the frame, or waits)."""

    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at = now

    @classmethod
    def for_audio(cls, sample_rate: int, speed: float, now: float) -> ByteRate:
        """``speed`` times real time of PCM16 at ``sample_rate``, averaged over
        :data:`RATE_WINDOW` seconds."""
        rate = speed * bytes_per_second(sample_rate)
        return cls(rate, rate * RATE_WINDOW, now)

    def _refill(self, now: float) -> None:
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def wait(self, size: int, now: float) -> float:
        """Seconds until ``size`` bytes may pass (0: now); nothing is taken."""
        self._refill(now)
        missing = min(size, self.burst) - self._tokens
        return max(0.0, missing / self.rate)

    def take(self, size: int, now: float) -> bool:
        """Take ``size`` bytes if they fit now; False (nothing taken) if over the bound."""
        self._refill(now)
        if size > self._tokens:
            return False
        self._tokens -= size
        return True

    def charge(self, size: int, now: float) -> None:
        """``size`` bytes passed (after :meth:`wait` said they may)."""
        self._refill(now)
        self._tokens -= size


# -- the model's voice queued for one connection --------------------------------------------------


class AudioRun:
    """Frames of one turn's audio in a row in a connection's queue, between two text frames.

    The queue holds the run itself; its writer takes the frames one at a time
    (:meth:`peek`, :meth:`take`) while the :class:`Backlog` may drop the oldest or purge
    them all meanwhile. Frames added while the run is last in the queue join it, so a run
    costs the queue one entry however long it is. Once the writer finds it empty, it is
    ``done`` and takes no more.
    """

    __slots__ = ("_backlog", "done", "frames", "key")

    def __init__(self, backlog: Backlog, key: str) -> None:
        self._backlog = backlog
        self.key = key
        """The turn the frames are of."""
        self.frames: deque[bytes] = deque()
        self.done = False

    def peek(self) -> int | None:
        """The size of the next frame, or None: the run is over (``done``)."""
        if self.frames:
            return len(self.frames[0])
        self.done = True
        return None

    def take(self) -> bytes:
        """The next frame, out of the backlog (the writer sends it now)."""
        frame = self.frames.popleft()
        self._backlog.bytes -= len(frame)
        return frame


class Backlog:
    """The audio queued for one connection's writer and not yet written, at most
    ``limit`` bytes.

    :meth:`add` queues a frame: it joins the last run if nothing was queued after that
    run (:meth:`cut` says something was), else it starts a new one, which the caller puts
    in the connection's queue. Past ``limit`` the oldest frames of the same turn are
    dropped first (the newest frame itself if it is the turn's only one); frames of other
    turns, whose ``audio.end`` may be queued already with the sum of them, are never
    dropped, and hold at most ``limit`` between them.
    """

    __slots__ = ("_last", "_runs", "bytes", "dropped", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        """Bytes queued, not yet taken by the writer."""
        self.dropped = 0
        """Bytes dropped to keep under ``limit`` (and purged), since the connection began."""
        self._runs: deque[AudioRun] = deque()  # runs not done, in queue order
        self._last: AudioRun | None = None  # the run nothing was queued after

    def cut(self) -> None:
        """Something else was queued after the audio: the next frame starts a new run."""
        self._last = None

    def add(self, key: str, frame: bytes) -> tuple[AudioRun | None, int]:
        """Queue ``frame`` of turn ``key``: the new run to put in the connection's queue
        (None if it joined the last one), and the bytes of turn ``key`` dropped for it."""
        run = self._last
        new = None
        if run is None or run.done or run.key != key:
            runs = self._runs
            while runs and runs[0].done:  # the writer is done with them (in queue order)
                runs.popleft()
            run = new = self._last = AudioRun(self, key)
            runs.append(run)
        run.frames.append(frame)
        self.bytes += len(frame)
        dropped = 0
        if self.bytes > self.limit:
            dropped = self._drop_oldest(key, self.bytes - self.limit)
        return new, dropped

    def _drop_oldest(self, key: str, excess: int) -> int:
        dropped = 0
        for run in self._runs:
            if run.key != key:
                continue
            frames = run.frames
            while frames and dropped < excess:
                dropped += len(frames.popleft())
            if dropped >= excess:
                break
        self.bytes -= dropped
        self.dropped += dropped
        return dropped

    def purge(self, key: str) -> int:
        """Drop every queued frame of turn ``key`` (it was interrupted); their bytes."""
        purged = 0
        for run in self._runs:
            if run.key == key and run.frames:
                purged += sum(len(frame) for frame in run.frames)
                run.frames.clear()
        self.bytes -= purged
        self.dropped += purged
        return purged


# -- the server's books of each turn's audio ------------------------------------------------------


@attrs.define
class Span:
    """One open turn's audio, as the server sends it."""

    epoch: int
    machine: Machine | StrictMachine = attrs.field(factory=AUDIO_SPAN.new)
    """Its AudioSpan machine: ``quiet`` until its ``audio.start`` is sent."""
    sent: int = 0
    """Bytes of it queued on a connection, less those dropped or purged since."""


class Spans:
    """The server's books of its turns' audio (the session's: they outlive connections).

    A turn has a span from its ``turn.started`` to its ``turn.ended`` (two may overlap: the
    model opens a turn while the one it interrupted unwinds). :meth:`admit` decides what
    one piece of the model's voice becomes; :meth:`end` what its turn's end says.
    """

    START = "start"
    GO = "go"

    __slots__ = ("_spans", "rate")

    def __init__(self, rate: int) -> None:
        self.rate = rate
        """The model's output rate (samples per second)."""
        self._spans: dict[str, Span] = {}

    def started(self, turn_id: str, epoch: int) -> None:
        """The turn started, in ``epoch``."""
        self._spans[turn_id] = Span(epoch=epoch)

    def admit(self, turn_id: str, epoch: int) -> str | None:
        """What a piece of turn ``turn_id``'s audio becomes while the session is in
        ``epoch``: :attr:`START` (``audio.start`` goes first), :attr:`GO`, or None:
        dropped (its turn ended, or its epoch is behind: it was interrupted)."""
        span = self._spans.get(turn_id)
        if span is None or span.epoch < epoch:
            return None
        quiet = span.machine.state == "quiet"
        span.machine.send("speak")  # the first speak is what sends audio.start
        return self.START if quiet else self.GO

    def epoch(self, turn_id: str) -> int:
        """The epoch of an open turn."""
        return self._spans[turn_id].epoch

    def sent(self, turn_id: str, size: int) -> None:
        """``size`` bytes of the turn's audio were queued on a connection (negative: that
        many of those were dropped or purged since)."""
        span = self._spans.get(turn_id)
        if span is not None:
            span.sent += size

    def sent_ms(self, turn_id: str) -> int:
        """Whole milliseconds of the turn's audio sent so far (0 for a turn with none)."""
        span = self._spans.get(turn_id)
        if span is None:
            return 0
        return span.sent * 1000 // (2 * self.rate)

    def heard(self, turn_id: str | None, heard_ms: int | None) -> int | None:
        """What the client's ``heardMs`` means for the open turn ``turn_id``: at most what
        was sent of it (None: no turn, or no ``heardMs``)."""
        if turn_id is None or heard_ms is None:
            return None
        return min(heard_ms, self.sent_ms(turn_id))

    def opened(self) -> list[str]:
        """The turns whose spans are open (their ``audio.start`` sent)."""
        return [t for t, span in self._spans.items() if span.machine.state == "speaking"]

    def end(self, turn_id: str) -> int | None:
        """The turn ended: the ``sentMs`` its ``audio.end`` carries, or None if it sent no
        ``audio.start`` (then it has no span on the wire)."""
        sent_ms = self.sent_ms(turn_id)
        span = self._spans.pop(turn_id, None)
        if span is None or span.machine.send("end") != "ended":
            return None  # (unheard: it never spoke)
        return sent_ms


# -- the client's gate ----------------------------------------------------------------------------


class Gate:
    """Which of the server's audio frames the client's app gets.

    A frame belongs to the span ``audio.start`` opened (its turn and epoch, its AudioSpan
    machine ``speaking``) until that turn's ``audio.end`` (or ``turn.ended``) ends it; it
    plays only while the span's epoch is the client's: a user interrupt raises the client's
    epoch at once, so audio of the interrupted turn still on the wire is dropped here.
    """

    __slots__ = ("epoch", "span", "turn_id")

    def __init__(self) -> None:
        self.turn_id: str | None = None
        """The turn of the last span opened, if it has not ended."""
        self.span: Machine | StrictMachine | None = None
        """Its AudioSpan machine."""
        self.epoch = 0

    def start(self, turn_id: str, epoch: int) -> None:
        """``audio.start``: a new span (one still open is over: its ``audio.end`` went
        with a node that failed, or two turns' spans overlap, and frames follow the new)."""
        if self.span is not None and self.span.can("end"):
            self.span.send("end")
        self.turn_id, self.epoch = turn_id, epoch
        self.span = AUDIO_SPAN.new()
        self.span.send("speak")

    def end(self, turn_id: str) -> None:
        """``audio.end`` (or ``turn.ended``) of ``turn_id``: its span is over."""
        if self.turn_id == turn_id and self.span is not None:
            self.span.send("end")
            self.turn_id = None

    def admits(self, epoch: int) -> str | None:
        """The turn a frame that arrives now plays for, while the client is in ``epoch``;
        None: dropped (outside a span, or the span's epoch is behind)."""
        if not self.open:
            return None
        assert self.span is not None
        self.span.send("speak")
        if self.epoch < epoch:
            return None
        return self.turn_id

    @property
    def open(self) -> bool:
        """Whether a span is open: its machine takes a frame (``speak``)."""
        return self.span is not None and self.span.can("speak")
