"""``openwop-seat backfill``: convert era-2 runs to era 3 in place, one run per transaction; ``--restore`` undoes one.

One run, one READ COMMITTED transaction, in this order:

1. the host's own append lock for the run (``[host] append_lock``), when
   configured: first, as the host's append path takes it before its INSERT
   fires the seat's trigger, so the two paths take the locks in one order;
2. the seat's run lock, exclusively: the key ``stamp_run`` takes and every
   append takes shared (:mod:`proxy.db`), so appends in flight have
   committed before it is granted and new ones wait for this transaction;
3. the run's era (``era_of``, in a snapshot taken after the locks): a run
   already era 3 is left alone, one with a malformed era stamp is skipped;
4. every event row of the run through ``try_v2p`` with era 2 (``read_v2p`` of
   the read path, returning refusals), and the type mapping the seat applies
   (``renamed_types``): a run with a row that would fail is skipped and
   reported, nothing changed; so is a run with a row whose projected payload
   would not validate against its v2 definition (a required key nothing
   provides: ``schema_invalid``), unless ``--allow-schema-invalid`` says to
   write it anyway (counted in the summary);
5. the run's rows, as they are, into ``openwop_seat.events_v1_original``
   (type and payload in their text forms, and the whole row as its row type's
   text);
6. ``type`` and ``payload`` of the rows that change rewritten under their
   ``(run_id, sequence)`` key to exactly what a major-2 reader was served (a
   payload the projection leaves equal is not touched);
7. ``stamp_run(run, 'backfill')``: era 3.

Repair (``--repair FILE``, ADR 0007).  A stored type that is neither in the
codemap nor a registered vendor type fails every major-2 read of its run
(``event_type_unmapped``), and the seat maps no such spelling at read time.
The operator may name, in a JSON object, stored spellings and the codemap
type each stands for (``{"node.interrupt.resolved": "interrupt.resolved"}``).
Backfill then reads those rows as if stored under that codemap type (step 4)
and rewrites them with the rest of the run (step 6); the originals are
preserved as always (step 5, so ``--restore`` puts the stored spelling back),
the run is stamped with source ``backfill-repair``, and the summary lists
every repair by spelling.  Nothing else changes: the repair is one run's
conversion, explicit and audited, never a read-time mapping.

The era is stamped last so that steps 3-6 see the run as era 2; the locks of
steps 1-2 are what keeps appends out meanwhile.  Killed at any point, the
transaction rolls back: a run is converted entirely or not at all, and a
re-run picks up where it stopped (era-3 runs are skipped).

The events table's UPDATE guard refuses a change of ``type``; it admits this
one because backfill connects as the owner of ``openwop_seat`` and names the
run in ``openwop_seat.rewrite_run`` for its transaction
(:data:`proxy.db.REWRITE_SETTING`).  That role also needs SELECT and
UPDATE on the host's events table and, with ``[host] era_column``, on its runs
table.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import orjson

from proxy.db.layout import REWRITE_SETTING, SCHEMA, SchemaError
from proxy.db.projection_sql import META_SEPARATOR
from proxy.db.reader_sql import TRY_REFUSED, declared_payload_sql, read_project_sql
from proxy.db.sql import quote_ident, quote_literal, quote_qualified
from proxy.db.verify import writer_tables
from proxy.db.writer_sql import host_append_lock_sql, stamp_run_sql
from proxy.tools.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    MALFORMED,
    Progress,
    UsageError,
    _check_json_path,
    _write_json,
    bar,
    check_privileges,
    eras_of,
    events_from,
    list_runs_sql,
    open_checked,
    run_col,
    unavailable,
)
from proxy.tools.common import (
    rate_eta as _rate_eta,
)

SOURCE = "backfill"  # run_era.source of the runs it stamps
REPAIR_SOURCE = "backfill-repair"  # ... and of the runs in which it applied a --repair
ORIGINALS = f"{SCHEMA}.events_v1_original"
RETRY_SQLSTATES = ("40001", "40P01")  # serialization failure, deadlock: the run is tried again
RETRIES = 3


class Skip(Exception):
    """This run is not converted (or restored); the reason is reported and nothing of it changed."""

    def __init__(self, reason: str, code: str | None = None):
        super().__init__(reason)
        self.reason, self.code = reason, code


@dataclass
class Summary:
    converted: int = 0
    events_rewritten: int = 0
    events_preserved: int = 0
    already: int = 0
    invalid_written: int = 0  # schema-invalid payloads written (only with --allow-schema-invalid)
    repaired: Counter = field(default_factory=Counter)  # (stored spelling, codemap type) -> events
    repaired_runs: Counter = field(default_factory=Counter)  # (stored spelling, codemap type) -> runs
    repair_digest: str | None = None  # sha256 of the --repair file
    skipped: list = field(default_factory=list)  # (run, code or None, reason)
    declared: Counter = field(default_factory=Counter)  # v2 type -> events whose payload the declarations change
    declarations: object = None  # proxy.artifacts.declarations.Declarations in force (ADR 0010)
    runs_asked: int = 0  # runs asked for (--runs) or with events (--all)
    elapsed: float = 0.0  # seconds

    @property
    def ok(self) -> bool:
        return not self.skipped


class Backfill:
    """The SQL of one configuration, and the conversion and restore of one run."""

    def __init__(self, conn, config, *, dry_run: bool = False, allow_invalid: bool = False,
                 repairs: dict[str, str] | None = None, declarations=None):
        self.conn = conn
        self.host = host = config.host
        self.dry_run = dry_run
        self.allow_invalid = allow_invalid
        self.invalid = 0  # schema-invalid rows of the last run planned
        self.repairs = repairs or {}
        self.repaired: Counter = Counter()  # (stored, codemap type) -> rows of the last run planned
        self.declared: Counter = Counter()  # v2 type -> rows of the last run planned the declarations change
        e = "e"
        # With the operator's declarations (ADR 0010) each payload is projected with them applied first
        # (declared_v2): the run is judged, and written, as a major-2 reader with the declarations reads it.
        declared = declarations is not None and not declarations.empty
        dpayload = declared_payload_sql(host, e) if declared else None
        dcol = (f", CASE WHEN ({dpayload}) IS DISTINCT FROM ({e}.{quote_ident(host.payload_column)})::jsonb "
                f"THEN ({dpayload})::text END AS declared" if declared else ", NULL::text AS declared")
        run = run_col(host, e)
        typ = f"{e}.{quote_ident(host.type_column)}"
        payload = f"{e}.{quote_ident(host.payload_column)}"
        self.host_lock = host_append_lock_sql(host)
        self.read = (f"SELECT ({e}.sequence)::bigint AS seq, ({typ})::text AS t, "
                     f"COALESCE({SCHEMA}.renamed_types() ->> ({typ})::text, ({typ})::text) AS t2, x.v{dcol} "
                     f"FROM {events_from(host, e)} CROSS JOIN LATERAL "
                     f"(SELECT {read_project_sql(host, '2::smallint', e, function='try_v2p', payload=dpayload)} "
                     f"AS v) x WHERE {run} = $1 ORDER BY {e}.sequence")
        if self.repairs:
            # The rows as if stored under the codemap type the repair names; every other column as stored.
            col = quote_ident(host.type_column)
            repaired = (f"(SELECT (pg_catalog.jsonb_populate_record(o, pg_catalog.jsonb_build_object("
                        f"{quote_literal(host.type_column)}, COALESCE($2::jsonb ->> (o.{col})::text, "
                        f"(o.{col})::text)))).*, (o.{col})::text AS openwop_seat_stored_type "
                        f"FROM {quote_qualified(host.events_table)} o WHERE o.{quote_ident(host.run_id_column)} = $1)"
                        f" {e}")
            self.read = (f"SELECT ({e}.sequence)::bigint AS seq, ({typ})::text AS t, "
                         f"COALESCE({SCHEMA}.renamed_types() ->> ({typ})::text, ({typ})::text) AS t2, x.v{dcol}, "
                         f"{e}.openwop_seat_stored_type AS stored "
                         f"FROM {repaired} CROSS JOIN LATERAL "
                         f"(SELECT {read_project_sql(host, '2::smallint', e, function='try_v2p', payload=dpayload)}"
                         f" AS v) x ORDER BY {e}.sequence")
        self.preserve = (f"INSERT INTO {ORIGINALS} (run_id, sequence, type, payload, original) "
                         f"SELECT ({run})::text, {e}.sequence, ({typ})::text, ({payload})::text, ({e})::text "
                         f"FROM {events_from(host, e)} WHERE {run} = $1")
        self.typ, self.payload = typ, payload

    async def prepare(self) -> None:
        """Column types for the rewrites (the UPDATEs cast text back to them)."""
        host = self.host
        rows = await self.conn.fetch(
            "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod) AS type FROM pg_catalog.pg_attribute a "
            "WHERE a.attrelid = pg_catalog.to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
            quote_qualified(host.events_table))
        types = {r["attname"]: r["type"] for r in rows}
        for key, col in (("host.payload_column", host.payload_column), ("host.type_column", host.type_column)):
            if col not in types:
                raise SchemaError(f"the events table {host.events_table!r} has no column {col!r} ({key})")
        e, run = "e", run_col(host, "e")
        ptype, ttype = types[host.payload_column], types[host.type_column]
        self.rewrite = (f"UPDATE {events_from(host, e)} SET {quote_ident(host.type_column)} = CAST(u.t AS {ttype}), "
                        f"{quote_ident(host.payload_column)} = CASE WHEN u.p IS NULL THEN {self.payload} "
                        f"ELSE CAST(u.p AS {ptype}) END "
                        f"FROM ROWS FROM (pg_catalog.unnest($2::bigint[]), pg_catalog.unnest($3::text[]), "
                        f"pg_catalog.unnest($4::text[])) AS u(seq, t, p) "
                        f"WHERE {run} = $1 AND {e}.sequence = u.seq")
        self.put_back = (f"UPDATE {events_from(host, e)} "
                         f"SET {quote_ident(host.type_column)} = CAST(o.type AS {ttype}), "
                         f"{quote_ident(host.payload_column)} = CAST(o.payload AS {ptype}) FROM {ORIGINALS} o "
                         f"WHERE o.run_id = $1 AND {run} = $1 AND {e}.sequence = o.sequence "
                         f"AND (({self.typ})::text IS DISTINCT FROM o.type "
                         f"OR ({self.payload})::text IS DISTINCT FROM o.payload)")
        self.strays = (f"SELECT count(*) FILTER (WHERE o.run_id IS NULL) AS appended, "
                       f"count(*) FILTER (WHERE {e}.sequence IS NULL) AS gone, count(o.run_id) AS preserved "
                       f"FROM (SELECT * FROM {events_from(host, e)} WHERE {run} = $1) {e} "
                       f"FULL JOIN (SELECT * FROM {ORIGINALS} WHERE run_id = $1) o ON o.sequence = {e}.sequence")
        if self.host.era_column is None:
            self.unstamp = f"DELETE FROM {SCHEMA}.run_era WHERE run_id = $1"
        else:
            runs_key = f"{quote_ident(host.run_id_column)}"
            self.unstamp = (f"UPDATE {quote_qualified(host.runs_table)} SET {quote_ident(host.era_column)} = NULL "
                            f"WHERE {runs_key} = $1")

    async def _lock(self, run: str) -> None:
        if self.host_lock is not None:
            await self.conn.execute(self.host_lock, run)
        await self.conn.execute(f"SELECT pg_catalog.pg_advisory_xact_lock({SCHEMA}.run_lock_key($1))", run)

    async def _era(self, run: str) -> int:
        import asyncpg

        try:
            async with self.conn.transaction():
                return await self.conn.fetchval(f"SELECT {SCHEMA}.era_of($1)", run)
        except asyncpg.PostgresError as e:
            if e.sqlstate == MALFORMED:
                raise Skip(f"its era stamp is malformed: {e.message}", "event_row_malformed") from None
            raise

    async def _plan(self, run: str) -> tuple[int, list, list, list]:
        """(rows, sequences, v2 types, projected payloads or None) of the rows that change; Skip when one would fail."""
        if self.repairs:
            rows = await self.conn.fetch(self.read, run, json.dumps(self.repairs))
        else:
            rows = await self.conn.fetch(self.read, run)
        seqs, types, payloads = [], [], []
        self.repaired = Counter((r["stored"], r["t"]) for r in rows if self.repairs and r["stored"] != r["t"])
        refused = [r for r in rows if r["v"].startswith(TRY_REFUSED)]
        if refused:
            first = orjson.loads(refused[0]["v"][len(TRY_REFUSED):])
            raise Skip(f"{len(refused)} of its {len(rows)} events would fail the reader rule; the first, at "
                       f"sequence {refused[0]['seq']}: {first.get('error')}: {first.get('message')}",
                       first.get("error"))
        invalid = []  # (sequence, v2 type, missing keys)
        self.declared = Counter(r["t2"] for r in rows if r["declared"] is not None)
        for r in rows:
            v = r["v"]
            cut = v.find(META_SEPARATOR)
            # the projection of the declared payload; the declared payload itself when the walk left it as it was
            projected = (v[1:cut] if cut >= 0 else v[1:]) or r["declared"]
            if cut >= 0:
                _, v2type, missing = v[cut + 1:].split(META_SEPARATOR)
                if missing:
                    invalid.append((r["seq"], v2type, missing))
            if r["t2"] != (r["stored"] if self.repairs else r["t"]) or projected:
                seqs.append(r["seq"])
                types.append(r["t2"])
                payloads.append(projected or None)
        if invalid and not self.allow_invalid:
            seq, v2type, missing = invalid[0]
            raise Skip(f"{len(invalid)} of its {len(rows)} events would be written schema-invalid (their v2 "
                       f"definition requires a key nothing in the row provides); the first, at sequence {seq}: "
                       f"{v2type} without {missing.replace(',', ', ')}; --allow-schema-invalid writes them as they "
                       f"read", "schema_invalid")
        self.invalid = len(invalid)
        return len(rows), seqs, types, payloads

    async def convert(self, run: str) -> str:
        """Convert one run in its own transaction: ``"converted"``, ``"already"`` (era 3), or Skip."""
        if self.dry_run:
            async with self.conn.transaction(isolation="repeatable_read", readonly=True):
                if await self._era(run) == 3:
                    return "already"
                self.last = await self._plan(run)
                return "converted"
        async with self.conn.transaction():
            await self._lock(run)
            if await self._era(run) == 3:
                return "already"
            n, seqs, types, payloads = await self._plan(run)
            preserved = int((await self.conn.execute(self.preserve, run)).split()[-1])
            if preserved != n:  # pragma: no cover - the rows are locked against appends since step 2
                raise Skip(f"preserved {preserved} rows but read {n}: the run changed meanwhile")
            await self.conn.execute(f"SELECT pg_catalog.set_config('{REWRITE_SETTING}', $1, true)", run)
            changed = int((await self.conn.execute(self.rewrite, run, seqs, types, payloads)).split()[-1])
            if changed != len(seqs):
                raise Skip(f"rewrote {changed} rows where {len(seqs)} were to change: the run changed meanwhile "
                           f"(two rows share a sequence?)")
            source = REPAIR_SOURCE if self.repaired else SOURCE
            if not await self.conn.fetchval(stamp_run_sql("$1", f"'{source}'"), run):
                raise Skip("stamp_run did not stamp it (with [host] era_column: the run has no row in the runs "
                           "table to hold its era)")
            self.last = (n, seqs, types, payloads)
            return "converted"

    async def restore(self, run: str) -> tuple[int, int]:
        """Put one run back from its preserved rows and remove its stamp: (rows rewritten, rows preserved)."""
        async with self.conn.transaction():
            await self._lock(run)
            n = await self.conn.fetchval(f"SELECT count(*) FROM {ORIGINALS} WHERE run_id = $1", run)
            if n == 0:
                raise UsageError(f"run {run!r} has no preserved rows in {ORIGINALS}: it was not converted by "
                                 f"backfill, or has been restored already")
            if await self._era(run) != 3:
                raise Skip(f"run {run!r} has preserved rows but is not era 3 (its stamp was removed by something "
                           f"else): restore refused, nothing changed")
            counts = await self.conn.fetchrow(self.strays, run)
            if counts["appended"]:
                raise Skip(f"run {run!r} has {counts['appended']} events appended after its backfill (in v2 "
                           f"vocabulary, which an era-2 log cannot hold): restore refused, nothing changed")
            if counts["gone"]:
                raise Skip(f"{counts['gone']} preserved rows of run {run!r} have no event row any more: restore "
                           f"refused, nothing changed")
            await self.conn.execute(f"SELECT pg_catalog.set_config('{REWRITE_SETTING}', $1, true)", run)
            changed = int((await self.conn.execute(self.put_back, run)).split()[-1])
            await self.conn.execute(f"DELETE FROM {ORIGINALS} WHERE run_id = $1", run)
            await self.conn.execute(self.unstamp, run)
            return changed, n


def backfill_privileges(host, dry_run: bool, restore: bool = False) -> dict[str, tuple[str, ...]]:
    """The table privileges backfill needs (docs/cutover-tools.md#backfill): it reads the events and the runs
    (--runs checks the ids, the projection reads a run's tenant); a conversion or --restore also rewrites events
    and, with host.era_column, the runs table's era column."""
    if dry_run:
        return {"events": ("SELECT",), "runs": ("SELECT",)}
    runs = ("SELECT", "UPDATE") if host.era_column is not None else ("SELECT",)
    return {"events": ("SELECT", "UPDATE"), "runs": runs}


async def _check_owner(conn) -> None:
    owner, me = await conn.fetchrow(
        "SELECT pg_catalog.pg_get_userbyid(n.nspowner), current_user FROM pg_catalog.pg_namespace n "
        "WHERE n.nspname = $1", SCHEMA)
    if owner != me:
        raise SchemaError(f"backfill must connect as the owner of {SCHEMA} ({owner}, the role that runs migrate): "
                          f"only it may stamp runs and rewrite event types; connected as {me}")


async def _known_runs(conn, host, runs: list[str]) -> list[str]:
    """The ids among ``runs`` that name no run: no event and no runs row."""
    tables = await writer_tables(conn, host)
    sql = f"SELECT EXISTS (SELECT 1 FROM {events_from(host)} WHERE {run_col(host)} = $1)"
    if "runs" in tables:
        sql += (f" OR EXISTS (SELECT 1 FROM {quote_qualified(host.runs_table)} r "
                f"WHERE r.{quote_ident(host.run_id_column)} = $1)")
    return [r for r in runs if not await conn.fetchval(sql, r)]


async def _runs_all(conn, host, batch: int):
    """Every run id of the events table, in key order, listed ``batch`` at a time (each listing its own read)."""
    last = None
    while True:
        if last is None:
            page = [r["run"] for r in await conn.fetch(list_runs_sql(host, False), batch)]
        else:
            page = [r["run"] for r in await conn.fetch(list_runs_sql(host, True), last, batch)]
        if not page:
            return
        yield page
        last = page[-1]


async def run_backfill(conn, config, *, runs: list[str] | None, dry_run: bool, batch: int,
                       progress: Progress | None = None, out=print, allow_invalid: bool = False,
                       repairs: dict[str, str] | None = None, declarations=None) -> Summary:
    """Convert ``runs`` (None: every run with events); ``conn`` checked with :func:`proxy.tools.common.open_checked`.

    ``declarations``: the operator's declarations in force (the ones the database records, ADR 0010)."""
    import asyncpg

    started = time.monotonic()

    host = config.host
    if not dry_run:
        await _check_owner(conn)
    if runs is not None:
        unknown = await _known_runs(conn, host, runs)
        if unknown:
            shown = ", ".join(repr(r) for r in unknown[:10]) + (" ..." if len(unknown) > 10 else "")
            raise UsageError(f"{len(unknown)} of the run ids given name no run (no event, no runs row): {shown}; "
                             f"nothing was converted")
        total = len(runs)
        pages = _pages(runs, batch)
    else:
        total = await conn.fetchval(f"SELECT count(DISTINCT {run_col(host)}) FROM {events_from(host)}")
        pages = _runs_all(conn, host, batch)
    b = Backfill(conn, config, dry_run=dry_run, allow_invalid=allow_invalid, repairs=repairs,
                 declarations=declarations)
    await b.prepare()
    s = Summary(declarations=declarations, runs_asked=total)
    done = 0
    verb = "would convert" if dry_run else "converted"
    async for page in pages:
        eras = await eras_of(conn, page)
        for run in page:
            done += 1
            if eras.get(run) == 3:
                s.already += 1
                continue
            for attempt in range(RETRIES):
                try:
                    result = await b.convert(run)
                    break
                except Skip as e:
                    s.skipped.append((run, e.code, e.reason))
                    out(f"skipped run {run}: {e.reason}")
                    result = None
                    break
                except asyncpg.PostgresError as e:
                    if e.sqlstate in RETRY_SQLSTATES and attempt + 1 < RETRIES:
                        continue
                    s.skipped.append((run, None, f"database error: {e.sqlstate}: {e}"))
                    out(f"skipped run {run}: database error: {e.sqlstate}: {e}")
                    result = None
                    break
            if result == "already":
                s.already += 1
            elif result == "converted":
                n, seqs, _, _ = b.last
                s.converted += 1
                s.events_preserved += n
                s.events_rewritten += len(seqs)
                s.invalid_written += b.invalid
                s.repaired.update(b.repaired)
                s.repaired_runs.update(b.repaired.keys())
                s.declared.update(b.declared)
            if progress is not None:
                progress.update(f"{bar(done, total)}{done:,} of {total:,} runs: {s.converted:,} {verb}, "
                                f"{s.already:,} already era 3, {len(s.skipped):,} skipped"
                                f"{rate_eta(done, total, time.monotonic() - started)}")
    s.elapsed = time.monotonic() - started
    if progress is not None:
        progress.done(f"{bar(done, total)}{done:,} of {total:,} runs: {s.converted:,} {verb}, "
                      f"{s.already:,} already era 3, {len(s.skipped):,} skipped"
                      f"{rate_eta(done, total, s.elapsed)}")
    return s


def rate_eta(done: int, total: int, elapsed: float) -> str:
    """``, 12.5 runs/s, ETA 0:01:20`` for a progress line (the rate over the whole run so far); the ETA is
    0:00:00 once done and unknown (``ETA ?``) before the first run."""
    return _rate_eta(done, total, elapsed, "runs")


async def _pages(runs: list[str], batch: int):
    for i in range(0, len(runs), batch):
        yield runs[i:i + batch]


def render(s: Summary, dry_run: bool) -> str:
    if dry_run:
        head = (f"dry run: would convert {s.converted:,} runs ({s.events_rewritten:,} of their {s.events_preserved:,} "
                f"events would be rewritten); nothing was changed")
    else:
        head = (f"converted {s.converted:,} runs to era 3 ({s.events_rewritten:,} events rewritten, "
                f"{s.events_preserved:,} preserved in {ORIGINALS})")
    lines = [head]
    if s.declarations is not None and not s.declarations.empty:
        total = sum(s.declared.values())
        lines.append(f"declarations {s.declarations.path} (version {s.declarations.version or '-'}, digest "
                     f"{s.declarations.digest}): {total:,} payloads {'would be ' if dry_run else ''}changed by them"
                     + (" (" + ", ".join(f"{t} {n:,}" for t, n in sorted(s.declared.items())) + ")" if total else ""))
    if s.invalid_written:
        lines.append(f"schema-invalid payloads {'that would be ' if dry_run else ''}written "
                     f"(--allow-schema-invalid): {s.invalid_written:,} events")
    if s.repair_digest is not None:
        total = sum(s.repaired.values())
        lines.append(f"repaired{' (would be)' if dry_run else ''} under --repair (file sha256 {s.repair_digest}): "
                     f"{total:,} events; each original preserved in {ORIGINALS}"
                     f"{'' if dry_run else f', each run stamped with source {REPAIR_SOURCE}'}")
        for (stored, target), n in sorted(s.repaired.items()):
            lines.append(f"  {stored} -> {target}: {n:,} events in {s.repaired_runs[stored, target]:,} runs")
    lines += [f"already era 3: {s.already:,} runs", f"skipped: {len(s.skipped):,} runs"]
    by_code: dict[str, int] = {}
    for _, code, _ in s.skipped:
        by_code[code or "other"] = by_code.get(code or "other", 0) + 1
    for code, n in sorted(by_code.items()):
        lines.append(f"  {code}: {n:,} runs")
    return "\n".join(lines)


def summary_json(s: Summary, dry_run: bool, artifacts) -> dict:
    """The summary as ``--json PATH`` writes it."""
    by_code: dict[str, int] = {}
    for _, code, _ in s.skipped:
        by_code[code or "other"] = by_code.get(code or "other", 0) + 1
    return {
        "ok": s.ok,
        "dryRun": dry_run,
        "artifacts": {"tag": artifacts.tag, "digest": artifacts.digest},
        "declarations": s.declarations.as_json() if s.declarations is not None else None,
        "runs": {"asked": s.runs_asked, "converted": s.converted, "alreadyEra3": s.already,
                 "skipped": len(s.skipped)},
        "events": {"rewritten": s.events_rewritten, "preserved": s.events_preserved,
                   "schemaInvalidWritten": s.invalid_written, "declared": sum(s.declared.values())},
        "declaredByType": dict(sorted(s.declared.items())),
        "skippedByCode": dict(sorted(by_code.items())),
        "skipped": [{"runId": run, "code": code, "reason": reason} for run, code, reason in s.skipped],
        "repairs": None if s.repair_digest is None else {
            "fileSha256": s.repair_digest,
            "repaired": [{"stored": stored, "type": target, "events": n, "runs": s.repaired_runs[stored, target]}
                         for (stored, target), n in sorted(s.repaired.items())]},
        "elapsedSeconds": round(s.elapsed, 3),
        "runsPerSecond": round((s.converted + s.already + len(s.skipped)) / s.elapsed, 3) if s.elapsed > 0 else None,
    }


def load_repairs(path: str, artifacts) -> tuple[dict[str, str], str]:
    """The ``--repair`` file: a JSON object, stored spelling -> codemap type; and the file's sha256.

    A spelling must be one the reader refuses (not a codemap type, v1 or v2, nor a registered vendor type:
    those read as they are); a target must be a codemap type, given by its v1 or its v2 name (a v2 name with
    more than one v1 name is refused). Each spelling is rewritten to the target's v1 name, the vocabulary of
    the era-2 log it is read in. UsageError for anything else."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise UsageError(f"--repair {path}: {e.strerror or e}") from None
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise UsageError(f"--repair {path}: not JSON: {e}") from None
    if not isinstance(doc, dict) or not doc:
        raise UsageError(f"--repair {path}: expected a JSON object naming stored spellings and codemap types, "
                         f'such as {{"node.interrupt.resolved": "interrupt.resolved"}}')
    v2_names = set(artifacts.v1_to_v2.values())
    preimages: dict[str, list[str]] = {}
    for v1, v2 in artifacts.v1_to_v2.items():
        preimages.setdefault(v2, []).append(v1)
    out = {}
    for stored, target in doc.items():
        if not isinstance(target, str):
            raise UsageError(f"--repair {path}: {stored!r}: the codemap type must be a string, got {target!r}")
        if stored in artifacts.v1_types or stored in v2_names:
            raise UsageError(f"--repair {path}: {stored!r} is a codemap type: it reads as it is, there is "
                             f"nothing to repair")
        if artifacts.is_vendor_type(stored):
            raise UsageError(f"--repair {path}: {stored!r} is a registered vendor type: it reads as it is, there "
                             f"is nothing to repair")
        if target in artifacts.v1_types:
            out[stored] = target
        elif target in v2_names and len(preimages[target]) == 1:
            out[stored] = preimages[target][0]
        elif target in v2_names:
            raise UsageError(f"--repair {path}: {stored!r}: {target!r} has more than one v1 name in the codemap "
                             f"({', '.join(sorted(preimages[target]))}); name the one meant")
        else:
            raise UsageError(f"--repair {path}: {stored!r}: {target!r} is not a codemap type")
    return out, hashlib.sha256(raw).hexdigest()


def cmd_backfill(config, args) -> int:
    """``openwop-seat backfill``: 0 done, 1 some run skipped / restore refused, 2 usage, 3 cannot run."""
    from proxy.artifacts.load import load_artifacts

    def fail(status: int, message: str) -> int:
        print(f"openwop-seat backfill: {message}", file=sys.stderr)
        return status

    if args.batch < 1:
        return fail(EXIT_USAGE, f"--batch must be at least 1, got {args.batch}")
    if args.restore is not None and args.dry_run:
        return fail(EXIT_USAGE, "--dry-run does not apply to --restore")
    if args.restore is not None and args.allow_schema_invalid:
        return fail(EXIT_USAGE, "--allow-schema-invalid does not apply to --restore")
    if args.restore is not None and args.repair is not None:
        return fail(EXIT_USAGE, "--repair does not apply to --restore (it puts the stored spellings back anyway)")
    json_path = getattr(args, "json", None)
    if args.restore is not None and json_path is not None:
        return fail(EXIT_USAGE, "--json does not apply to --restore")
    if json_path is not None:
        try:
            _check_json_path(json_path)
        except UsageError as e:
            return fail(EXIT_USAGE, str(e))
    runs = None
    if args.runs is not None:
        runs = list(dict.fromkeys(args.runs))  # each run once, in the order given
        if any(not r for r in runs):
            return fail(EXIT_USAGE, "--runs: an empty run id")

    def say(line: str) -> None:
        print(line, flush=True)

    async def go():
        repairs = digest = None
        if args.repair is not None:
            repairs, digest = load_repairs(args.repair, artifacts)
        conn = await open_checked(args.dsn, config, artifacts, "openwop-seat backfill")
        try:
            if args.restore is not None or not args.dry_run:
                await _check_owner(conn)
            await check_privileges(conn, config.host, "backfill" + (" --dry-run" if args.dry_run else ""),
                                   backfill_privileges(config.host, args.dry_run, args.restore is not None))
            if args.restore is not None:
                b = Backfill(conn, config)
                await b.prepare()
                return await b.restore(args.restore)
            summary = await run_backfill(conn, config, runs=runs, dry_run=args.dry_run, batch=args.batch,
                                         progress=Progress("backfill", enabled=not args.no_progress), out=say,
                                         allow_invalid=args.allow_schema_invalid, repairs=repairs,
                                         declarations=declarations)
            summary.repair_digest = digest
            return summary
        finally:
            await conn.close()

    from proxy.artifacts.declarations import DeclarationsError, declarations_for

    try:
        artifacts = load_artifacts()
        declarations = declarations_for(config, artifacts)  # the database must record these (open_checked)
        result = asyncio.run(go())
    except DeclarationsError as e:
        return fail(EXIT_USAGE, f"host.declarations_file: {e}")
    except UsageError as e:
        return fail(EXIT_USAGE, str(e))
    except Skip as e:
        return fail(EXIT_REFUSED, e.reason)
    except KeyboardInterrupt:
        return fail(EXIT_INTERRUPTED, "interrupted: runs converted so far stay converted, the one in flight was "
                                      "rolled back; run it again to finish")
    except Exception as e:
        if (message := unavailable(e)) is None:
            raise
        return fail(EXIT_UNAVAILABLE, message)
    if args.restore is not None:
        changed, n = result
        say(f"restored run {args.restore}: {changed} of its {n} events put back from {ORIGINALS}; era 2 again")
        return EXIT_OK
    say(render(result, args.dry_run))
    if json_path is not None:
        try:
            _write_json(json_path, summary_json(result, args.dry_run, artifacts))
        except OSError as e:
            return fail(EXIT_UNAVAILABLE, f"cannot write --json {json_path}: {e}")
    return EXIT_OK if result.ok else EXIT_REFUSED
