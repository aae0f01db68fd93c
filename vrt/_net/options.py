"""The server's options, each declared once: its name, type, default, check, documentation
and ``vrt serve`` flag.

A server option is a field of an attrs record with an :class:`About` in its metadata
(:func:`option`). :class:`Options` holds those every front takes (``vrt.serve`` and
``vrt.asgi.app``: the hub, its actors and links read them); ``vrt._server.options``
declares those only ``vrt.serve`` takes (its listeners, TLS, the store), with the same
:func:`option`. Everything else is made from these declarations: the checks
(:func:`make_options`), the typed keywords of ``vrt.serve`` and ``vrt.asgi.app`` (the
TypedDicts of ``vrt/_server/option_types.py``, which ``vrt diagrams`` generates and
``vrt diagrams --check`` keeps current), their ``inspect.signature``, the API reference
(the TypedDicts' field docstrings are the :attr:`About.doc` paragraphs) and the flags of
``vrt serve`` (``vrt._cli.flags``), including what ``vrt serve --workers`` passes on to
each worker. A new option is one more field here (or there), then ``vrt diagrams``.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import attrs

from vrt._net import metrics as metrics_page
from vrt._net.proxied import Networks, networks, read_networks
from vrt._wire import messages as m
from vrt._wire.audio import RATE_WINDOW, SPEED_LIMIT, VOICE_BACKLOG_SECONDS
from vrt._wire.endpoint import REPLAY_LIMIT, REPLAY_LIMIT_BYTES
from vrt._wire.server import MAX_MESSAGE_SIZE

if TYPE_CHECKING:
    from vrt._net.upgrade import Authenticate

HIGH_WATER = 4000
"""Unacked messages at which the model is held (under the replay buffer's 10,000)."""
MIN_MESSAGE_SIZE = 1024
"""The smallest ``max_message_size``: every frame the server makes itself must fit."""

GROUPS = {
    "serving": "Serving",
    "safety": "Safety",
    "observability": "Observability",
    "production": "Serving in production (docs/deploy.md)",
}
"""The sections options are documented in (``About.group``), in their order."""

_KEY = "vrt"
"""The key of an option's :class:`About` in its attrs field's metadata."""

R = TypeVar("R", bound=attrs.AttrsInstance)


# -- what an option's value may be ----------------------------------------------------------------


def count(name: str, value: object) -> int:
    """``value`` if it is a whole number of at least 1; ValueError naming ``name`` if not."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")
    return value


def positive_number(name: str, value: object, *, zero: bool = False) -> float:
    """``value`` if it is a positive number (or 0, with ``zero``); ValueError if not."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not (value >= 0 if zero else value > 0):  # type: ignore[operator]
        rule = "must not be negative" if zero else "must be positive"
        raise ValueError(f"{name} {rule}, not {value!r}")
    return float(value)  # type: ignore[arg-type]


def _seconds(name: str, value: object) -> float:
    return positive_number(name, value, zero=True)


def _message_size(name: str, value: object) -> int:
    if not (isinstance(value, int) and value >= MIN_MESSAGE_SIZE):
        raise ValueError(f"{name} must be an integer of at least {MIN_MESSAGE_SIZE}, not {value!r}")
    return value


def read_count(text: str) -> int:
    """A flag's text as a whole number of at least 1; ValueError saying what was expected."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"expected a whole number of at least 1, not {text!r}")
    return value


def read_seconds(text: str) -> float:
    """A flag's text as a number of seconds, 0 or more; ValueError if it is not."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:
        raise ValueError(f"expected a number of seconds (0 or more), not {text!r}")
    return value


def read_positive(text: str) -> float:
    """A flag's text as a positive number; ValueError if it is not."""
    value = read_seconds(text)
    if value == 0:
        raise ValueError(f"expected a positive number, not {text!r}")
    return value


@attrs.frozen
class Rule:
    """What values an option takes: :attr:`check` for a value given in Python (the value
    to keep, or ValueError naming the option), :attr:`read` for its flag's text (the value,
    or ValueError saying what was expected: the command line says it in one line)."""

    check: Callable[[str, Any], Any]
    read: Callable[[str], Any] = str


COUNT = Rule(count, read_count)
"""A whole number of at least 1."""
POSITIVE = Rule(positive_number, read_positive)
"""A positive number (seconds, a rate)."""
SECONDS = Rule(_seconds, read_seconds)
"""A number of seconds, 0 or more."""
MESSAGE_SIZE = Rule(_message_size, read_count)
"""``max_message_size``: at least :data:`MIN_MESSAGE_SIZE` (the flag reads any count, and
the check says why a small one is refused)."""


# -- how an option is declared --------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Flag:
    """How an option is a flag of ``vrt serve``. A bool option is a switch (``--web``); a
    :attr:`repeat` flag adds one item each time (``--allowed-origin``); any other takes a
    value, read by the option's :class:`Rule`, and its help shows the default (unless it
    is None: :attr:`help` then says what none means)."""

    help: str
    """One line for ``vrt serve --help``."""
    name: str = ""
    """The flag (default: ``--`` and the option's name with dashes)."""
    metavar: str | None = None
    repeat: bool = False
    env: str | None = None
    """An environment variable the flag's value is read from when the flag is not given."""


@attrs.frozen(kw_only=True)
class About:
    """What an option's field declares besides its name, type and default."""

    doc: str
    """One paragraph for the API reference (the TypedDict's field docstring)."""
    group: str
    """Its section (a key of :data:`GROUPS`)."""
    rule: Rule | None = None
    """Its check (and its flag's reading); None: any value of its type is kept as given."""
    flag: Flag | None = None
    """Its ``vrt serve`` flag, if it has one."""
    serve_only: bool = False
    """Taken by ``vrt.serve`` only, not ``vrt.asgi.app`` (whose ASGI server does that job)."""
    secret: bool = False
    """A secret: in no ``repr``, and never on a worker's command line (``ps`` shows those:
    workers get it through the flag's environment variable)."""

    def flag_name(self, name: str) -> str:
        """The flag of option ``name`` (it must have one)."""
        assert self.flag is not None, name
        return self.flag.name or f"--{name.replace('_', '-')}"


def option(
    default: object,
    *,
    doc: str,
    group: str,
    rule: Rule | None = None,
    flag: Flag | None = None,
    serve_only: bool = False,
    secret: bool = False,
) -> Any:
    """The attrs field of one option (``name: type = option(default, ...)`` in a record)."""
    assert group in GROUPS, group
    assert not secret or flag is None or flag.env, "a secret flag is passed on in its env"
    about = About(
        doc=inspect.cleandoc(doc),
        group=group,
        rule=rule,
        flag=flag,
        serve_only=serve_only,
        secret=secret,
    )
    return attrs.field(default=default, metadata={_KEY: about}, repr=not secret)


def about(field: attrs.Attribute[Any]) -> About:
    """The declaration of an option's field."""
    found: About = field.metadata[_KEY]
    return found


def checked(record: type[R], given: Mapping[str, object]) -> R:
    """``record`` with the values of ``given`` that are its options, each checked by its
    rule (ValueError naming the first bad one, in declaration order); the others default."""
    values: dict[str, object] = {}
    for field in attrs.fields(record):
        if field.name in given:
            rule = about(field).rule
            value = given[field.name]
            values[field.name] = value if rule is None else rule.check(field.name, value)
    return record(**values)


def refuse_unknown(
    given: Iterable[str],
    caller: str,
    takes: Sequence[attrs.Attribute[Any]],
    *,
    elsewhere: Collection[str] = (),
    where: str = "",
) -> None:
    """TypeError for the first name in ``given`` that is none of ``takes``, worded as
    Python's own for a function ``caller``: with the option it was perhaps meant to be, or
    ``where`` it is taken when it is in ``elsewhere``."""
    names = [field.name for field in takes]
    for name in given:
        if name in names:
            continue
        hint = ""
        if name in elsewhere:
            hint = f" ({where})"
        elif close := difflib.get_close_matches(name, names, n=1):
            hint = f" (did you mean {close[0]!r}?)"
        raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}{hint}")


def with_options(
    function: Callable[..., Any], options: Sequence[attrs.Attribute[Any]]
) -> inspect.Signature:
    """``function``'s signature with its ``**options`` spread into one keyword-only
    parameter per option (its type and default), as ``inspect.signature`` and ``help()``
    should show a function whose options are declared here."""
    signature = inspect.signature(function)
    keep = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    spread = [
        inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type
        )
        for f in options
    ]
    return signature.replace(parameters=[*keep, *spread])


# -- the options every front takes ----------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Options:
    """What one server was started with: one record shared by its hub, actors and links
    (``vrt.serve`` and ``vrt.asgi.app`` both take these; ``vrt._server.options`` holds
    what only ``vrt.serve`` takes). Build it with :func:`make_options`, which checks."""

    capabilities: Collection[str] = option(
        m.SUPPORTED,
        group="serving",
        rule=Rule(lambda name, value: tuple(value)),
        doc="""What this server supports, of vrt/1's capabilities: pass ``()`` to act as a
        server without ``tool-stream-v1``. ``audio-v1`` is offered only when the agent's
        model is a realtime one (``vrt.models.OpenAIRealtime``, ``GeminiLive``).""",
    )
    web_demo: bool = option(
        False,
        group="serving",
        flag=Flag(
            name="--web",
            help="also serve the demo page at / (its app tools edit a document in the page)",
        ),
        doc="""Serve the demo page at ``/`` too (what ``vrt demo --web`` does). Plain HTTP
        on the same port always gets the browser client (``GET /vrt.js``, the modules it
        imports, ``/vrt.d.ts``).""",
    )
    authenticate: Authenticate | None = option(
        None,
        group="safety",
        doc="""``async (vrt.HandshakeRequest) -> principal``, run before the upgrade; raise
        :class:`vrt.Refuse` (or return None: 401) to refuse the upgrade with an HTTP status.
        The principal reaches server tools as ``ctx.principal``, and a resume must come with
        the same principal.""",
    )
    allowed_origins: Collection[str] | None = option(
        None,
        group="safety",
        rule=Rule(lambda name, value: None if value is None else frozenset(value)),
        flag=Flag(
            name="--allowed-origin",
            metavar="ORIGIN",
            repeat=True,
            help="accept browser upgrades only from this Origin (repeat for more; default: any)",
        ),
        doc="""If given, an upgrade whose ``Origin`` header is present and not in it is
        refused (403): browsers send it, so a page elsewhere cannot use a user's cookies to
        open a session. Requests without ``Origin`` (not a browser) pass.""",
    )
    trusted_proxies: Collection[str] | None = option(
        None,
        group="safety",
        rule=Rule(networks, read_networks),
        flag=Flag(
            metavar="CIDR",
            repeat=True,
            help="count clients by the address these proxies forward (X-Forwarded-For, "
            "PROXY v2); CIDRs, comma-separated or repeated (default: none)",
        ),
        doc="""The networks of the proxies in front of this server (load balancers), as CIDR
        text (``["10.0.0.0/8", "fd00::/8"]``, or one string with commas): their word on
        who the client is is taken. A connection from one of them counts, in
        ``max_pending_per_peer``, ``max_sessions_per_peer`` and the logs, as the client
        the proxy names: the rightmost address of ``X-Forwarded-For`` that is not a trusted
        proxy; or, with ``vrt.serve``, the source of the PROXY protocol v2 header the proxy
        sends before TLS or HTTP (HAProxy's ``send-proxy-v2``; read within
        ``handshake_timeout``, 1 KiB at most, optional), which then is also
        ``HandshakeRequest.remote``. A connection from anywhere else counts by its own
        address, whatever it sends. Default: none (every connection counts by its own
        address). With ``vrt.asgi.app``: ``X-Forwarded-For``, from the client address the
        ASGI server reports.""",
    )
    handshake_timeout: float = option(
        10.0,
        group="safety",
        rule=POSITIVE,
        flag=Flag(help="seconds from connect to a valid hello"),
        doc="""Seconds from the TCP accept to a valid ``hello`` (the HTTP upgrade,
        ``authenticate`` and the hello; with ``ssl_context`` the TLS handshake too); a peer
        slower than that is cut off.""",
    )
    max_pending_connections: int = option(
        256,
        group="safety",
        rule=COUNT,
        serve_only=True,
        flag=Flag(help="connections in their handshake"),
        doc="""Connections still in their handshake. A new connection is always let in:
        when the pool, or its address's share (``max_pending_per_peer``), is full, the
        connection of that pool that has waited longest is closed instead (a real client
        finishes in milliseconds), so slow handshakes cannot lock anyone out. A peer that
        leaves mid-handshake is forgotten at once. Running out of file descriptors is one
        warning a time, not a log flood.""",
    )
    max_pending_per_peer: int = option(
        64,
        group="safety",
        rule=COUNT,
        serve_only=True,
        flag=Flag(help="connections in their handshake per IP (/64)"),
        doc="""Of ``max_pending_connections``, those from one IP address (an IPv6 /64).
        Behind a reverse proxy every connection has the proxy's address: name the proxy in
        ``trusted_proxies`` (the share is then the client's it forwards), or raise this to
        ``max_pending_connections``.""",
    )
    max_sessions: int = option(
        1000,
        group="safety",
        rule=COUNT,
        flag=Flag(help="live sessions"),
        doc="""Live sessions, detached ones included. At it, the oldest session that never
        started a turn is closed (``expired``) to make room; if every session has, a new one
        is refused (``error`` ``RATE_LIMITED``, ``closed`` ``rejected``).""",
    )
    max_sessions_per_peer: int = option(
        20,
        group="safety",
        rule=COUNT,
        flag=Flag(help="sessions per principal or IP"),
        doc="""The same as ``max_sessions``, per principal (what ``authenticate`` returns)
        or, without one, per remote IP address (behind a proxy named in
        ``trusted_proxies``: the client's it forwards).""",
    )
    first_turn_timeout: float = option(
        300.0,
        group="safety",
        rule=POSITIVE,
        flag=Flag(help="seconds to a session's first turn"),
        doc="""Seconds: a session that starts no turn by then is closed (``expired``).""",
    )
    resume_window: float = option(
        30.0,
        group="safety",
        rule=SECONDS,
        flag=Flag(help="seconds a dropped session waits for its client"),
        doc="""Seconds a session whose connection dropped is kept for the client to resume;
        turns and server tools go on meanwhile. Then it closes (``expired``). 0 ends a
        session with its connection.""",
    )
    max_open_calls: int = option(
        64,
        group="safety",
        rule=COUNT,
        flag=Flag(help="calls of one turn without a result"),
        doc="""Calls of one turn without a result; a call over it fails at once (FAILED) and
        the model gets that result.""",
    )
    max_queued_app_calls: int = option(
        32,
        group="safety",
        rule=COUNT,
        flag=Flag(help="app calls waiting for the app"),
        doc="""App calls waiting for the app; one over it FAILED.""",
    )
    max_messages_per_second: float = option(
        100.0,
        group="safety",
        rule=POSITIVE,
        flag=Flag(help="frames in, per connection"),
        doc="""Inbound frames per connection, with a one-second burst; frames over it are
        read more slowly (never dropped) and the client gets ``error`` ``RATE_LIMITED``
        once; after 5 seconds of that, the session is closed (``server``).""",
    )
    audio_speed_limit: float = option(
        SPEED_LIMIT,
        group="safety",
        rule=POSITIVE,
        flag=Flag(help="audio per direction, in times real time (audio-v1)"),
        doc=f"""``audio-v1``: the bound of each direction's audio in bytes a second, as times
        real time of that direction's rate (PCM16: 2 bytes a sample; 4 at 24 kHz is
        192,000 bytes a second), averaged over {RATE_WINDOW:g} s (so {RATE_WINDOW:g} s at
        the bound, 8 s of audio by default, may come at once). Real-time audio in any frame
        size stays far under it, and audio frames are not counted by
        ``max_messages_per_second``. A client over it gets ``error`` ``RATE_LIMITED`` and
        its session is closed (``server``); the model's voice over it waits its turn to
        be sent. Each connection holds at most {VOICE_BACKLOG_SECONDS:g} s of the model's
        voice unsent (a client that does not read, a model far faster than the bound):
        past that the oldest of the turn is dropped (and counted); the engine is never
        held for audio.""",
    )
    replay_limit: int = option(
        REPLAY_LIMIT,
        group="safety",
        rule=COUNT,
        flag=Flag(help="unacked messages kept for a resume"),
        doc="""Messages in the replay buffer, and in each connection's unwritten backlog: the
        model is held while the client is 40 % of this (or of ``replay_limit_bytes``)
        behind; over the limit, or held 30 s without progress, the session closes
        (``overflow``) and a connection stuck behind unread frames is reset at once.""",
    )
    replay_limit_bytes: int = option(
        REPLAY_LIMIT_BYTES,
        group="safety",
        rule=COUNT,
        flag=Flag(help="unacked or unsent bytes kept"),
        doc="""The bound of ``replay_limit`` in bytes, at least twice ``max_message_size``
        (one frame must fit with room to spare).""",
    )
    max_message_size: int = option(
        MAX_MESSAGE_SIZE,
        group="safety",
        rule=MESSAGE_SIZE,
        flag=Flag(help=f"bytes per frame, at least {MIN_MESSAGE_SIZE}"),
        doc=f"""At least {MIN_MESSAGE_SIZE:,}. A frame over it in characters closes the
        connection (1009; a hello over 64 KiB too); one within it in characters but over it
        in UTF-8 bytes is answered ``TOO_LARGE`` and the session goes on. The server sends
        no frame over it (``vrt.connect``'s default is the same): a call's arguments are
        bounded to an eighth of it (a call over fails), ``ctx.emit`` progress to half.""",
    )
    max_history_bytes: int = option(
        1024 * 1024,
        group="safety",
        rule=COUNT,
        flag=Flag(help="history kept for the model, bytes"),
        doc="""Past it, the oldest whole turns are dropped from what the model is sent.""",
    )
    capture_content: bool | None = option(
        None,
        group="observability",
        doc="""Every turn, model step and call is a span (``invoke_agent``, ``chat``,
        ``execute_tool``; OpenTelemetry, through its API: a no-op until the application
        configures the SDK), with no content (user text, arguments, outputs, messages)
        unless this is True. None: as ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``
        says.""",
    )
    metrics: bool = option(
        False,
        group="observability",
        rule=Rule(lambda name, value: bool(value)),
        flag=Flag(
            help="serve GET /metrics in Prometheus' text format (needs trio-vrt[metrics]; "
            "with --workers, each worker answers for itself)"
        ),
        doc="""Serve ``GET /metrics`` on the HTTP front, in Prometheus' text format:
        ``prometheus_client``'s default registry, which the SDK's Prometheus reader fills
        (``trio-vrt[metrics]``; ``vrt serve --metrics`` installs both). ValueError if
        ``prometheus_client`` is missing.""",
    )

    @property
    def proxies(self) -> Networks:
        """``trusted_proxies`` as its rule keeps it: the networks (none by default)."""
        return cast("Networks", self.trusted_proxies or ())

    @property
    def high_water(self) -> int:
        """Unacked messages at which the model is held: well under the replay bound."""
        return max(1, min(HIGH_WATER, self.replay_limit * 2 // 5))

    @property
    def high_water_bytes(self) -> int:
        """Unacked (or unwritten) bytes at which the model is held: 40 % of the bound."""
        return max(1, self.replay_limit_bytes * 2 // 5)


def make_options(given: Mapping[str, object]) -> Options:
    """The :class:`Options` of a server from the options ``given`` to it (others are
    ignored: the caller refuses unknown ones), each checked: ValueError naming the first
    bad one. ``vrt.serve`` and ``vrt.asgi.app`` both build theirs here, so they take the
    same values and refuse the same ones."""
    options = checked(Options, given)
    if options.metrics and not metrics_page.available():
        raise ValueError(f"metrics=True serves GET /metrics: {metrics_page.INSTALL_HINT}")
    if options.replay_limit_bytes < 2 * options.max_message_size:
        raise ValueError(
            f"replay_limit_bytes ({options.replay_limit_bytes}) must be at least twice "
            f"max_message_size ({options.max_message_size}): one frame must fit with room "
            "to spare"
        )
    return options
