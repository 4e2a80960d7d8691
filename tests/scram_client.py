"""The client side of SCRAM-SHA-256 (RFC 5802, without channel binding), written here from the RFC: the tests' own
client for the seat's SCRAM exchange, driven message by message (a driver's cannot be stopped between two)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct


def initial_response(nonce: str) -> tuple[bytes, str]:
    """The SASLInitialResponse body (mechanism, length, client-first-message) and its client-first-message-bare."""
    bare = f"n=,r={nonce}"
    first = ("n,," + bare).encode()
    return b"SCRAM-SHA-256\x00" + struct.pack("!i", len(first)) + first, bare


def final_message(password: str, bare: str, server_first: str, nonce: str) -> tuple[str, str]:
    """The client-final-message for ``server_first`` and the server signature a genuine server answers with."""
    fields = dict(part.split("=", 1) for part in server_first.split(","))
    if not fields["r"].startswith(nonce):
        raise ValueError("the server's nonce does not extend the client's")
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(fields["s"]), int(fields["i"]))
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    without_proof = f"c={base64.b64encode(b'n,,').decode()},r={fields['r']}"
    auth_message = f"{bare},{server_first},{without_proof}".encode()
    signature = hmac.digest(stored_key, auth_message, "sha256")
    proof = bytes(a ^ b for a, b in zip(client_key, signature))
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    expected = base64.b64encode(hmac.digest(server_key, auth_message, "sha256")).decode()
    return f"{without_proof},p={base64.b64encode(proof).decode()}", expected
