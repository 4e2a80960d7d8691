"""The claim secret: where it is read from, and the proofs that claim a session's major (ADR 0006)."""


from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from typing import Callable

from proxy.config import Config, ConfigError
from proxy.db.layout import (
    CHALLENGE_SQL,
    CLAIM_SECRET_ENV,
    CLAIM_SECRET_MIN_LENGTH,
    CLAIM_SQL,
)

# --- the claim secret ------------------------------------------------------------------------


def load_claim_secret(config: Config) -> str | None:
    """The secret of ``openwop_seat.claim``: ``[host] claim_secret_file``, else $OPENWOP_SEAT_CLAIM_SECRET, else None.

    The file's content is UTF-8 with any trailing newline removed.  A file that
    is missing, unreadable or empty, or a secret shorter than
    CLAIM_SECRET_MIN_LENGTH characters, is a ConfigError naming where it came
    from (never the secret).
    """
    path = config.host.claim_secret_file
    if path is not None:
        key = "host.claim_secret_file"
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise ConfigError(f"{key}: no such file {path!r}") from None
        except OSError as e:
            raise ConfigError(f"{key}: cannot read {path!r}: {e.strerror}") from None
        try:
            secret = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            raise ConfigError(f"{key}: {path!r} is not UTF-8") from None
    else:
        key = f"${CLAIM_SECRET_ENV}"
        secret = os.environ.get(CLAIM_SECRET_ENV)
        if secret is None:
            return None
    if not secret:
        raise ConfigError(f"{key}: the claim secret is empty")
    if "\0" in secret:
        raise ConfigError(f"{key}: the claim secret holds a NUL character")
    if len(secret) < CLAIM_SECRET_MIN_LENGTH:
        raise ConfigError(f"{key}: the claim secret has {len(secret)} characters, fewer than "
                          f"{CLAIM_SECRET_MIN_LENGTH} (make one with: openssl rand -hex 32)")
    return secret


def claim_key(salt: str, secret: str) -> bytes:
    """The claim's HMAC key: SHA-256 of ``salt || secret`` (UTF-8); its hex is what ``claim_secret.hash`` holds."""
    return hashlib.sha256((salt + secret).encode("utf-8")).digest()


def claim_proof(secret: str, challenge_answer: str, major: int) -> str:
    """The proof ``claim(proof, major)`` verifies, for what ``claim_challenge()`` returned (``salt:challenge``)."""
    salt, _, challenge = challenge_answer.partition(":")
    return hmac.new(claim_key(salt, secret), f"openwop_seat.claim:{challenge}:{major}".encode("utf-8"),
                    hashlib.sha256).hexdigest()


def claim_once_proof(secret: str, salt: str, pid: int, at_us: int, nonce: str, major: int) -> str:
    """The proof ``claim_once(pid, at_us, nonce, major, proof)`` verifies (ADR 0013): no challenge, one round trip."""
    return hmac.new(claim_key(salt, secret), f"openwop_seat.claim_once:{pid}:{at_us}:{nonce}:{major}".encode("utf-8"),
                    hashlib.sha256).hexdigest()


def claim_once_params(secret: str, salt: str, pid: int, major: int, at_us: int | None = None,
                      nonce: str | None = None) -> tuple[int, int, str, int, str]:
    """The five parameters of ``claim_once`` for a backend ``pid``: a fresh nonce and the seat's time, unless given."""
    if at_us is None:
        at_us = time.time_ns() // 1000
    if nonce is None:
        nonce = secrets.token_hex(16)
    return pid, at_us, nonce, major, claim_once_proof(secret, salt, pid, at_us, nonce, major)


async def claim_async(conn, secret: str, major: int):
    """Claim ``major`` on an asyncpg connection as the seat does: the claim row ``(claim, owns openwop_seat)``."""
    challenge = await conn.fetchval(CHALLENGE_SQL)
    return await conn.fetchrow(CLAIM_SQL, claim_proof(secret, challenge, major), major)


def claim_secret_hash(salt: str, secret: str) -> str:
    """What ``claim_secret.hash`` holds: hex SHA-256 of ``salt || secret`` in UTF-8 (as ``claim`` computes it)."""
    return hashlib.sha256((salt + secret).encode("utf-8")).hexdigest()


async def _install_claim_secret(conn, secret: str | None, say: Callable[[str], None],
                                note: Callable[[str], None]) -> None:
    async with conn.transaction():
        row = await conn.fetchrow("SELECT hash, salt FROM openwop_seat.claim_secret")
        if secret is None:
            note("no claim secret given: the existing one is kept" if row is not None
                 else "no claim secret installed: every session is a v1 writer")
            return
        if row is not None and secrets.compare_digest(claim_secret_hash(row["salt"], secret), row["hash"]):
            note("the claim secret given is the one installed: kept")
            return
        salt = secrets.token_hex(16)
        await conn.execute("DELETE FROM openwop_seat.claim_secret")
        await conn.execute("INSERT INTO openwop_seat.claim_secret (hash, salt) VALUES ($1, $2)",
                           claim_secret_hash(salt, secret), salt)
    if row is None:
        say("installed the claim secret (its salted SHA-256: the secret itself is not stored)")
    else:
        say("replaced the claim secret: seats still holding the old one can no longer claim a major")
