"""Nodes prove they are nodes: the proof a node adds to a resume it relays, and where (and
how) a node is reached for relays.

A relayed upgrade (``x-vrt-relay``) is honoured only with a proof only nodes can make: an
HMAC-SHA256, with the owner's relay key, over the owner's name, the relaying node's name,
the session resumed, the client's address as the relaying node saw it, the request path
and a timestamp. The owner checks it in constant time and takes it within
:data:`PROOF_WINDOW` seconds of its timestamp; the proof names one session, which the
relayed ``hello`` must resume (a proof seen on the wire is worth one resume of a session
whose token its bearer must have anyway, for a few seconds). Anything else (no proof, a
bad one, an old one) and the header means nothing: the connection is a plain client's.

Where the key comes from (:class:`Trust`):

- by default each node makes a random key when it starts and publishes it in its lease in
  the store, beside its relay address; a node relaying to it reads both there. Whoever
  can read the store is then a node, which is true anyway (the store holds every
  session's state and says who owns what). A key per node, in its lease, needs no
  agreement between nodes: a store that forgets (a restart without persistence) gets each
  lease back at its node's next heartbeat, key included.
- with ``cluster_secret`` (``vrt serve --cluster-secret``, or ``VRT_CLUSTER_SECRET``)
  every node derives the one key from the secret and publishes none: reading the store
  is not enough to be a node. Every node must then have the same secret.

The lease's text (:class:`Endpoint`): ``ws://HOST:PORT`` or ``wss://HOST:PORT``, then
``key=`` (the node's relay key, base64url) and, for ``wss``, ``pin=`` (the SHA-256 of the
certificate the node presents: the relaying node checks that certificate, not a CA's
signature or a name, since nodes reach each other at addresses certificates rarely name).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

import attrs

PROOF_VERSION = "v1"
PROOF_WINDOW = 30.0
"""Seconds either side of its timestamp a proof is taken (clocks of nodes differ a little)."""
PROOF_LIMIT = 1024
"""The longest ``x-vrt-relay`` value read (bytes of text); a longer one is no proof."""
SECRET_MIN = 16
"""The shortest ``cluster_secret`` taken (characters)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    """base64url without padding; ValueError for anything else."""
    if not text or len(text) > PROOF_LIMIT:
        raise ValueError("empty or too long")
    padded = text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4)
    try:
        return base64.b64decode(padded, validate=True)
    except binascii.Error:
        raise ValueError("not base64url") from None


def cluster_secret(name: str, value: object) -> str | None:
    """The ``cluster_secret`` option: None, or a string of at least :data:`SECRET_MIN`
    characters (ValueError otherwise; the value itself is never in the message)."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) < SECRET_MIN:
        raise ValueError(f"{name} must be a string of at least {SECRET_MIN} characters")
    return value


def read_secret(text: str) -> str:
    """``--cluster-secret``'s text, checked (ValueError saying what is expected)."""
    return cluster_secret("the cluster secret", text) or ""


@attrs.frozen(kw_only=True)
class Endpoint:
    """Where a node takes relays, as its lease says: host and port, its relay key (none
    when the nodes share a ``cluster_secret``) and, with TLS, its certificate's pin."""

    host: str
    port: int
    key: bytes | None = attrs.field(default=None, repr=False)
    pin: str | None = None
    """The SHA-256 (hex) of the node's certificate: the relay is ``wss://``."""

    def encode(self) -> str:
        """The lease's text."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        text = f"{'wss' if self.pin else 'ws'}://{host}:{self.port}"
        if self.key is not None:
            text += f" key={_b64(self.key)}"
        if self.pin is not None:
            text += f" pin={self.pin}"
        return text

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """A lease's text as an endpoint; ValueError if it is none (``HOST:PORT`` alone is
        a node of 0.1.0, whose sessions this version does not see anyway: their keys in
        the store have other names)."""
        first, *fields = text.split(" ")
        scheme, found, address = first.partition("://")
        if not found or scheme not in ("ws", "wss"):
            raise ValueError(f"not a relay address: {first!r}")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"not a relay address: {first!r}")
        values = dict(field.partition("=")[::2] for field in fields)
        key = _unb64(values["key"]) if "key" in values else None
        pin = values.get("pin")
        if (scheme == "wss") != (pin is not None):
            raise ValueError("a relay address with TLS needs its certificate's pin, and only it")
        return cls(host=host.strip("[]"), port=int(port), key=key, pin=pin)


@attrs.frozen(kw_only=True)
class Proven:
    """A relayed upgrade whose proof holds: from node ``front``, for a resume of
    ``session_id``, on behalf of the client at ``client`` (an IP address)."""

    front: str
    session_id: str
    client: str


class Trust:
    """This node's relay key, and the proofs it makes and checks."""

    def __init__(self, cluster_secret: str | None = None) -> None:
        self._shared = cluster_secret is not None
        if cluster_secret is not None:
            self._key = hmac.new(
                cluster_secret.encode("utf-8", "surrogatepass"), b"vrt relay key v1", "sha256"
            ).digest()
        else:
            self._key = secrets.token_bytes(32)

    def __repr__(self) -> str:
        return f"<Trust {'shared secret' if self._shared else 'key in the lease'}>"

    @property
    def published(self) -> bytes | None:
        """The key this node's lease carries: its own, or none with a shared secret."""
        return None if self._shared else self._key

    def key_for(self, owner: Endpoint) -> bytes | None:
        """The key a relay to ``owner`` is proved with: the shared one, or the key its
        lease published; None if there is none (the nodes' secrets are set unevenly)."""
        return self._key if self._shared else owner.key

    def prove(
        self,
        owner: Endpoint,
        *,
        owner_name: str,
        front: str,
        session_id: str,
        client: str,
        path: str,
        now: float,
    ) -> str | None:
        """The ``x-vrt-relay`` value of a relay to ``owner`` (None: no key to prove it
        with). ``now``: the wall clock (``time.time()``), which nodes share."""
        key = self.key_for(owner)
        if key is None:
            return None
        stamp = int(now)
        mac = _mac(key, owner_name, front, session_id, client, path, stamp)
        fields = [text.encode("utf-8", "surrogatepass") for text in (front, session_id, client)]
        return ".".join([PROOF_VERSION, *map(_b64, fields), str(stamp), _b64(mac)])

    def verify(self, value: str, *, owner_name: str, path: str, now: float) -> Proven | None:
        """The relay ``value`` (an ``x-vrt-relay`` header) proves, for this node (named
        ``owner_name``) and the request ``path``; None if it proves nothing."""
        if len(value) > PROOF_LIMIT:
            return None
        parts = value.split(".")
        if len(parts) != 6 or parts[0] != PROOF_VERSION:
            return None
        try:
            front, session_id, client = (_unb64(part).decode() for part in parts[1:4])
            if not (parts[4].isascii() and parts[4].isdigit() and len(parts[4]) <= 12):
                return None
            stamp = int(parts[4])
            mac = _unb64(parts[5])
        except ValueError:  # (UnicodeDecodeError too)
            return None
        if abs(now - stamp) > PROOF_WINDOW:
            return None
        expected = _mac(self._key, owner_name, front, session_id, client, path, stamp)
        if not hmac.compare_digest(expected, mac):
            return None
        return Proven(front=front, session_id=session_id, client=client)


def _mac(
    key: bytes, owner: str, front: str, session_id: str, client: str, path: str, stamp: int
) -> bytes:
    """The HMAC of a proof: each field length-prefixed, so no two sets of fields hash as
    one."""
    message = bytearray(b"vrt-relay-v1")
    for field in (owner, front, session_id, client, path, str(stamp)):
        data = field.encode("utf-8", "surrogatepass")
        message += len(data).to_bytes(4, "big") + data
    return hmac.new(key, bytes(message), hashlib.sha256).digest()
