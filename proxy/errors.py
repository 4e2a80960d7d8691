"""The errors the seat (and the SQL it installs) raises: one dedicated SQLSTATE per condition.

Every refusal is an ErrorResponse whose message starts with the code and whose
DETAIL is the OpenWOP error envelope as JSON, so a host can surface it with the
registered HTTP status. SQLSTATE class "OW" is not used by PostgreSQL.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SeatError:
    code: str  # the OpenWOP error code, or the seat's own
    sqlstate: str
    http_status: int
    spec: bool  # True: registered in the pinned errors.json; False: the seat's own code
    meaning: str


ERRORS = {e.code: e for e in (
    SeatError("event_type_unmapped", "OW001", 500, True,
              "an era-2 row's type has no codemap row and no registered vendor prefix"),
    SeatError("payload_unprojectable", "OW002", 500, True,
              "an era-2 row's payload holds keys the v2 definition can neither carry nor seat"),
    SeatError("event_row_malformed", "OW003", 500, False,
              "an event row the reader rule cannot read without defaulting a field (NULL type, unknown run)"),
    SeatError("statement_untranslatable", "OW004", 500, False,
              "a statement reads event columns in a way the seat cannot translate exactly"),
    SeatError("era2_write_refused", "OW005", 409, False,
              "an era-2 (v1-vocabulary) write into a run already stamped era 3"),
    SeatError("v1_representation_refused", "OW006", 500, False,
              "a major-1 read of an era-3 log while the codemap is not a bijection"),
    SeatError("result_untranslatable", "OW007", 500, False,
              "a result carries event columns without the seat's era column (a view over events, or a "
              "statement shape the seat does not know); the session is closed rather than relay it"),
)}

BY_SQLSTATE = {e.sqlstate: e for e in ERRORS.values()}
