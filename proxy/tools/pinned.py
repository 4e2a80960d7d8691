"""``openwop-seat pinned-runs``: runs pinned to v1 at the cut, continued or cancelled.

persistence.md §"Runs pinned to v1": a non-terminal run a v2 host inherits
carries ``version.pinned`` events naming change ids.  When every pinned change
id is still implemented the run continues under the reader rule, its pins
untouched; when any is not, the host cancels it with ``run.cancelled``
``{"reason": "v1_pin_unsupported", "cancelledBy": "v2-cutover"}``, and the
certification bundle reports the count.  Which change ids are implemented only
the host knows (spec digest §6 Q10): the operator lists them in a file.

How a cancel is written (one run per transaction, READ COMMITTED):

1. The host's own append lock (``[host] append_lock``), when configured, then
   the seat's run lock ``openwop_seat.run_lock_key(run)`` *exclusively*.  A
   host append takes its own lock first and the seat's (shared, in the append
   trigger) second; taking them in the same order cannot deadlock with it.
   Exclusive, unlike an append's shared lock, because the cancel must see the
   log with no append in flight: the terminal check and the next sequence are
   read after every append (and every stamp) already under way has committed,
   and none starts until this transaction ends, even from a writer that does
   not take the host's lock.
2. Under the locks, in fresh snapshots: the run's era, its terminal events, its
   pins again.  A run that has a terminal event by now is refused (it is left
   as it is); a run whose pins are now all implemented continues.
3. One ``INSERT`` of ``run.cancelled`` at ``COALESCE(MAX(sequence), 0) + 1``
   (the host's own numbering; a pinned run has at least its pin, so this is the
   last sequence plus one whether the log starts at 0 or 1).  ``version.pinned``
   is never written.

The tool writes as a *v2 writer*: a second session claims major 2 with the seat's claim
secret (``openwop_seat.claim``, as the seat does for its sessions; the first, unclaimed, reads the log,
which the net of ADR 0009 refuses to a claimed session), so the
writer rule's trigger accepts its append to an era-3 run (a v1 writer's would be
refused, ``OW005``) and stores it in an era-2 run under the v1 spelling of
``run.cancelled`` (the inverted codemap).  The tool checks the stored type
against the run's era vocabulary and rolls back on any difference.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, field
from typing import Callable

from proxy.config import Config, ConfigError, HostConfig
from proxy.errors import SeatException

PINNED = "version.pinned"
CANCELLED = "run.cancelled"
TERMINAL = ("run.completed", "run.failed", "run.cancelled")  # events.md §The terminal event (W8)
CANCEL_REASON = "v1_pin_unsupported"
CANCELLED_BY = "v2-cutover"
CANCEL_PAYLOAD = {"reason": CANCEL_REASON, "cancelledBy": CANCELLED_BY}

# Column types the tool can fill with a fresh event id (a UUID's text).
_ID_TYPES = ("text", "uuid", "character varying")
_TIME_TYPES = ("timestamp with time zone", "timestamp without time zone", "date")


class PinnedError(SeatException):
    """The pinned-runs command cannot go on; the message says why."""


# --- vocabularies ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Spellings:
    """How the types this command reads and writes are stored, by era (2: v1 names, 3: v2 names)."""

    pinned: dict[int, tuple[str, ...]]
    terminal: dict[int, tuple[str, ...]]
    cancelled: dict[int, str]

    def all_pinned(self) -> list[str]:
        return sorted(set(self.pinned[2]) | set(self.pinned[3]))


def spellings(artifacts) -> Spellings:
    """The era-2 and era-3 spellings of version.pinned, the terminal run events and run.cancelled, from the codemap."""
    def v1_names(v2: str) -> tuple[str, ...]:
        if v2 not in artifacts.v2_types:
            raise PinnedError(f"the pinned codemap has no v2 type {v2!r}: these artifacts cannot say how it is stored")
        return tuple(sorted(v1 for v1, name in artifacts.v1_to_v2.items() if name == v2))

    cancelled_v1 = v1_names(CANCELLED)
    if len(cancelled_v1) != 1:
        raise PinnedError(f"the pinned codemap gives {CANCELLED} {len(cancelled_v1)} v1 names "
                          f"({', '.join(cancelled_v1) or 'none'}): there is no one spelling to append to an era-2 run")
    return Spellings(
        pinned={2: v1_names(PINNED), 3: (PINNED,)},
        terminal={2: tuple(sorted({v1 for t in TERMINAL for v1 in v1_names(t)})), 3: TERMINAL},
        cancelled={2: cancelled_v1[0], 3: CANCELLED})


# --- the implemented change ids ----------------------------------------------------------------


def read_implemented(path: str) -> frozenset[str]:
    """The change ids listed in ``path``: one per line, surrounding whitespace ignored, ``#`` lines and blank lines
    skipped.  Refused (PinnedError): a file that cannot be read or is not UTF-8, a line holding whitespace inside
    (two ids on one line?), and a file that is empty or only whitespace (an export that failed would otherwise
    cancel every pinned run; say "none is implemented" with a file holding just a comment line)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise PinnedError(f"--implemented: cannot read {path!r}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PinnedError(f"--implemented: {path!r} is not UTF-8 (byte {e.start})") from None
    if not text.strip():
        raise PinnedError(f"--implemented: {path!r} is empty: refusing to treat every pinned change id as no longer "
                          f"implemented; if none is, write a file holding only a comment line such as '# none'")
    ids = set()
    for number, line in enumerate(text.splitlines(), 1):
        item = line.strip()
        if not item or item.startswith("#"):
            continue
        if "\0" in item or any(c.isspace() for c in item):
            raise PinnedError(f"--implemented: {path!r} line {number}: {item!r} is not one change id "
                              f"(one change id per line, no whitespace inside)")
        ids.add(item)
    return frozenset(ids)


# --- the runs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pin:
    sequence: int
    change_id: str | None  # None: the payload names no change id (see problem)
    version: object = None  # the payload's version as stored (shown, not decided on)
    problem: str = ""

    def __str__(self) -> str:
        if self.problem:
            return f"<sequence {self.sequence}: {self.problem}>"
        return self.change_id if self.version is None else f"{self.change_id}@{self.version}"


def parse_pin(sequence: int, payload_text: str | None) -> Pin:
    """A pin from a version.pinned row's payload (jsonb as text); a missing or malformed changeId is a problem,
    never a default."""
    if payload_text is None:
        return Pin(sequence, None, problem="the payload is NULL")
    payload = json.loads(payload_text)
    if not isinstance(payload, dict):
        return Pin(sequence, None, problem=f"the payload is a JSON {type(payload).__name__}, not an object")
    change = payload.get("changeId")
    if not isinstance(change, str) or not change:
        what = "absent" if "changeId" not in payload else f"{json.dumps(change)}, not a non-empty string"
        return Pin(sequence, None, payload.get("version"), problem=f"changeId is {what}")
    return Pin(sequence, change, payload.get("version"))


@dataclass
class PinnedRun:
    run: str
    era: int
    pins: list[Pin] = field(default_factory=list)

    def decide(self, implemented: frozenset[str]) -> tuple[str, str]:
        """("continue" | "cancel" | "undecided", why)."""
        bad = [p for p in self.pins if p.problem]
        if bad:
            return "undecided", "a version.pinned event names no change id: " + "; ".join(str(p) for p in bad)
        missing = sorted({p.change_id for p in self.pins} - implemented)
        if missing:
            return "cancel", "not implemented: " + ", ".join(missing)
        return "continue", "every pinned change id is implemented"


@dataclass(frozen=True)
class EventsTable:
    """The events table's names, quoted, and the INSERT a cancel uses."""

    table: str
    run: str
    type: str
    payload: str
    run_type: str
    insert_sql: str


async def events_table(conn, host: HostConfig) -> EventsTable:
    """Look the events table up and build the cancel's INSERT, or PinnedError naming a column it cannot fill."""
    from proxy.db.sql import quote_ident, quote_qualified

    table = quote_qualified(host.events_table)
    rows = await conn.fetch(
        "SELECT a.attname::text AS name, pg_catalog.format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull, "
        "a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '' AS filled "
        "FROM pg_catalog.pg_attribute a WHERE a.attrelid = pg_catalog.to_regclass($1) AND a.attnum > 0 "
        "AND NOT a.attisdropped ORDER BY a.attnum", table)
    if not rows:
        raise PinnedError(f"the events table {host.events_table!r} (host.events_table) does not exist in this database")
    cols = {r["name"]: r for r in rows}
    for key, name in (("host.run_id_column", host.run_id_column), ("host.type_column", host.type_column),
                      ("host.payload_column", host.payload_column), ("the sequence column", "sequence")):
        if name not in cols:
            raise PinnedError(f"the events table {host.events_table!r} has no column {name!r} ({key})")
    run, typ, payload = (quote_ident(n) for n in (host.run_id_column, host.type_column, host.payload_column))
    run_type = cols[host.run_id_column]["type"]
    names = [run, '"sequence"', typ, payload]
    values = [f"CAST($1 AS {run_type})", "n.next", f"CAST($2 AS {cols[host.type_column]['type']})",
              f"CAST($3 AS {cols[host.payload_column]['type']})"]
    given = {host.run_id_column, "sequence", host.type_column, host.payload_column}
    for name, r in cols.items():
        if name in given or r["filled"]:
            continue
        base = r["type"].split("(")[0]
        if name == host.event_id_column and base in _ID_TYPES:
            value = f"CAST(pg_catalog.gen_random_uuid()::text AS {r['type']})"  # a fresh id, unique as a UUID is
        elif r["attnotnull"] and base in _TIME_TYPES:
            value = "pg_catalog.now()"
        elif r["attnotnull"]:
            raise PinnedError(f"the events table's column {name!r} ({r['type']}) is NOT NULL without a default, and "
                              f"pinned-runs does not know what a run.cancelled event holds there: give it a default")
        else:
            continue  # nullable: left NULL (node id, causation id, ...)
        names.append(quote_ident(name))
        values.append(value)
    # The writer's session is claimed as major 2, so it reads no stored row (the net of ADR 0009): the next
    # sequence comes from events_keys, the table without type and payload, and the append goes through the seat's
    # insert view, which returns the written type as a major-2 reader reads it (ADR 0019).
    insert = (f"INSERT INTO openwop_seat.events_insert_m2 ({', '.join(names)}) SELECT {', '.join(values)} "
              f"FROM (SELECT COALESCE(MAX(e.\"sequence\"), 0) + 1 AS next FROM openwop_seat.events_keys e "
              f"WHERE e.{run} = CAST($1 AS {run_type})) n "
              f"RETURNING openwop_seat_type, (\"sequence\")::bigint")
    return EventsTable(table, run, typ, payload, run_type, insert)


def _pinned_runs_sql(t: EventsTable) -> str:
    """Non-terminal runs holding version.pinned events in their era's spelling, one row per pin.

    $1: every spelling of version.pinned; $2/$3: its era-2/era-3 spellings; $4/$5: the terminal types'."""
    return f"""
WITH candidate AS (
    SELECT DISTINCT (e.{t.run})::text AS run FROM {t.table} e WHERE (e.{t.type})::text = ANY($1::text[])
), era AS (
    SELECT c.run, openwop_seat.era_of(c.run) AS era FROM candidate c
)
SELECT r.run, r.era, (p."sequence")::bigint AS seq, (p.{t.payload})::text AS payload
FROM era r
JOIN {t.table} p ON p.{t.run} = CAST(r.run AS {t.run_type})
    AND (p.{t.type})::text = ANY(CASE WHEN r.era = 2 THEN $2::text[] ELSE $3::text[] END)
WHERE NOT EXISTS (
    SELECT 1 FROM {t.table} x WHERE x.{t.run} = CAST(r.run AS {t.run_type})
        AND (x.{t.type})::text = ANY(CASE WHEN r.era = 2 THEN $4::text[] ELSE $5::text[] END))
ORDER BY r.run, seq
"""


async def find_pinned_runs(conn, t: EventsTable, words: Spellings) -> list[PinnedRun]:
    rows = await conn.fetch(_pinned_runs_sql(t), words.all_pinned(), list(words.pinned[2]), list(words.pinned[3]),
                            list(words.terminal[2]), list(words.terminal[3]))
    runs: dict[str, PinnedRun] = {}
    for r in rows:
        run = runs.setdefault(r["run"], PinnedRun(r["run"], r["era"]))
        run.pins.append(parse_pin(r["seq"], r["payload"]))
    return list(runs.values())


async def count_cancelled(conn, t: EventsTable, words: Spellings) -> int:
    """Runs whose log holds a run.cancelled of reason v1_pin_unsupported by v2-cutover (the certification count)."""
    spelled = sorted({words.cancelled[2], words.cancelled[3]})
    return await conn.fetchval(
        f"SELECT count(DISTINCT e.{t.run}) FROM {t.table} e WHERE (e.{t.type})::text = ANY($1::text[]) "
        f"AND (e.{t.payload})::jsonb ->> 'reason' = $2 AND (e.{t.payload})::jsonb ->> 'cancelledBy' = $3",
        spelled, CANCEL_REASON, CANCELLED_BY)


# --- cancelling ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    run: str
    status: str  # "cancelled", "terminal" (refused: it ended meanwhile), "continue" (its pins are implemented now)
    detail: str


async def cancel_run(conn, host: HostConfig, t: EventsTable, words: Spellings, run: str,
                     implemented: frozenset[str], writer=None) -> Outcome:
    """Append the one run.cancelled of a pinned run in its own transaction, under the host's and the seat's locks.

    ``writer`` (default ``conn``): the session claimed as major 2 that takes the locks and appends; ``conn`` reads
    the stored log. Two sessions because the net (ADR 0009) refuses a claimed session's read of stored rows: the
    reads run while the writer holds the run's lock exclusively, so no append or stamp of the run can commit
    between them and the append, as when one session did both."""
    from proxy.db.writer_sql import host_append_lock_sql

    writer = conn if writer is None else writer
    host_lock = host_append_lock_sql(host)
    async with writer.transaction(isolation="read_committed"):
        if host_lock is not None:
            await writer.fetch(host_lock, run)  # first, as the host's appends take it (see the module docstring)
        await writer.execute("SELECT pg_catalog.pg_advisory_xact_lock(openwop_seat.run_lock_key($1))", run)
        era = await conn.fetchval("SELECT openwop_seat.era_of($1)", run)
        ended = await conn.fetchrow(
            f"SELECT (e.{t.type})::text AS type, (e.\"sequence\")::bigint AS seq FROM {t.table} e "
            f"WHERE e.{t.run} = CAST($1 AS {t.run_type}) AND (e.{t.type})::text = ANY($2::text[]) "
            f"ORDER BY e.\"sequence\" LIMIT 1", run, list(words.terminal[era]))
        if ended is not None:
            return Outcome(run, "terminal", f"it already has a terminal event ({ended['type']} at sequence "
                                            f"{ended['seq']}): not cancelled")
        rows = await conn.fetch(
            f"SELECT (e.\"sequence\")::bigint AS seq, (e.{t.payload})::text AS payload FROM {t.table} e "
            f"WHERE e.{t.run} = CAST($1 AS {t.run_type}) AND (e.{t.type})::text = ANY($2::text[]) "
            f"ORDER BY e.\"sequence\"", run, list(words.pinned[era]))
        now = PinnedRun(run, era, [parse_pin(r["seq"], r["payload"]) for r in rows])
        verdict, why = now.decide(implemented) if now.pins else ("continue", "it holds no version.pinned any more")
        if verdict != "cancel":
            if verdict == "undecided":
                raise PinnedError(f"run {run}: {why}")
            return Outcome(run, "continue", f"not cancelled: {why}")
        # The v2 name: this session is a v2 writer, and the writer rule stores the era's spelling.
        read, seq = await writer.fetchrow(t.insert_sql, run, CANCELLED, json.dumps(CANCEL_PAYLOAD))
        if read != CANCELLED:  # pragma: no cover - the writer rule and the codemap disagree
            raise PinnedError(f"run {run}: the append reads back as {read!r}, not {CANCELLED!r}: rolled back")
        stored = words.cancelled[era]
        return Outcome(run, "cancelled", f"{stored} at sequence {seq} (era {era}; {why})")


# --- the command -----------------------------------------------------------------------------


async def pinned_runs(config: Config, dsn: str, implemented: frozenset[str] | None, cancel: bool,
                      out: Callable[[str], None] = print) -> int:
    """List (and with ``implemented`` decide, with ``cancel`` cancel) the non-terminal pinned runs; the exit status."""
    import asyncpg

    from proxy.artifacts.load import load_artifacts
    from proxy.db.claims import claim_async, load_claim_secret
    from proxy.db.connect import connect
    from proxy.db.migrate import verify

    artifacts = load_artifacts()
    words = spellings(artifacts)
    secret = None
    if cancel:  # before connecting: a missing secret changes nothing
        secret = load_claim_secret(config)
        if secret is None:
            raise ConfigError("pinned-runs --cancel appends as a v2 writer, which needs the seat's claim secret "
                              "(host.claim_secret_file or $OPENWOP_SEAT_CLAIM_SECRET)")
    conn = await connect(dsn)
    writers: list = []
    try:
        await verify(conn, config, artifacts)  # the same artifacts and writer rule as the database's
        from proxy.tools.common import check_privileges

        await check_privileges(conn, config.host, "pinned-runs" + (" --cancel" if cancel else ""),
                               {"events": ("SELECT", "INSERT") if cancel else ("SELECT",),
                                **({"runs": ("SELECT",)} if config.host.era_column is not None else {})})
        t = await events_table(conn, config.host)
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            runs = await find_pinned_runs(conn, t, words)
        verdicts = {}
        for run in runs:
            pins = ", ".join(str(p) for p in run.pins)
            if implemented is None:
                out(f"run {run.run} (era {run.era}): pinned {pins}")
                continue
            verdicts[run.run] = run.decide(implemented)
            verdict, why = verdicts[run.run]
            out(f"run {run.run} (era {run.era}): pinned {pins}: {verdict} ({why})")
        tally = {v: sum(1 for verdict, _ in verdicts.values() if verdict == v)
                 for v in ("continue", "cancel", "undecided")}
        if implemented is None:
            out(f"pinned runs: {len(runs)} non-terminal (pass --implemented FILE to decide them)")
        else:
            out(f"pinned runs: {len(runs)} non-terminal: continue {tally['continue']}, cancel {tally['cancel']}, "
                f"undecided {tally['undecided']}")
        failed = tally["undecided"] > 0
        if cancel:
            writer = await connect(dsn)  # claimed as major 2 (a v2 writer); conn stays unclaimed and reads
            writers.append(writer)
            row = await claim_async(writer, secret, 2)
            if row is None:  # pragma: no cover - verify found the schema
                raise PinnedError("the openwop_seat schema is missing: run openwop-seat migrate")
            done = {"cancelled": 0, "continue": tally["continue"], "terminal": 0}
            for run in runs:
                if verdicts[run.run][0] != "cancel":
                    continue
                try:
                    outcome = await cancel_run(conn, config.host, t, words, run.run, implemented, writer)
                except PinnedError as e:
                    out(f"NOT cancelled: {e}")
                    failed = True
                    continue
                except asyncpg.PostgresError as e:  # this run's transaction rolled back; the rest go on
                    out(f"NOT cancelled: run {run.run}: {e.sqlstate}: {e}")
                    failed = True
                    continue
                done[outcome.status] += 1
                verb = {"cancelled": "cancelled", "terminal": "refused", "continue": "continued"}[outcome.status]
                out(f"{verb} run {outcome.run}: {outcome.detail}")
            out(f"pinned runs cancelled: {done['cancelled']}")
            out(f"pinned runs continued: {done['continue']}")
            if done["terminal"]:
                out(f"pinned runs refused (terminal by the time of the cancel): {done['terminal']}")
        elif implemented is not None:
            out(f"pinned runs to cancel: {tally['cancel']} (pass --cancel to cancel them)")
            out(f"pinned runs continued: {tally['continue']}")
        total = await count_cancelled(conn, t, words)
        out(f"runs cancelled with {CANCEL_REASON} by {CANCELLED_BY}, in total (for the certification bundle): {total}")
    finally:
        for w in writers:
            await w.close()
        await conn.close()
    return 1 if failed else 0


def cmd_pinned_runs(config: Config, dsn: str, implemented_path: str | None, cancel: bool) -> int:
    """``openwop-seat pinned-runs``: 0 when every run listed was handled, 1 otherwise, 2 for bad input."""

    from proxy.tools.common import unavailable

    name = "openwop-seat pinned-runs"
    if cancel and implemented_path is None:
        print(f"{name}: --cancel needs --implemented FILE (the change ids the host still implements)", file=sys.stderr)
        return 2
    try:
        implemented = read_implemented(implemented_path) if implemented_path is not None else None
    except PinnedError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 2

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        return asyncio.run(pinned_runs(config, dsn, implemented, cancel, out=say))
    except PinnedError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted: the runs reported cancelled stay cancelled, the one in progress was rolled "
              f"back; run it again to finish", file=sys.stderr)
        return 130
    except Exception as e:
        if (message := unavailable(e)) is None:
            raise
        print(f"{name}: {message}", file=sys.stderr)
        return 1
