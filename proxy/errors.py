"""Errors: the refusal codes the seat (and the SQL it installs) sends, and the seat's own exceptions.

Every refusal is an ErrorResponse whose message starts with the code and whose
DETAIL is the OpenWOP error envelope as JSON, so a host can surface it with the
registered HTTP status. SQLSTATE class "OW" is not used by PostgreSQL.

Every exception the seat raises for an operator to read derives from
:class:`SeatException`; :func:`describe` turns it (or an OS, TLS or database
error met on the way) into the one sentence that `serve`, a reload and the
cutover tools print.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorCode:
    """One refusal condition: its code, SQLSTATE and HTTP status (an entry of a table, not an exception)."""

    code: str  # the OpenWOP error code, or the seat's own
    sqlstate: str
    http_status: int
    spec: bool  # True: registered in the pinned errors.json; False: the seat's own code
    meaning: str


ERRORS = {e.code: e for e in (
    ErrorCode("event_type_unmapped", "OW001", 500, True,
              "an era-2 row's type has no codemap row and no registered vendor prefix"),
    ErrorCode("payload_unprojectable", "OW002", 500, True,
              "an era-2 row's payload holds keys the v2 definition can neither carry nor seat"),
    ErrorCode("event_row_malformed", "OW003", 500, False,
              "an event row the reader rule cannot read without defaulting a field (NULL type, unknown run)"),
    ErrorCode("statement_untranslatable", "OW004", 500, False,
              "a statement reads event columns in a way the seat cannot translate exactly"),
    ErrorCode("era2_write_refused", "OW005", 409, False,
              "an era-2 (v1-vocabulary) write into a run already stamped era 3"),
    ErrorCode("v1_representation_refused", "OW006", 500, False,
              "a major-1 read of an era-3 log while the codemap is not a bijection"),
    ErrorCode("result_untranslatable", "OW007", 500, False,
              "a result carries event columns without the seat's era column (a view over events, or a "
              "statement shape the seat does not know); the session is closed rather than relay it"),
    ErrorCode("stored_read_refused", "OW008", 500, False,
              "a session claimed as major 1 or 2 read the events table's stored rows other than through the seat's "
              "translated relations (the net in the database, ADR 0009)"),
)}

# Codes only the seat itself sends (never raised by the SQL it installs, so not in the generated SQL's tables).
SEAT_ERRORS = {e.code: e for e in (
    ErrorCode("client_encoding_refused", "OW009", 500, False,
              "a translated session in a client_encoding whose characters may contain a backslash or a quote "
              "(SJIS, BIG5, GBK, GB18030, JOHAB, UHC): the seat would not parse its statements as PostgreSQL does"),
)}
CODES = {**ERRORS, **SEAT_ERRORS}  # every code, by name

BY_SQLSTATE = {e.sqlstate: e for e in CODES.values()}


class SeatException(Exception):
    """Base of the seat's own exceptions: the message is a sentence for an operator, after ``prefix``."""

    prefix = ""

    def describe(self) -> str:
        return f"{self.prefix}{self}"


class ListenError(SeatException):
    """A listen address of the seat cannot be bound: names the address and its configuration key."""

    def __init__(self, key: str, address: object, error: OSError):
        reason = error.strerror or str(error)
        super().__init__(f"cannot listen on {address} ({key}): {reason}")
        self.key = key
        self.address = address
        self.error = error


def describe(e: BaseException, *, database: str = "the database") -> str | None:
    """What to print for an error that stops a command or a reload, or None for one that is a bug.

    ``database`` names the database an OS-level failure was met on (e.g. "the host database (host.dsn)").
    """
    if isinstance(e, SeatException):
        return e.describe()
    if isinstance(e, ssl.SSLError):
        return f"tls: {e.reason or e}"
    import asyncpg  # here, not at the top: this module is imported by pure code that needs no driver

    if isinstance(e, (asyncpg.PostgresError, asyncpg.InterfaceError)):
        return f"error from {database}: {e}"
    if isinstance(e, (OSError, TimeoutError)):
        return f"cannot connect to {database}: {e}"
    return None
