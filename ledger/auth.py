"""Peer authentication of a ledger group: a shared cluster secret, proven both ways, then every frame MACed.

Why: a member id alone proves nothing; anyone who can reach a node's port could claim to
be a peer and send one forged AppendRequest that makes a follower commit a foreign entry
for good. Every member therefore holds the same cluster secret and proves it on every
connection, without ever sending it:

1. dialer -> listener: ``HELLO_AUTH`` + version + flags + dialer's nonce + dialer id + listener id
2. listener -> dialer: ``CHALLENGE`` + listener's nonce + HMAC(secret, transcript, "listener")
3. dialer -> listener: ``PROOF`` + HMAC(secret, transcript, "dialer")

The transcript binds both fresh nonces, both claimed ids and the flags (whether frames
carry MACs, so that cannot be downgraded), and the two proofs carry
different role labels, so no proof can be replayed on another connection or reflected back.
Both sides check the other's proof: a node never sends its Raft messages to an impostor.

With ``FLAG_FRAME_MAC``, every frame the dialer sends after the handshake carries a 16-byte
tag, HMAC-SHA256 over a sequence number and the frame body under a per-connection key
derived from the secret and both nonces: an on-path attacker can neither inject, alter,
replay nor reorder frames. Whether a node asks for it is the ``peer_frame_mac`` setting
(see ``config`` for the measured cost and the default); under TLS it is never used, as TLS
records are already authenticated and the handshake runs inside them.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct

from common.cluster_secret import MIN_SECRET_BYTES

VERSION = 1
NONCE_BYTES = 32
TAG_BYTES = 16
PROOF_BYTES = 32
HELLO_AUTH = b"A"
CHALLENGE = b"a"
PROOF = b"F"
HELLO_CLIENT_AUTH = b"K"
FLAG_FRAME_MAC = 1
_CLIENT = "\x00client"  # the dialer id of every client handshake: never a member id, which is text
_LABEL = b"ledgermq-peer-v1\x00"
_SEQ = struct.Struct("<Q")


class AuthError(ValueError):
    """A peer failed the handshake or sent a frame whose tag does not verify; the message says why."""


def _ids(dialer: str, listener: str) -> bytes:
    d, lst = dialer.encode(), listener.encode()
    if len(d) > 255 or len(lst) > 255:
        raise AuthError("member id longer than 255 bytes")
    return bytes((len(d),)) + d + bytes((len(lst),)) + lst


class Handshake:
    """The state both ends share once the dialer's hello is known: ids, nonces, derived keys."""

    def __init__(
        self, secret: bytes, dialer: str, listener: str, nonce_d: bytes, nonce_l: bytes, flags: int = 0
    ) -> None:
        self.secret = secret
        self.dialer = dialer
        self.listener = listener
        self.flags = flags
        self._transcript = _LABEL + bytes((flags,)) + _ids(dialer, listener) + nonce_d + nonce_l

    def proof(self, role: bytes) -> bytes:
        return hmac.digest(self.secret, self._transcript + b"proof:" + role, "sha256")

    def frame_key(self) -> bytes:
        return hmac.digest(self.secret, self._transcript + b"frame-key:dialer", "sha256")


class PeerAuth:
    """One node's view of the cluster secret: builds and checks handshake frames, makes frame MACs."""

    def __init__(self, secret: bytes, accepted: tuple[bytes, ...] = ()) -> None:
        """``secret`` proves this node as a listener and is tried first as a dialer.

        ``accepted`` are further secrets a dialer accepts from the node it dials (and then
        proves itself with), so a group can rotate its secret one node at a time: first give
        every node the new secret as accepted, then make it each node's own, then drop the old.
        """
        for s in (secret, *accepted):
            if len(s) < MIN_SECRET_BYTES:
                raise ValueError(f"the cluster secret must be at least {MIN_SECRET_BYTES} bytes")
        self.secret = secret
        self.secrets = (secret, *accepted)

    def __repr__(self) -> str:  # never print the secret
        return "PeerAuth(<secret>)"

    # ---------------------------------------------------------------- dialer side

    def hello(self, dialer: str, listener: str, flags: int = FLAG_FRAME_MAC) -> tuple[bytes, bytes]:
        """The first frame a dialer sends, and its nonce (kept to check the challenge)."""
        nonce = secrets.token_bytes(NONCE_BYTES)
        return HELLO_AUTH + bytes((VERSION, flags)) + nonce + _ids(dialer, listener), nonce

    def answer_challenge(
        self, dialer: str, listener: str, nonce_d: bytes, frame: bytes, flags: int = FLAG_FRAME_MAC
    ) -> tuple[bytes, FrameSealer | None]:
        """Check the listener's proof; return the dialer's proof frame and the sealer for later frames.

        The sealer is None when ``flags`` asks for no frame MACs.
        """
        if len(frame) != 1 + NONCE_BYTES + PROOF_BYTES or frame[:1] != CHALLENGE:
            raise AuthError("malformed authentication challenge")
        nonce_l = frame[1 : 1 + NONCE_BYTES]
        for secret in self.secrets:
            hs = Handshake(secret, dialer, listener, nonce_d, nonce_l, flags)
            if hmac.compare_digest(hs.proof(b"listener"), frame[1 + NONCE_BYTES :]):
                sealer = FrameSealer(hs.frame_key()) if flags & FLAG_FRAME_MAC else None
                return PROOF + hs.proof(b"dialer"), sealer
        raise AuthError("its proof does not match our cluster secret (different cluster_secret?)")

    # ---------------------------------------------------------------- listener side

    def challenge(self, frame: bytes) -> tuple[str, str, bytes, Handshake]:
        """Parse a dialer's hello: returns (dialer id, listener id, challenge frame, handshake).

        The caller checks ``handshake.flags`` against what this node requires.
        """
        head = 3 + NONCE_BYTES
        if len(frame) < head + 2 or frame[:1] != HELLO_AUTH:
            raise AuthError("malformed authenticated hello")
        if frame[1] != VERSION:
            raise AuthError(f"unsupported peer protocol version {frame[1]} (this node speaks {VERSION})")
        flags = frame[2]
        nonce_d = frame[3:head]
        try:
            n = frame[head]
            dialer = frame[head + 1 : head + 1 + n].decode()
            m = frame[head + 1 + n]
            listener = frame[head + 2 + n : head + 2 + n + m].decode()
        except (IndexError, UnicodeDecodeError):
            raise AuthError("malformed authenticated hello") from None
        if head + 2 + n + m != len(frame):
            raise AuthError("malformed authenticated hello")
        nonce_l = secrets.token_bytes(NONCE_BYTES)
        hs = Handshake(self.secret, dialer, listener, nonce_d, nonce_l, flags)
        return dialer, listener, CHALLENGE + nonce_l + hs.proof(b"listener"), hs

    # ---------------------------------------------------------------- clients (``client_auth``)

    def client_hello(self) -> tuple[bytes, bytes]:
        """A client's first frame when nodes require ``client_auth``, and its nonce."""
        nonce = secrets.token_bytes(NONCE_BYTES)
        return HELLO_CLIENT_AUTH + bytes((VERSION,)) + nonce, nonce

    def client_challenge(self, frame: bytes) -> tuple[bytes, Handshake]:
        """Listener side: parse a client's hello; returns the challenge frame and the handshake."""
        if len(frame) != 2 + NONCE_BYTES or frame[:1] != HELLO_CLIENT_AUTH:
            raise AuthError("malformed authenticated client hello")
        if frame[1] != VERSION:
            raise AuthError(f"unsupported client protocol version {frame[1]} (this node speaks {VERSION})")
        nonce_l = secrets.token_bytes(NONCE_BYTES)
        hs = Handshake(self.secret, _CLIENT, "", frame[2:], nonce_l)
        return CHALLENGE + nonce_l + hs.proof(b"listener"), hs

    def answer_client_challenge(self, nonce_c: bytes, frame: bytes) -> bytes:
        """Client side: check the node's proof; returns the client's proof frame."""
        proof, _ = self.answer_challenge(_CLIENT, "", nonce_c, frame, 0)
        return proof

    @staticmethod
    def check_proof(hs: Handshake, frame: bytes) -> FrameOpener | None:
        """Verify the dialer's proof; returns the opener that checks the frames it sends next.

        None when the handshake's flags ask for no frame MACs.
        """
        if len(frame) != 1 + PROOF_BYTES or frame[:1] != PROOF:
            raise AuthError("malformed authentication proof")
        if not hmac.compare_digest(hs.proof(b"dialer"), frame[1:]):
            raise AuthError("wrong cluster secret")
        return FrameOpener(hs.frame_key()) if hs.flags & FLAG_FRAME_MAC else None


class FrameSealer:
    """Appends a tag to each outgoing frame: HMAC-SHA256(key, seq || body), truncated to 16 bytes."""

    __slots__ = ("_base", "_seq")

    def __init__(self, key: bytes) -> None:
        self._base = hmac.new(key, digestmod=hashlib.sha256)
        self._seq = 0

    def tag(self, body: bytes) -> bytes:
        h = self._base.copy()
        h.update(_SEQ.pack(self._seq))
        h.update(body)
        self._seq += 1
        return h.digest()[:TAG_BYTES]


class FrameOpener:
    """Checks and strips the tag of each incoming frame, in order; any mismatch is an ``AuthError``."""

    __slots__ = ("_base", "_seq")

    def __init__(self, key: bytes) -> None:
        self._base = hmac.new(key, digestmod=hashlib.sha256)
        self._seq = 0

    def open(self, frame: bytes) -> memoryview:
        if len(frame) < TAG_BYTES:
            raise AuthError("frame too short to carry its authentication tag")
        view = memoryview(frame)
        body = view[:-TAG_BYTES]
        h = self._base.copy()
        h.update(_SEQ.pack(self._seq))
        h.update(body)
        if not hmac.compare_digest(h.digest()[:TAG_BYTES], view[-TAG_BYTES:]):
            raise AuthError(f"frame {self._seq} failed authentication (altered or injected)")
        self._seq += 1
        return body
