"""Client authentication at the seat, sans-IO: PgBouncer's auth_file, SCRAM-SHA-256 verifiers, and the server side
of a SCRAM-SHA-256 exchange (RFC 5802 / RFC 7677, without channel binding).

Shared by the admin console (``admin.auth_file``, ADR 0014) and pooled sessions (``pool.auth_file``, ADR 0016):
one implementation of the exchange. :class:`ScramServer` never sees a socket: the caller writes the messages it
returns and feeds it the bodies of the client's password messages ('p').
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import re
import secrets
import struct

from proxy.config import ConfigError
from proxy.wire import messages
from proxy.wire.codec import ProtocolViolation

SCRAM_ITERATIONS = 4096

_VERIFIER = re.compile(r"SCRAM-SHA-256\$(\d+):([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]+):([A-Za-z0-9+/=]+)")
# gs2-header (no channel binding: "n" or "y", an optional authzid), then client-first-message-bare
_CLIENT_FIRST = re.compile(r"([ny]),(?:a=[^,]*)?,(n=[^,]*,r=([!-+\--~]+)(?:,.*)?)")
_SASL_START = messages.message(b"R", struct.pack("!I", 10) + b"SCRAM-SHA-256\x00\x00")


def load_auth_file(path: str, key: str = "admin.auth_file") -> dict[str, str]:
    """PgBouncer's auth_file: one `"user" "secret"` a line (a `"` inside doubled); blank lines and lines starting
    with `;` or `#` skipped. A secret is a SCRAM-SHA-256 verifier (as pg_authid.rolpassword holds it), an md5 one
    (`md5` and 32 hex digits) or a password in plain text. ``key`` names the setting in errors."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ConfigError(f"{key}: cannot read {path!r}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{key}: {path!r} is not UTF-8") from None
    out = {}
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip()[:1] in (";", "#"):
            continue
        m = re.fullmatch(r'\s*"((?:[^"]|"")*)"\s+"((?:[^"]|"")*)".*', line)
        if m is None:
            raise ConfigError(f'{key}: {path}:{number}: expected "user" "secret"')
        out[m.group(1).replace('""', '"')] = m.group(2).replace('""', '"')
    return out


def scram_keys(secret: str) -> tuple[bytes, int, bytes, bytes] | None:
    """(salt, iterations, StoredKey, ServerKey) of a SCRAM-SHA-256 verifier, or None for another kind."""
    # Only what looks like a verifier reaches the cache: never a password in plain text (admin.auth_file may hold one)
    return _decoded(secret) if secret.startswith("SCRAM-SHA-256$") else None


@functools.lru_cache(maxsize=256)  # a verifier is decoded once, not at every login (the users that log in are few)
def _decoded(secret: str) -> tuple[bytes, int, bytes, bytes] | None:
    m = _VERIFIER.fullmatch(secret)
    if m is None:
        return None
    try:
        return (base64.b64decode(m.group(2)), int(m.group(1)), base64.b64decode(m.group(3)),
                base64.b64decode(m.group(4)))
    except ValueError:
        return None


def is_md5(secret: str) -> bool:
    return re.fullmatch(r"md5[0-9a-f]{32}", secret) is not None


def scram_secret(password: str, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS) -> str:
    """A SCRAM-SHA-256 verifier for ``password`` in PostgreSQL's format (ASCII passwords: no SASLprep)."""
    salt = salt or secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    stored = hashlib.sha256(hmac.digest(salted, b"Client Key", "sha256")).digest()
    server = hmac.digest(salted, b"Server Key", "sha256")
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored)}:{b64(server)}"


class _Hmac:
    """HMAC-SHA-256 under one key, the key's pads hashed once (the standard library's HMAC object, copied for each
    MAC): hmac.digest with a digest name looks the algorithm up in OpenSSL and hashes the pads at every call."""

    __slots__ = ("_keyed",)

    def __init__(self, key: bytes):
        self._keyed = hmac.new(key, digestmod=hashlib.sha256)

    def digest(self, message: bytes) -> bytes:
        mac = self._keyed.copy()
        mac.update(message)
        return mac.digest()


@functools.lru_cache(maxsize=512)  # the keys of the verifiers in use: two a user
def _hmac_for(key: bytes) -> _Hmac:
    return _Hmac(key)


class ScramServer:
    """One SCRAM-SHA-256 exchange, the server's side, for the verifier ``secret`` (or a plain-text password; None: a
    user the seat has no secret for, whose exchange runs to the end and fails like a wrong password).

    ``start()`` is the AuthenticationSASL message; ``client_first(body)`` takes the SASLInitialResponse's body and
    returns AuthenticationSASLContinue; ``client_final(body)`` takes the SASLResponse's body and returns
    AuthenticationSASLFinal when the proof is right, None when it is not. A malformed message raises
    :class:`ProtocolViolation`."""

    def __init__(self, secret: str | None):
        keys = scram_keys(secret) if secret is not None else None
        if keys is None:
            salt, iterations = secrets.token_bytes(16), SCRAM_ITERATIONS
            if secret is None:  # no such user: an exchange that cannot succeed
                stored_key, server_key = secrets.token_bytes(32), secrets.token_bytes(32)
            else:  # a password in plain text
                salted = hashlib.pbkdf2_hmac("sha256", secret.encode(), salt, iterations)
                stored_key = hashlib.sha256(hmac.digest(salted, b"Client Key", "sha256")).digest()
                server_key = hmac.digest(salted, b"Server Key", "sha256")
            # keys made for this exchange only: not kept
            self._stored_mac, self._server_mac = _Hmac(stored_key), _Hmac(server_key)
        else:
            salt, iterations, stored_key, server_key = keys
            self._stored_mac, self._server_mac = _hmac_for(stored_key), _hmac_for(server_key)
        self._salt, self._iterations = salt, iterations
        self._stored_key = stored_key
        self._client_first_bare = ""
        self._final_head = ""  # what the client-final-message must start with: c=<gs2-header in base64>,r=<nonce>
        self._server_first = ""
        self._nonce = ""

    @staticmethod
    def start() -> bytes:
        return _SASL_START

    def client_first(self, body: bytes) -> bytes:
        mechanism, _, rest = body.partition(b"\x00")
        if mechanism != b"SCRAM-SHA-256" or len(rest) < 4:
            raise ProtocolViolation("expected SCRAM-SHA-256", sqlstate="28000")
        client_first = rest[4:4 + struct.unpack("!i", rest[:4])[0]].decode("utf-8", "replace")
        m = _CLIENT_FIRST.fullmatch(client_first)
        if m is None:
            raise ProtocolViolation("malformed SCRAM client-first-message (channel binding is not offered)",
                                    sqlstate="28000")
        gs2_header = client_first[:len(client_first) - len(m.group(2))]
        self._client_first_bare = m.group(2)
        self._nonce = m.group(3) + base64.b64encode(secrets.token_bytes(18)).decode()
        self._final_head = f"c={base64.b64encode(gs2_header.encode()).decode()},r={self._nonce}"
        self._server_first = f"r={self._nonce},s={base64.b64encode(self._salt).decode()},i={self._iterations}"
        return messages.message(b"R", struct.pack("!I", 11) + self._server_first.encode())

    def client_final(self, body: bytes) -> bytes | None:
        client_final = body.decode("utf-8", "replace")
        without_proof, sep, proof = client_final.rpartition(",p=")
        if not sep or not self._nonce or without_proof != self._final_head:
            return None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        try:
            client_proof = base64.b64decode(proof, validate=True)
        except ValueError:
            return None
        signature = self._stored_mac.digest(auth_message)
        if len(client_proof) != len(signature):
            return None
        # ClientKey = ClientProof XOR ClientSignature, as one integer operation (not a byte at a time)
        client_key = (int.from_bytes(client_proof, "big") ^ int.from_bytes(signature, "big")).to_bytes(32, "big")
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), self._stored_key):
            return None
        verifier = base64.b64encode(self._server_mac.digest(auth_message)).decode()
        return messages.message(b"R", struct.pack("!I", 12) + f"v={verifier}".encode())
