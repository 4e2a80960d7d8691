"""Sans-IO state of one relayed session, driven by the messages the walkers capture."""

from __future__ import annotations

import struct
from enum import Enum

from proxy.wire.messages import (
    parse_backend_key_data,
    parse_error_fields,
    parse_parameter_status,
)
from proxy.wire.types import (
    AUTHENTICATION,
    BACKEND_KEY_DATA,
    ERROR_RESPONSE,
    NEGOTIATE_PROTOCOL_VERSION,
    PARAMETER_STATUS,
    READY_FOR_QUERY,
    TERMINATE,
)

# Backend messages the session state needs to see (bodies are all tiny).
BACKEND_CAPTURE = frozenset(b"RKSZEv")
# Frontend messages the session state needs to see.
FRONTEND_CAPTURE = frozenset(b"X")

# ParameterStatus bodies as (name, value), parsed once per distinct body and shared by every session: a login reports
# some fourteen, the same for each session of a server (their strings were 1.5 KB a session, idle ones included).
# Bounded (application_name and a few others vary by client): emptied when full.
_PARAMETERS: dict[bytes, tuple[str, str]] = {}
PARAMETERS_KEPT = 1024


def parameter_status(body: bytes) -> tuple[str, str]:
    """:func:`~proxy.wire.messages.parse_parameter_status`, the strings shared with the sessions that saw the same."""
    pair = _PARAMETERS.get(body)
    if pair is None:
        if len(_PARAMETERS) >= PARAMETERS_KEPT:
            _PARAMETERS.clear()
        pair = _PARAMETERS[bytes(body)] = parse_parameter_status(body)
    return pair


# Parameter dicts shared by the sessions that have the same (the server's reports after login, a client's startup
# packet): an idle session keeps one pointer, not a dict of its own (a dict of fourteen strings is 400 bytes).
_SHARED: dict[tuple, dict[str, str]] = {}
SHARED_KEPT = 256


def shared(mapping: dict[str, str]) -> dict[str, str]:
    """The one dict with these items (in this order) that the sessions share: never changed once shared (a session
    whose parameters change copies it first, :meth:`SessionState.on_backend`). Bounded: emptied when full."""
    key = tuple(mapping.items())
    got = _SHARED.get(key)
    if got is None:
        if len(_SHARED) >= SHARED_KEPT:
            _SHARED.clear()
        got = _SHARED[key] = mapping
    return got


class Phase(Enum):
    AUTHENTICATING = "authenticating"  # startup sent, waiting for the first ReadyForQuery
    READY = "ready"  # authenticated; normal traffic
    CLOSING = "closing"  # Terminate sent or a FATAL error seen


class SessionState:
    """What the seat knows about a session from the messages it relayed."""

    __slots__ = ("phase", "txn_status", "backend_pid", "backend_key", "server_params", "negotiated_minor",
                 "auth_ok", "last_fatal", "_params_shared")

    def __init__(self) -> None:
        self.phase = Phase.AUTHENTICATING
        self.txn_status = b"I"
        self.backend_pid: int | None = None
        self.backend_key: bytes | None = None
        self.server_params: dict[str, str] = {}  # shared with other sessions once authenticated (share_params)
        self._params_shared = False
        self.negotiated_minor: int | None = None
        self.auth_ok = False
        self.last_fatal: dict[str, str] | None = None

    def on_backend(self, t: int, body: bytes) -> None:
        if t == READY_FOR_QUERY:  # 'Z' ReadyForQuery
            self.txn_status = body[:1]
            if self.phase is Phase.AUTHENTICATING:
                self.phase = Phase.READY
                self.share_params()
        elif t == AUTHENTICATION:  # 'R' Authentication*
            if len(body) >= 4 and struct.unpack_from("!I", body, 0)[0] == 0:
                self.auth_ok = True
        elif t == BACKEND_KEY_DATA:  # 'K' BackendKeyData
            self.backend_pid, self.backend_key = parse_backend_key_data(body)
        elif t == PARAMETER_STATUS:  # 'S' ParameterStatus
            name, value = parameter_status(body)
            if self._params_shared:  # a report after login (a SET): this session's own dict from now on
                self.server_params = dict(self.server_params)
                self._params_shared = False
            self.server_params[name] = value
        elif t == ERROR_RESPONSE:  # 'E' ErrorResponse
            fields = parse_error_fields(body)
            if fields.get("V", fields.get("S")) in ("FATAL", "PANIC"):
                self.last_fatal = fields
                self.phase = Phase.CLOSING
        elif t == NEGOTIATE_PROTOCOL_VERSION:  # 'v' NegotiateProtocolVersion: the newest version the server supports
            self.negotiated_minor = struct.unpack_from("!I", body, 0)[0] & 0xFFFF

    def share_params(self) -> None:
        """The server's parameters as reported at login: one dict for the sessions that have the same."""
        self.server_params = shared(self.server_params)
        self._params_shared = True

    def on_frontend(self, t: int, body: bytes) -> None:
        if t == TERMINATE:  # 'X' Terminate
            self.phase = Phase.CLOSING

    @property
    def in_transaction(self) -> bool:
        return self.txn_status != b"I"
