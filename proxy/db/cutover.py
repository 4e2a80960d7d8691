"""Where the cutover stands, read from the host database: what ``status`` prints, the gauges on /metrics, and the
checks ``retire`` and ``uninstall`` make before they change anything (docs/lifecycle.md).

Everything here only reads, and only what the seat's schema and the host's tables hold: the era store, the
preserved originals, the heartbeats and sightings every seat process writes (``openwop_seat.seen``, layout step
8), audit's recorded verdicts, and the claims of backends alive now.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

from proxy.config import Config
from proxy.db.layout import SCHEMA, SchemaMissing
from proxy.db.sql import quote_ident, quote_qualified

# A seat process writes its heartbeat and its tally of sessions this often (and once at start).
HEARTBEAT_SECONDS = 10.0
# A seat is serving while its last heartbeat is younger than this.
SERVING_WINDOW_SECONDS = 3 * HEARTBEAT_SECONDS
# The default quiet period: no v1 writer (major 1 or raw) connected through a seat for this long before retire.
DEFAULT_QUIET_SECONDS = 7 * 24 * 3600
# How many run ids a listing shows (status; the commands that act read them all).
LISTED = 50

TERMINAL_V2 = ("run.completed", "run.failed", "run.cancelled")
SEAT_SOURCES = {"created": "stamped by a seat (created by a v2 writer)", "backfill": "converted by backfill",
                "backfill-repair": "converted by backfill --repair"}

HEARTBEAT_SQL = f"SELECT {SCHEMA}.seen($1, $2, $3, $4::jsonb, $5)"


def terminal_v1(artifacts) -> list[str]:
    """The era-2 (v1) spellings of the terminal run events."""
    return sorted(v1 for v1, v2 in artifacts.v1_to_v2.items() if v2 in TERMINAL_V2)


@dataclass
class Facts:
    """One reading of the cutover's state; ``state`` is absent, installed, uninstalling or retired."""

    state: str
    database: str
    meta: dict = field(default_factory=dict)
    eras: dict = field(default_factory=dict)  # "2" and each era-3 source -> runs
    era2_open: int | None = None
    newest_era2: tuple[str, datetime | None] | None = None  # (column, newest value) or None without a time column
    era3_without_original: list = field(default_factory=list)  # (run, why), all of them
    backfilled: list = field(default_factory=list)  # runs with preserved originals
    audit: dict | None = None
    sightings: list = field(default_factory=list)  # dicts: major, user, first_seen, last_seen, sessions, age
    seats: list = field(default_factory=list)  # dicts: seat, started_at, last_seen, version, age
    live_claims: dict = field(default_factory=dict)  # major -> sessions of backends alive now
    counters: dict = field(default_factory=dict)
    now: datetime | None = None

    @property
    def era2(self) -> int:
        return self.eras.get("2", 0)

    @property
    def era3(self) -> int:
        return sum(n for k, n in self.eras.items() if k != "2")

    def serving(self) -> list[str]:
        """Why a seat counts as serving now ([] when none does)."""
        out = [f"seat {s['seat']} sent a heartbeat {s['age']:.0f} s ago" for s in self.seats
               if s["age"] < SERVING_WINDOW_SECONDS and s["stopped_at"] is None]
        live = {k: v for k, v in self.live_claims.items() if v}
        if live:
            out.append("claimed sessions are open now ("
                       + ", ".join(f"major {'raw' if k == 0 else k}: {v}" for k, v in sorted(live.items())) + ")")
        return out

    def v1_recent(self, quiet: float) -> list[dict]:
        """Sightings of v1 writers (major 1 or raw) younger than ``quiet`` seconds."""
        return [s for s in self.sightings if s["major"] in ("1", "raw") and s["age"] < quiet]

    def retire_blockers(self, quiet: float, allow_era2: bool) -> list[str]:
        if self.state == "retired":
            return []
        if self.state != "installed":
            return [f"the seat's schema is {self.state}"]
        out = []
        if self.era2 and not allow_era2:
            out.append(f"{self.era2} era-2 runs remain ({self.era2_open} of them open): backfill them "
                       f"(openwop-seat backfill --all), or accept that they stay v1-only with --allow-era2")
        for s in self.v1_recent(quiet):
            out.append(f"a major-{s['major']} session of user {s['user']!r} connected through a seat "
                       f"{s['age']:.0f} s ago, within the quiet period of {quiet:.0f} s")
        for why in self.serving():
            out.append(f"a seat is serving: {why}; stop every seat first")
        return out

    def uninstall_blockers(self, keep_era3: bool) -> list[str]:
        if self.state == "absent":
            return []
        if self.state == "retired":
            return ["the seat was retired: the way back is closed (`retire --drop-evidence` removes what is left)"]
        out = []
        if self.era3_without_original and not keep_era3:
            out.append(f"{len(self.era3_without_original)} era-3 runs have no v1 original (a v2 host created them, "
                       f"or appended to them after their backfill): they cannot be turned back into v1 logs; "
                       f"--keep-era3 leaves their rows as they are")
        for why in self.serving():
            out.append(f"a seat is serving: {why}; stop every seat first")
        return out


async def _time_column(conn, events: str) -> str | None:
    return await conn.fetchval(
        "SELECT a.attname::text FROM pg_catalog.pg_attribute a WHERE a.attrelid = pg_catalog.to_regclass($1) "
        "AND a.attnum > 0 AND NOT a.attisdropped AND a.atttypid IN ('pg_catalog.timestamptz'::pg_catalog.regtype, "
        "'pg_catalog.timestamp'::pg_catalog.regtype) ORDER BY a.attnum LIMIT 1", events)


async def _exists(conn, table: str) -> bool:
    return await conn.fetchval("SELECT pg_catalog.to_regclass($1) IS NOT NULL", table)


async def read_facts(conn, config: Config, artifacts, *, full: bool = True) -> Facts:
    """The cutover's state; SchemaMissing when there is no seat schema (SchemaTooNew/SchemaGap from the layout).

    ``full`` False skips the listings of runs (the gauges need only the counts)."""
    from proxy.db.migrate import RETIRED_AT, UNINSTALLING_SINCE
    from proxy.db.verify import _layout_of, read_meta

    host = config.host
    database = await conn.fetchval("SELECT pg_catalog.current_database()::text")
    meta = await read_meta(conn)
    if meta is None:
        raise SchemaMissing(f"database {database!r} has no {SCHEMA} schema: the seat is not installed there "
                            f"(never migrated, or uninstalled)")
    _layout_of(meta)  # SchemaTooNew, SchemaGap
    state = "retired" if meta.get(RETIRED_AT) else "uninstalling" if meta.get(UNINSTALLING_SINCE) else "installed"
    f = Facts(state, database, meta, now=await conn.fetchval("SELECT pg_catalog.now()"))
    events, runs = quote_qualified(host.events_table), quote_qualified(host.runs_table)
    has_events, has_runs = await _exists(conn, events), await _exists(conn, runs)
    run = quote_ident(host.run_id_column)
    typ = quote_ident(host.type_column)
    era_table = await _exists(conn, f"{SCHEMA}.run_era")
    originals = await _exists(conn, f"{SCHEMA}.events_v1_original")
    known = " UNION ".join(
        [f"SELECT e.{run}::text AS run FROM {events} e GROUP BY 1"] * has_events
        + [f"SELECT r.{run}::text FROM {runs} r"] * has_runs) or "SELECT NULL::text AS run WHERE false"
    if host.era_column is not None and has_runs:
        col = quote_ident(host.era_column)
        stamp = (f"(SELECT CASE WHEN x.{col} IS NULL THEN '2' WHEN x.{col} = 3 THEN 'era-column' "
                 f"ELSE 'malformed' END FROM {runs} x WHERE x.{run}::text = k.run)")
        era3_of = f"(SELECT x.{col} = 3 FROM {runs} x WHERE x.{run}::text = e.{run}::text)"
    elif era_table:
        stamp = f"(SELECT s.source FROM {SCHEMA}.run_era s WHERE s.run_id = k.run)"
        era3_of = f"EXISTS (SELECT 1 FROM {SCHEMA}.run_era s WHERE s.run_id = e.{run}::text)"
    else:  # retired with its evidence removed: nothing is stamped any more
        stamp, era3_of = "NULL::text", "false"
    rows = await conn.fetch(f"SELECT COALESCE({stamp}, '2') AS era, count(*) AS n FROM ({known}) k GROUP BY 1")
    f.eras = {r["era"]: r["n"] for r in rows}
    if has_events:
        terminal = terminal_v1(artifacts)
        f.era2_open = await conn.fetchval(
            f"SELECT count(*) FROM (SELECT 1 FROM {events} e WHERE NOT COALESCE({era3_of}, false) GROUP BY e.{run} "
            f"HAVING NOT pg_catalog.bool_or(e.{typ}::text = ANY($1::text[]))) x", terminal)
        tcol = await _time_column(conn, events)
        if tcol is not None:
            newest = await conn.fetchval(
                f"SELECT max(e.{quote_ident(tcol)})::timestamptz FROM {events} e "
                f"WHERE NOT COALESCE({era3_of}, false)")
            f.newest_era2 = (tcol, newest)
    if full and has_events and (era_table or host.era_column is not None):
        f.era3_without_original = [(r["run"], r["why"]) for r in await conn.fetch(
            await _era3_without_original_sql(conn, config, originals))]
    if originals:
        f.backfilled = [r["run_id"] for r in await conn.fetch(
            f"SELECT DISTINCT run_id FROM {SCHEMA}.events_v1_original ORDER BY 1")] if full else []
    if await _exists(conn, f"{SCHEMA}.audit_verdicts"):
        row = await conn.fetchrow(f"SELECT finished_at, ok, summary::text AS summary, artifact_digest, "
                                  f"declarations_digest, by_role::text AS by_role FROM {SCHEMA}.audit_verdicts "
                                  f"ORDER BY finished_at DESC LIMIT 1")
        if row is not None:
            f.audit = {**dict(row), "summary": json.loads(row["summary"])}
    if await _exists(conn, f"{SCHEMA}.sessions_seen"):
        f.sightings = [dict(r) for r in await conn.fetch(
            f"SELECT major, usename AS user, first_seen, last_seen, sessions, last_seat, "
            f"extract(epoch FROM pg_catalog.now() - last_seen)::float8 AS age FROM {SCHEMA}.sessions_seen "
            f"ORDER BY major, usename")]
    if await _exists(conn, f"{SCHEMA}.seats"):
        f.seats = [dict(r) for r in await conn.fetch(
            f"SELECT seat, started_at, last_seen, stopped_at, version, reported_by::text AS reported_by, "
            f"extract(epoch FROM pg_catalog.now() - last_seen)::float8 AS age FROM {SCHEMA}.seats "
            f"ORDER BY last_seen DESC")]
    if await conn.fetchval(f"SELECT pg_catalog.to_regprocedure('{SCHEMA}.live_claims()') IS NOT NULL"):
        f.live_claims = {r["major"]: r["sessions"] for r in await conn.fetch(
            f"SELECT major, sessions FROM {SCHEMA}.live_claims()")}
    for name in ("runs_stamped_created", "appends_translated"):
        if await _exists(conn, f"{SCHEMA}.{name}"):
            row = await conn.fetchrow(f"SELECT last_value, is_called FROM {SCHEMA}.{name}")
            f.counters[name] = row["last_value"] if row["is_called"] else 0
    return f


async def _era3_without_original_sql(conn, config: Config, originals: bool) -> str:
    """Era-3 runs whose log cannot be turned back into v1: no preserved rows (a v2 writer created it), or events
    with no preserved row (appended after its backfill)."""
    host = config.host
    events = quote_qualified(host.events_table)
    run = quote_ident(host.run_id_column)
    if host.era_column is not None:
        era3 = (f"SELECT x.{run}::text AS run FROM {quote_qualified(host.runs_table)} x "
                f"WHERE x.{quote_ident(host.era_column)} = 3")
    else:
        era3 = f"SELECT s.run_id AS run FROM {SCHEMA}.run_era s"
    if not originals:
        return f"SELECT t.run, 'no v1 original' AS why FROM ({era3}) t ORDER BY 1"
    return (f"SELECT t.run, CASE WHEN NOT EXISTS (SELECT 1 FROM {SCHEMA}.events_v1_original o WHERE o.run_id = t.run) "
            f"THEN 'no v1 original (created by a v2 writer)' ELSE 'events appended after its backfill' END AS why "
            f"FROM ({era3}) t WHERE NOT EXISTS (SELECT 1 FROM {SCHEMA}.events_v1_original o WHERE o.run_id = t.run) "
            f"OR EXISTS (SELECT 1 FROM {events} e WHERE e.{run}::text = t.run AND NOT EXISTS ("
            f"SELECT 1 FROM {SCHEMA}.events_v1_original o WHERE o.run_id = t.run AND o.sequence = e.sequence)) "
            f"ORDER BY 1")
