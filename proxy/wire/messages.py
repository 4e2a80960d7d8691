"""Encoders and decoders for the few message bodies the seat reads or writes itself."""

from __future__ import annotations

import struct

from proxy.wire.codec import CANCEL_REQUEST_CODE, PROTOCOL_3_0, SSL_REQUEST_CODE

_U32 = struct.Struct("!I")

# Field codes of ErrorResponse / NoticeResponse.
FIELD_SEVERITY = "S"
FIELD_SEVERITY_NONLOCALIZED = "V"
FIELD_CODE = "C"
FIELD_MESSAGE = "M"
FIELD_DETAIL = "D"
FIELD_HINT = "H"


def message(type_byte: bytes, body: bytes = b"") -> bytes:
    """A typed message: type byte, int32 length (including itself), body."""
    return type_byte + _U32.pack(len(body) + 4) + body


def _cstr(text: str) -> bytes:
    return text.encode() + b"\x00"


def error_response(sqlstate: str, text: str, *, severity: str = "ERROR", detail: str | None = None,
                   hint: str | None = None) -> bytes:
    """An ErrorResponse ('E') in the field order PostgreSQL itself uses."""
    body = b"S" + _cstr(severity) + b"V" + _cstr(severity) + b"C" + _cstr(sqlstate) + b"M" + _cstr(text)
    if detail is not None:
        body += b"D" + _cstr(detail)
    if hint is not None:
        body += b"H" + _cstr(hint)
    return message(b"E", body + b"\x00")


def parse_error_fields(body: bytes) -> dict[str, str]:
    """Decode the fields of an ErrorResponse or NoticeResponse body."""
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(body) and body[pos] != 0:
        end = body.index(b"\x00", pos + 1)
        fields[chr(body[pos])] = body[pos + 1:end].decode("utf-8", "replace")
        pos = end + 1
    return fields


def ready_for_query(status: bytes = b"I") -> bytes:
    return message(b"Z", status)


def startup_message(params: dict[str, str], version: int = PROTOCOL_3_0) -> bytes:
    body = _U32.pack(version) + b"".join(_cstr(k) + _cstr(v) for k, v in params.items()) + b"\x00"
    return _U32.pack(len(body) + 4) + body


def ssl_request() -> bytes:
    return _U32.pack(8) + _U32.pack(SSL_REQUEST_CODE)


def cancel_request(pid: int, key: bytes) -> bytes:
    return _U32.pack(12 + len(key)) + _U32.pack(CANCEL_REQUEST_CODE) + struct.pack("!i", pid) + key


def parse_backend_key_data(body: bytes) -> tuple[int, bytes]:
    """BackendKeyData: pid and the secret key (4 bytes in 3.0, up to 256 in 3.2)."""
    (pid,) = struct.unpack_from("!i", body, 0)
    return pid, bytes(body[4:])


def parse_data_row(body: bytes) -> list[bytes | None]:
    """The column values of a DataRow (None for NULL), as sent (text or binary)."""
    (count,) = struct.unpack_from("!h", body, 0)
    values, pos = [], 2
    for _ in range(count):
        (n,) = struct.unpack_from("!i", body, pos)
        pos += 4
        if n < 0:
            values.append(None)
        else:
            values.append(body[pos:pos + n])
            pos += n
    return values


def parse_parameter_status(body: bytes) -> tuple[str, str]:
    name, value, _ = body.split(b"\x00", 2)
    return name.decode("utf-8", "replace"), value.decode("utf-8", "replace")


AUTH_SASL = 10


def without_channel_binding(body: bytes) -> bytes | None:
    """AuthenticationSASL minus the channel-binding (`-PLUS`) mechanisms; None if there are none.

    A client on a plaintext leg must not be offered SCRAM-SHA-256-PLUS: libpq
    rightly treats that offer as a downgrade attack and aborts. The binding
    would be to the seat's certificate anyway, not the server's.
    """
    if len(body) < 4 or _U32.unpack_from(body, 0)[0] != AUTH_SASL:
        return None
    mechanisms = [m for m in body[4:].split(b"\x00") if m]
    kept = [m for m in mechanisms if not m.endswith(b"-PLUS")]
    if len(kept) == len(mechanisms):
        return None
    return body[:4] + b"".join(m + b"\x00" for m in kept) + b"\x00"


def query(sql: str) -> bytes:
    return message(b"Q", _cstr(sql))


def terminate() -> bytes:
    return message(b"X")
