"""The checks, and the drivers that deliver frames to a fresh sans-IO core and check each
answer; a sequence is one fresh core's frames (:func:`server_sequence`,
:func:`client_sequence`)."""

from __future__ import annotations

import contextlib
import copy
import json
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import vrt
from tests.fuzzing.frames import (
    CALL_IDS,
    CLIENT_LONG_BATCHES,
    CLIENT_TYPE_NAMES,
    ERROR_CODES,
    NOT_OBJECT,
    NOT_OBJECT_ITEM,
    SERVER_TYPE_NAMES,
    Chooser,
    Data,
    Frame,
    Frames,
    next_seq,
)
from tests.fuzzing.oracle import (
    BINARY,
    NOT_JSON,
    OBJECT,
    item_texts,
    opens_object,
    oversize,
    parse_frame,
    usable_seq,
    validator,
    verdict,
)
from vrt._wire import codec
from vrt._wire import messages as m
from vrt._wire.client import AbortApp, ClientProtocol, Welcomed
from vrt._wire.server import MAX_MESSAGE_SIZE, ServerProtocol

SERVER_TOOLS = ("weather", "lookup")
T = TypeVar("T")

ERROR_LIMIT = 500
"""The longest error message any check allows (PROTOCOL.md: a short explanation)."""
DECODE_CODES = frozenset({m.TOO_LARGE, m.BAD_JSON, m.BAD_MESSAGE, m.UNKNOWN_TYPE})
"""The codes the codec and the frame checks answer, before any state is looked at."""
HELLO_REFUSALS = frozenset(
    {m.UNSUPPORTED_PROTOCOL, m.TOOL_CONFLICT, m.BAD_MESSAGE, m.RESUME_FAILED}
)
SESSION_ACTIONS = (m.Input, m.Interrupt, m.ToolResultMessage, m.ConfirmReply, m.Close)
"""What the server core may hand its session once the handshake is over."""
CLIENT_EVENTS = (
    vrt.TurnStarted,
    vrt.TurnEnded,
    vrt.TextDelta,
    vrt.ToolStream,
    vrt.ToolPreview,
    vrt.Transcript,
    vrt.AudioDelta,
    vrt.Closed,
    Welcomed,
    AbortApp,
    m.ConfirmRequestMessage,
    m.Error,
)
"""What the client core may hand the app."""
TRACEBACK_MARKS = ("Traceback", 'File "')


# -- checks --------------------------------------------------------------------------------------


class Violation(AssertionError):
    """A core broke one of the checks."""


class Escaped(AssertionError):
    """An exception escaped a core (the original is its ``__cause__``)."""


class Hung(BaseException):
    """A frame took longer than the hang limit (raised by SIGALRM, where there is one).

    A BaseException, so that no ``except Exception`` inside a core can swallow it.
    """


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise Violation(what)


def short(frame: Frame, limit: int = 160) -> str:
    """A frame shown in a failure: its start, and its length if it is long."""
    if len(frame) <= limit:
        return repr(frame)
    return f"{frame[:limit]!r}... ({len(frame):,} long)"


def shown(items: Sequence[Any]) -> str:
    """Messages, events or parsed frames shown in a failure, briefly."""
    parts = []
    for item in items:
        if isinstance(item, dict):
            parts.append(f"{item.get('type')}#{item.get('seq')} {item.get('code', '')}".strip())
        else:
            parts.append(f"{type(item).__name__}#{getattr(item, 'seq', '')}")
    return f"[{', '.join(parts)}]"


def seq_in(frame: Frame) -> int | None:
    """The seq a frame carries, as a core numbers it (None if it has no usable one)."""
    return seq_of(parse_frame(frame))


def seq_of(data: Any) -> int | None:
    """The seq of one parsed message, as a core numbers it (None if it has no usable one)."""
    seq = data.get("seq") if isinstance(data, dict) else None
    if type(seq) is float and seq.is_integer():
        seq = int(seq)
    return seq if type(seq) is int else None


def seqs_in(value: Any) -> list[int]:
    """The usable seqs of a parsed frame: its message's, or each of a batch's."""
    found = (seq_of(item) for item in value) if type(value) is list else (seq_of(value),)
    return [seq for seq in found if seq is not None]


@contextlib.contextmanager
def hang_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`Hung` in the block after ``seconds`` (if the platform has setitimer)."""
    if not seconds or not hasattr(signal, "setitimer"):
        yield
        return

    def hung(signum: int, frame: object) -> None:
        raise Hung(f"over {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Driver:
    """What both sides' drivers share: timing, the outbox checks, numbering."""

    def __init__(self, *, oracle: bool, time_limit: float | None, hang: float | None) -> None:
        self.oracle = oracle
        self.time_limit = time_limit
        """Seconds over which a frame is a :class:`Violation` (None: only counted)."""
        self.hang = hang
        self.elapsed = 0.0
        """How long the last frame or action took."""
        self.last: Frame = ""
        """The last frame delivered."""
        self.quirks: Counter[str] = Counter()
        """Known deviations seen (reported, not yet fixed), which the checks let pass."""
        self.peer_seq = 0
        """The last seq the peer (this driver) numbered a frame with."""
        self.numbered = 0
        """The last numbered frame from the core."""
        self.acked = 0
        """The last ack from the core."""
        self.closed = False
        self.negotiated: tuple[str, ...] | None = None
        """The session's capabilities once welcomed, as PROTOCOL.md negotiates them: the
        intersection of what the hello offered and the other side supports."""
        self.batching = False
        """``batch-v1`` was negotiated: an array is a batch."""
        self.local_previews = False
        """``local-preview-v1`` was negotiated with ``tool-stream-v1``."""
        self.batches = 0
        """Frames read as batches (not counting the probe's)."""
        self.items: Counter[str] = Counter()
        """The outcome of each message of those batches, as if it had come alone."""
        self.probing = False

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` (a core's receive, or an app action), timed; an exception escapes as
        :class:`Escaped`."""
        started = time.perf_counter()
        try:
            with hang_limit(self.hang):
                result = fn()
        except Exception as exc:
            raise Escaped(f"{type(exc).__name__} escaped {what}: {exc}"[:500]) from exc
        finally:
            self.elapsed = time.perf_counter() - started
        if self.time_limit is not None:
            expect(self.elapsed <= self.time_limit, f"{what} took {self.elapsed:.3f} s")
        return result

    def check_frame(self, frame: str, allowed: tuple[type[Any], ...], in_session: bool) -> Data:
        """One frame a core queued: clean, valid against its schema, numbered right."""
        expect(isinstance(frame, str), f"a binary frame: {short(frame)}")
        for mark in TRACEBACK_MARKS:
            expect(mark not in frame, f"{mark!r} in {short(frame)}")
        data: Data = json.loads(frame)
        try:
            codec.decode(frame, allowed)
        except codec.DecodeError as exc:
            if data.get("callId") != "" or data.get("type") != "tool.result":
                raise Violation(f"{short(frame)} does not decode: {exc.message}") from None
            # Known, reported: tool.call allows an empty callId, tool.result does not, and
            # the client answers a stale call with the callId it was given.
            self.quirks["empty callId answered"] += 1
        else:
            if self.oracle:
                problems = [e.message for e in validator(data["type"]).iter_errors(data)]
                expect(not problems, f"{short(frame)} breaks its schema: {problems}")
        if data["type"] == "error":
            expect(data["code"] in ERROR_CODES, f"unknown code in {short(frame)}")
            expect(0 < len(data["message"]) <= ERROR_LIMIT, f"message length: {short(frame)}")
        expect(not self.closed, f"{short(frame)} after closed")
        seq = data["seq"]
        if data["type"] == "ack":
            expect(in_session, f"{short(frame)} outside a session")
            expect(self.acked < seq <= self.peer_seq, f"{short(frame)} after ack {self.acked}")
            self.acked = seq
        elif in_session:
            expect(seq == self.numbered + 1, f"{short(frame)} after seq {self.numbered}")
            self.numbered = seq
        else:
            expect(seq == 0, f"{short(frame)} outside a session must have seq 0")
        if data["type"] == "closed":
            self.closed = True
        return data


class ServerDriver(Driver):
    """A :class:`ServerProtocol` fed frames, every answer checked."""

    def __init__(
        self,
        max_message_size: int = MAX_MESSAGE_SIZE,
        *,
        capabilities: Sequence[str] = m.CAPABILITIES,
        oracle: bool = False,
        time_limit: float | None = None,
        hang: float | None = None,
    ) -> None:
        super().__init__(oracle=oracle, time_limit=time_limit, hang=hang)
        self.max_size = max_message_size
        self.supported = tuple(capabilities)
        self.proto = ServerProtocol(
            session_id="s_fuzz",
            resume_token="tok",
            server_tools=SERVER_TOOLS,
            capabilities=self.supported,
            max_message_size=max_message_size,
        )
        self.got: list[Any] = []
        """What the last frame returned."""
        self.replies: list[Data] = []
        """What the server sent for the last frame, acks left out."""
        self.acks: list[int] = []
        """The seqs of the acks it sent for the last frame."""

    def feed(self, frame: Frame) -> str:
        """Deliver one frame; check everything; return its outcome."""
        proto = self.proto
        state, received, sent_before = proto.state, proto.received_seq, proto.sent_seq
        self.last = frame
        value = parse_frame(frame)
        batch = state == "open" and self.batching and type(value) is list
        read = batch and 0 < len(value) <= m.BATCH_MESSAGES and not oversize(frame, self.max_size)
        twin = copy.deepcopy(self) if read else None  # this driver as it was before the frame
        got = self.call("ServerProtocol.receive", lambda: proto.receive(frame))
        for seq in seqs_in(value):
            self.peer_seq = max(self.peer_seq, seq)
        sent = proto.take_outbox()
        types = [json.loads(f)["type"] for f in sent]
        welcome = types.index("welcome") if "welcome" in types else len(sent)
        out = []
        for i, answer in enumerate(sent):
            in_session = self.numbered > 0 or i >= welcome
            if i < welcome < len(sent) and types[i] == "ack":
                # Known, reported: a hello numbered 50 or more is acked before the welcome
                # (ServerProtocol._hello accepts its seq before it sends the welcome).
                self.quirks["ack before welcome"] += 1
                in_session = True
            out.append(self.check_frame(answer, m.SERVER_TYPES, in_session))
        replies = [f for f in out if f["type"] != "ack"]
        self.got, self.replies = got, replies
        self.acks = [f["seq"] for f in out if f["type"] == "ack"]
        what = f"{short(frame)} in state {state}: returned {shown(got)}, sent {shown(replies)}"
        most = len(value) if batch else 1
        expect(isinstance(got, list) and len(got) <= most, what)
        expect(proto.acked_by_peer <= proto.sent_seq, f"acked beyond sent after {what}")
        expect(len(proto.replay) <= proto.replay_limit, f"replay over its bound after {what}")
        expect(
            proto.replay_bytes == sum(len(f) for _, f in proto.replay)
            and proto.replay_bytes <= proto.replay_limit_bytes,
            f"replay bytes miscounted or over their bound after {what}",
        )
        expect(proto.received_seq >= received, f"received seq went back after {what}")
        if state == "closed":
            expect(not got and not out, f"anything after closed: {what}")
            return "silent (after closed)"
        if welcome < len(sent):
            self._welcomed(value, out[welcome], what)
        carried = len(value) if read else 1
        expect(proto.frame_messages == carried, f"frame_messages {proto.frame_messages}: {what}")
        if batch:
            return self._batch(frame, value, twin, received, got, replies, what)
        self._check_shape(state, received, got, replies, what)
        if (
            value is not NOT_JSON
            and value is not BINARY
            and not isinstance(value, dict)
            and not oversize(frame, self.max_size)
        ):
            # An array without batch-v1 (or before the welcome), or no object at all
            answer = [(r["type"], r["code"], r.get("ref"), r["message"]) for r in replies]
            expect(not got and answer == [("error", m.BAD_MESSAGE, None, NOT_OBJECT)], what)
        if self.oracle:
            self._check_verdict(frame, state, received, got, replies, what, sent_before)
        if replies and replies[-1]["type"] == "closed":
            outcome = f"closed {replies[-1]['reason']}"
        elif replies and replies[0]["type"] == "error":
            outcome = f"error {replies[0]['code']}"
        elif got:
            outcome = f"accepted {got[0].TYPE}"
        else:
            outcome = "silent (replay or ack)"
        return f"array, not a batch: {outcome}" if type(value) is list else outcome

    def _welcomed(self, hello: Any, welcome: Data, what: str) -> None:
        """The session began: its capabilities are the intersection (PROTOCOL.md)."""
        offered = hello.get("capabilities", []) if isinstance(hello, dict) else []
        granted = welcome["capabilities"]
        expected = set(offered) & set(self.supported)
        expect(
            len(set(granted)) == len(granted) and set(granted) == expected,
            f"capabilities {granted} for {offered}, supporting {self.supported}: {what}",
        )
        self.negotiated = tuple(granted)
        self.batching = m.BATCH_V1 in granted
        self.local_previews = m.LOCAL_PREVIEW_V1 in granted and m.TOOL_STREAM_V1 in granted
        expect(self.proto.batching == self.batching, f"batching {self.proto.batching}: {what}")

    def _batch(
        self,
        frame: Frame,
        items: list[Any],
        twin: ServerDriver | None,
        received: int,
        got: list[Any],
        replies: list[Data],
        what: str,
    ) -> str:
        """A batch (``batch-v1``): refused whole (over the size limit, empty, over
        :data:`~vrt._wire.messages.BATCH_MESSAGES` messages), or each message handled in
        order exactly as if it had come alone: the twin (this driver before the frame) is
        given them one by one, each checked as a frame of its own (and by the oracle), and
        the batch must have done what they did, once its ``close`` ended it."""
        proto = self.proto
        answer = [(r["type"], r.get("code"), r.get("ref")) for r in replies]
        if oversize(frame, self.max_size):
            expect(not got and answer == [("error", m.TOO_LARGE, None)], f"batch: {what}")
            return "batch: error TOO_LARGE"
        if twin is None:  # refused whole: none of it read
            # PROTOCOL.md: the error's ref is the seq of the batch's first message (if usable)
            first = usable_seq(items[0]) if items else None
            expect(not got and answer == [("error", m.BAD_MESSAGE, first)], f"batch: {what}")
            expect(proto.received_seq == received, f"a batch refused, yet read: {what}")
            text = replies[0]["message"]
            if not items:
                expect(text == "a batch must hold at least one message", f"{text!r}: {what}")
                return "batch: refused, empty"
            expect(f"at most {m.BATCH_MESSAGES} messages" in text, f"{text!r}: {what}")
            return f"batch: refused, over {m.BATCH_MESSAGES} messages"
        alone_got: list[Any] = []
        alone_replies: list[Data] = []
        alone_acks: list[int] = []
        for item, text in zip(items, item_texts(frame), strict=True):
            # An array alone would be a batch: an item that is no object is given as null.
            outcome = twin.feed(text if isinstance(item, dict) else "null")
            if not isinstance(item, dict):
                outcome = f"not a message: {outcome}"
                for reply in twin.replies:
                    if reply.get("message") == NOT_OBJECT:
                        reply["message"] = NOT_OBJECT_ITEM
            if not self.probing:
                self.items[outcome] += 1
            alone_got += twin.got
            alone_replies += twin.replies
            alone_acks += twin.acks
        if not self.probing:
            self.batches += 1
        where = f"{what}; alone: returned {shown(alone_got)}, sent {shown(alone_replies)}"
        expect(got == alone_got, f"a batch returned otherwise: {where}")
        expect(replies == alone_replies, f"a batch answered otherwise: {where}")
        expect(max(self.acks, default=0) == max(alone_acks, default=0), f"acks: {where}")
        state = (proto.state, proto.received_seq, proto.sent_seq, proto.acked_by_peer)
        t = twin.proto
        expect(state == (t.state, t.received_seq, t.sent_seq, t.acked_by_peer), where)
        errors = any(r["type"] == "error" for r in replies)
        if replies and replies[-1]["type"] == "closed":
            return "batch: closed client"
        if got:
            return "batch: accepted and errors" if errors else "batch: accepted"
        return "batch: errors only" if errors else "batch: silent (replays or acks)"

    def _check_shape(
        self, state: str, received: int, got: list[Any], replies: list[Data], what: str
    ) -> None:
        """What the server may return and send for one frame, whatever the frame."""
        proto = self.proto
        types = [r["type"] for r in replies]
        for message in got:
            if state == "handshaking":
                expect(isinstance(message, m.Hello), what)
                welcomed = proto.state == "open" and types == ["welcome"]
                # A resume is returned, unanswered, for the server to decide which session
                # it resumes (the resume work in progress).
                kept = message.resume is not None and proto.state == "handshaking"
                expect(welcomed or (kept and not replies), what)
                continue
            expect(isinstance(message, SESSION_ACTIONS), what)
            expect(received < message.seq == proto.received_seq, what)
            closing = isinstance(message, m.Close)
            expect(closing == (proto.state == "closed"), what)
            expect(types == (["closed"] if closing else []), what)
            expect(not closing or replies[0]["reason"] == "client", what)
        if "error" in types:
            expect(not got and types[0] == "error", what)
            if len(types) == 2:
                expect(state == "handshaking" and proto.state == "closed", what)
                expect(types[1] == "closed" and replies[1]["reason"] == "rejected", what)
            else:
                expect(types == ["error"], what)
        if "welcome" in types:
            expect(state == "handshaking" and types == ["welcome"] and len(got) == 1, what)

    def _check_verdict(
        self,
        frame: Frame,
        state: str,
        received: int,
        got: list[Any],
        replies: list[Data],
        what: str,
        sent: int,
    ) -> None:
        """The answer is the one the oracle (``json`` and jsonschema) expects (``sent``: the
        last seq the server had sent before the frame)."""
        v = verdict(frame, CLIENT_TYPE_NAMES, self.max_size)
        codes = [r["code"] for r in replies if r["type"] == "error"]
        refs = [r.get("ref") for r in replies if r["type"] == "error"]
        if v.code is not None:
            if state == "open" and v.seq is not None and v.seq <= received:
                expect(not replies, f"a replay answered: {what}")  # answered the first time
                return
            expect(codes == [v.code] and refs == [v.seq], f"expected {v.code} {v.seq}: {what}")
            refused = state == "handshaking" and v.type == "hello"
            expect((len(replies) == 2) == refused, f"closed or not: {what}")
            return
        expect(not set(codes) & {m.TOO_LARGE, m.BAD_JSON, m.UNKNOWN_TYPE}, f"valid: {what}")
        if v.type == "ack":
            above = v.seq is not None and v.seq > sent  # acks what was never sent
            expect(not got and codes == ([m.BAD_MESSAGE] if above else []), what)
        elif state == "handshaking" and v.type != "hello":
            expect(codes == [m.BAD_STATE] and refs == [v.seq], what)
        elif state == "handshaking":
            expect(bool(got) or (len(codes) == 1 and codes[0] in HELLO_REFUSALS), what)
        elif v.seq is not None and v.seq <= received:
            expect(not got and not replies, f"a replay taken: {what}")
        elif v.type == "hello":
            expect(codes == [m.BAD_STATE] and refs == [v.seq], what)
        else:
            expect([(g.TYPE, g.seq) for g in got] == [(v.type, v.seq)], what)

    def probe(self) -> None:
        """The session still works: a valid ``input`` with the next seq is taken (after a
        valid ``hello`` if the handshake is not over), then an ack of everything sent
        empties the replay buffer (with batch-v1 both in one batch). A closed core stays
        silent."""
        proto = self.proto
        if proto.state == "closed":
            outcome = self.feed('{"type":"input","seq":1,"text":"x"}')
            expect(outcome == "silent (after closed)", f"closed, yet {outcome}")
            return
        if proto.state == "handshaking":
            hello = {"type": "hello", "seq": proto.received_seq + 1, "protocol": "vrt/1"}
            outcome = self.feed(json.dumps(hello))
            expect(outcome == "accepted hello" and proto.state == "open", f"probe: {outcome}")
        seq = proto.received_seq + 1
        sent = proto.sent_seq
        data = {"type": "input", "seq": seq, "text": "probe"}
        if self.batching:
            self.probing = True
            outcome = self.feed(json.dumps([data, {"type": "ack", "seq": sent}]))
            self.probing = False
            expect(outcome == "batch: accepted", f"probe batch {seq}: {outcome}")
            expect(proto.sent_seq == sent, "probe input answered")
        else:
            outcome = self.feed(json.dumps(data))
            expect(outcome == "accepted input", f"probe input {seq}: {outcome}")
            expect(proto.sent_seq == sent, "probe input answered")
            outcome = self.feed(json.dumps({"type": "ack", "seq": proto.sent_seq}))
            expect(outcome.startswith("silent"), f"probe ack: {outcome}")
        expect(not proto.replay and proto.acked_by_peer == proto.sent_seq, "probe ack: kept")


class ClientDriver(Driver):
    """A :class:`ClientProtocol` (after its ``hello``) fed server frames and app actions."""

    def __init__(
        self,
        *,
        capabilities: Sequence[str] = m.CAPABILITIES,
        oracle: bool = False,
        time_limit: float | None = None,
        hang: float | None = None,
    ) -> None:
        super().__init__(oracle=oracle, time_limit=time_limit, hang=hang)
        tools = [m.ToolDecl(name="edit", description="", parameters={"type": "object"})]
        self.offered = tuple(capabilities)
        self.proto = ClientProtocol(tools, self.offered)
        self.got: list[Any] = []
        """What the last frame returned."""
        self.sent: list[Data] = []
        """The frames the client queued for the last frame or action."""
        self.proto.hello()
        self.drain()
        self.server_seq = 0
        """The last seq this driver numbered a server frame with."""

    def drain(self) -> None:
        """Check every frame the client queued (the client numbers all but its acks)."""
        self.sent = []
        for frame in self.proto.take_outbox():
            self.peer_seq = self.proto.received_seq  # what its acks may acknowledge
            self.sent.append(self.check_frame(frame, m.CLIENT_TYPES, True))

    def feed(self, frame: Frame) -> str:
        """Deliver one server frame; check everything; return its outcome."""
        proto = self.proto
        received = proto.received_seq
        self.last = frame
        # Parsed here only if it may be no object (parsing every frame would cost a third
        # more); a frame that opens with "{" is an object or not JSON.
        value = OBJECT if opens_object(frame) else parse_frame(frame)
        batch = self.batching and type(value) is list
        twin = copy.deepcopy(self) if batch and value else None  # this driver before the frame
        got = self.call("ClientProtocol.receive", lambda: proto.receive(frame))
        self.drain()
        self.got = got
        what = f"{short(frame)}: returned {shown(got)}"
        expect(isinstance(got, list), what)
        for item in got:
            expect(isinstance(item, CLIENT_EVENTS), f"not an event: {what}")
            if isinstance(item, m.Error) and item.message.startswith("from the server:"):
                # The client's own report of a broken frame (the server's errors are
                # handed on as they came).
                expect(item.code in ERROR_CODES and len(item.message) <= ERROR_LIMIT, what)
                for mark in TRACEBACK_MARKS:
                    expect(mark not in item.message, what)
            if isinstance(item, Welcomed) and not item.resumed:
                self._welcomed(item, what)
        self.check_state(what)
        expect(proto.received_seq >= received, f"received seq went back: {what}")
        if batch:
            return self._batch(frame, value, twin, got, what)
        self._check_previews(value, got, what)
        if value not in (NOT_JSON, OBJECT, BINARY) and not isinstance(value, dict):
            # An array without batch-v1 (or before the welcome), or no object at all
            expect(got == [_local(m.BAD_MESSAGE, NOT_OBJECT)] and not self.sent, what)
        if self.oracle:
            v = verdict(frame, SERVER_TYPE_NAMES)
            if v.code is not None:
                codes = [g.code for g in got if isinstance(g, m.Error)]
                expect(len(got) == 1 and codes == [v.code], f"expected {v.code}: {what}")
            elif v.type != "ack" and v.seq is not None and 0 < v.seq <= received:
                expect(got == [], f"a replay taken: {what}")
        if not got:
            outcome = "silent (replay, ack or dropped)"
        elif isinstance(got[0], m.Error) and got[0].message.startswith("from the server:"):
            outcome = f"local error {got[0].code}"
        elif any(isinstance(g, vrt.Closed) for g in got):
            outcome = "closed"
        else:
            outcome = f"event {type(got[0]).__name__}"
        return f"array, not a batch: {outcome}" if type(value) is list else outcome

    def _welcomed(self, event: Welcomed, what: str) -> None:
        """The session began: its capabilities are the intersection of what the client
        offered and the welcome granted (PROTOCOL.md)."""
        self.negotiated = tuple(c for c in event.capabilities if c in self.offered)
        self.batching = m.BATCH_V1 in self.negotiated
        self.local_previews = (
            m.LOCAL_PREVIEW_V1 in self.negotiated and m.TOOL_STREAM_V1 in self.negotiated
        )
        proto = self.proto
        expect(
            (proto.batching, proto.local_previews) == (self.batching, self.local_previews),
            f"the client's capabilities {event.capabilities} against the intersection: {what}",
        )

    def _check_previews(self, value: Any, got: list[Any], what: str) -> None:
        """Legacy previews: with local-preview-v1 each is made right after a ``tool.stream``
        event of its call (and a wire ``tool.preview`` is dropped); without it they come
        from ``tool.preview`` frames only."""
        if not any(isinstance(event, vrt.ToolPreview) for event in got):
            return
        if value is OBJECT:
            value = parse_frame(self.last)
        kind = value.get("type") if isinstance(value, dict) else None
        for i, event in enumerate(got):
            if not isinstance(event, vrt.ToolPreview):
                continue
            if not self.local_previews:
                expect(kind == "tool.preview" and len(got) == 1, f"a preview made: {what}")
                continue
            before = got[i - 1] if i else None
            expect(
                kind == "tool.stream"
                and isinstance(before, vrt.ToolStream)
                and (before.call_id, before.turn_id, before.name)
                == (event.call_id, event.turn_id, event.name),
                f"a preview not made from its tool.stream (local-preview-v1): {what}",
            )

    def snapshot(self) -> tuple[Any, ...]:
        """What a batch must leave the client as its messages alone would."""
        p = self.proto
        return (
            p.received_seq,
            p.sent_seq,
            p.acked_by_peer,
            p.epoch,
            p.connection.state,
            tuple(p.queue),
            p.running,
            tuple(p.views),
        )

    def _batch(
        self, frame: Frame, items: list[Any], twin: ClientDriver | None, got: list[Any], what: str
    ) -> str:
        """A batch from the server (``batch-v1``): an empty one is reported, the others read
        in order, each message as if it had come alone (the twin, this driver before the
        frame, is given them one by one, each checked as a frame of its own). ``closed`` is
        final (PROTOCOL.md): what follows it in the batch is not read (by the Python client,
        the frames that follow a ``closed`` are not)."""
        sent = [f for f in self.sent if f["type"] != "ack"]
        if twin is None:
            expect(got == [_local(m.BAD_MESSAGE, "an empty batch")] and not sent, what)
            return "batch: empty"
        pieces: list[tuple[list[Any], list[Data], int, tuple[Any, ...]]] = []
        for item, text in zip(items, item_texts(frame), strict=True):
            # An array alone would be a batch: an item that is no object is given as null.
            outcome = twin.feed(text if isinstance(item, dict) else "null")
            events = list(twin.got)
            if not isinstance(item, dict):
                outcome = f"not a message: {outcome}"
                events = [
                    _local(m.BAD_MESSAGE, NOT_OBJECT_ITEM)
                    if e == _local(m.BAD_MESSAGE, NOT_OBJECT)
                    else e
                    for e in events
                ]
            if not self.probing:
                self.items[outcome] += 1
            acks = [f["seq"] for f in twin.sent if f["type"] == "ack"]
            frames = [f for f in twin.sent if f["type"] != "ack"]
            pieces.append((events, frames, max(acks, default=0), twin.snapshot()))
        if not self.probing:
            self.batches += 1

        def alone(upto: int) -> tuple[Any, ...]:
            part = pieces[: upto + 1]
            events = [e for p in part for e in p[0]]
            return events, [f for p in part for f in p[1]], max(p[2] for p in part), part[-1][3]

        closes = (i for i, p in enumerate(pieces) if any(isinstance(e, vrt.Closed) for e in p[0]))
        end = next(closes, len(pieces) - 1)
        acked = max((f["seq"] for f in self.sent if f["type"] == "ack"), default=0)
        actual = (got, sent, acked, self.snapshot())
        expected = alone(end)
        expect(
            actual == expected,
            f"{what}; alone up to closed: {shown(expected[0])}, sent {shown(expected[1])}",
        )
        if any(isinstance(g, vrt.Closed) for g in got):
            return "batch: closed"
        local = [isinstance(g, m.Error) and g.message.startswith("from the server:") for g in got]
        if not got:
            return "batch: silent (replays, acks or dropped)"
        return "batch: local errors only" if all(local) else "batch: events"

    def check_state(self, what: str) -> None:
        proto = self.proto
        expect(proto.acked_by_peer <= proto.sent_seq, f"acked beyond sent: {what}")
        expect(proto.running is None or proto.running in proto.app_calls, f"running: {what}")
        expect(all(c in proto.app_calls for c in proto.queue), f"queue: {what}")

    def act(self, c: Chooser) -> str:
        """One of the app's own actions, checked like a frame; return its name."""
        proto = self.proto
        action = c.pick(("run", "answer", "fail", "interrupt", "input", "confirm"))
        if action == "run":
            self.call("next_app_call", proto.next_app_call)
        elif action in ("answer", "fail"):
            running = proto.running
            if running is None:
                return "nothing to answer"
            result = (
                vrt.ToolResult.success({"ok": 1})
                if action == "answer"
                else vrt.ToolResult.failure(vrt.ResultCode.FAILED, "no")
            )
            self.call("answer", lambda: proto.answer(running, result))
        elif action == "interrupt":
            self.call("interrupt", proto.interrupt)
        elif action == "input":
            self.call("send_input", lambda: proto.send_input("more"))
        else:
            call_id = c.pick(CALL_IDS)
            self.call("confirm_reply", lambda: proto.confirm_reply(call_id, True))
        self.drain()
        self.check_state(f"after {action}")
        return action

    def probe(self) -> None:
        """The client still works: a ``text.delta`` with the next seq (with batch-v1, a
        batch of it) is handed on, and an ack of everything it sent empties its replay
        buffer."""
        proto = self.proto
        seq = proto.received_seq + 1
        delta = {"type": "text.delta", "seq": seq, "turnId": "t", "text": "probe"}
        frame = json.dumps([delta] if self.batching else delta)
        got = self.call("receive", lambda: proto.receive(frame))
        expect(got == [vrt.TextDelta(turn_id="t", text="probe")], f"probe: {shown(got)}")
        self.drain()
        self.feed(json.dumps({"type": "ack", "seq": proto.sent_seq}))
        expect(not proto.replay and proto.acked_by_peer == proto.sent_seq, "probe ack: kept")


def _local(code: str, text: str) -> m.Error:
    """The client's own report of a broken server frame."""
    return m.Error(seq=0, code=code, message=f"from the server: {text}")


# -- sequences -----------------------------------------------------------------------------------


def server_sequence(
    c: Chooser, frames: Frames, driver: ServerDriver, count: Callable[[str], None]
) -> None:
    """One sequence to a fresh server core: frames before ``hello``, a ``hello``, frames in
    the session (with batch-v1, a third of them batches); ``count`` gets each frame's
    outcome. Ends with :meth:`ServerDriver.probe`."""
    proto = driver.proto
    weights = ("input",) * 4 + ("interrupt", "tool.result", "confirm.reply", "ack", "hello")

    def frame_of(type_: str) -> Frame:
        seq = next_seq(c, driver.peer_seq)
        data = frames.client_message(type_, seq, proto.sent_seq)
        return frames.frame(data)

    def batch() -> Frame:
        last = driver.peer_seq

        def message(type_: str | None) -> Data:
            nonlocal last
            seq = next_seq(c, last)
            last = max(last, seq)
            type_ = type_ or ("close" if c.chance(3) else c.pick(weights))
            return frames.client_message(type_, seq, proto.sent_seq)

        return frames.batch(message, "close", "input")

    for _ in range(c.pick((0, 0, 0, 1, 2))):
        count(driver.feed(batch() if c.chance(5) else frame_of(c.pick(CLIENT_TYPE_NAMES))))
    hello = frames.hello(c.pick((1, 1, 1, 0, 2, 7)))
    count(driver.feed(frames.valid(hello) if c.chance(80) else frames.mutant(hello)))
    for _ in range(c.integer(1, 8)):
        if c.chance(35 if driver.batching else 3):  # arrays without batch-v1 too
            count(driver.feed(batch()))
            continue
        type_ = "close" if c.chance(3) else c.pick(weights)
        count(driver.feed(frame_of(type_)))
    driver.probe()


def client_sequence(
    c: Chooser, frames: Frames, driver: ClientDriver, count: Callable[[str], None]
) -> None:
    """One sequence to a client core that sent its ``hello``: a ``welcome`` (mostly valid),
    server frames (with batch-v1, a third of them batches) and app actions; ends with
    :meth:`ClientDriver.probe`."""
    proto = driver.proto
    weights = ("tool.stream",) * 4 + ("tool.call",) * 2 + SERVER_TYPE_NAMES

    def message(type_: str | None) -> Data:
        type_ = type_ or c.pick(weights)
        seq = next_seq(c, driver.server_seq)
        if type_ == "ack":
            seq = 0
        else:
            driver.server_seq = max(driver.server_seq, seq)
        return frames.server_message(type_, seq, proto.epoch, proto.sent_seq)

    def batch() -> Frame:
        frame = frames.batch(message, "closed", "text.delta", CLIENT_LONG_BATCHES)
        seqs = [s for s in seqs_in(parse_frame(frame)) if s <= 2**53]  # a long batch's too
        driver.server_seq = max([driver.server_seq, *seqs])
        return frame

    welcome = frames.server_message("welcome", 1, 0, 0)
    driver.server_seq = 1
    count(driver.feed(frames.valid(welcome) if c.chance(85) else frames.mutant(welcome)))
    for _ in range(c.integer(1, 10)):
        if c.chance(35 if driver.batching else 3):  # arrays without batch-v1 too
            count(driver.feed(batch()))
        else:
            count(driver.feed(frames.frame(message(c.pick(weights)))))
        if c.chance(30):
            driver.act(c)
    driver.probe()
