"""``openwop-seat audit``: read every era-2 run through the reader rule and the payload projection, offline.

The audit is a pre-flight for the cut: it tells, before any v2 reader is
switched on, which stored events would fail to read and why.  It runs the
functions ``migrate`` installed (``try_v2p``: ``read_v2p`` with each refusal
returned instead of raised, see :mod:`proxy.db`), so it reads every row
exactly as a seat would; only the counting is done here.

Three classes of result (ADR 0007).  An event *would fail* when a major-2
read refuses it (``failures``).  An event is *schema-invalid* when it reads,
but its projected payload would not validate against its v2 definition: a
required key that nothing in the row provides (``schemaInvalid``, per v2 type
and key; the projection never synthesises one).  Both make the audit fail
(exit 1).  A registered-vendor type that fails the v2 event-type grammar
(``vendorTypesOffGrammar``) is read as stored and only flagged.

Batches.  The events table is walked in run-id order, ``--batch`` runs at a
time; each batch is one ``REPEATABLE READ READ ONLY`` transaction (the eras
of its runs and their events are read in one snapshot) whose rows stream
through a server-side cursor, so memory holds the counters and never the
events.  Era-3 runs are not projected (the reader rule passes their rows as
stored): their rows are only checked for required keys their stored payload
lacks (``era3SchemaInvalid``: written so by ``backfill --allow-schema-invalid``
or by a writer), which also makes the audit fail.

Declarations.  With ``[host] declarations_file`` (ADR 0010) each era-2
payload is projected with the operator's declarations applied first
(``declared_v2``), as ``backfill`` writes it; the report lists them and
counts the payloads they change.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import orjson

from proxy.db.layout import SCHEMA
from proxy.db.projection_sql import META_SEPARATOR
from proxy.db.reader_sql import TRY_REFUSED, declared_payload_sql, read_project_sql
from proxy.db.sql import quote_ident, quote_literal
from proxy.tools.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
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
    rate_eta,
    run_col,
    unavailable,
)

DEFAULT_BATCH = 500  # runs per transaction
RUN_EVENT_SCHEMA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "spec", "schemas", "v2",
                                "run-event.schema.json")


def vendor_type_grammar() -> re.Pattern:
    """The v2 grammar of a type outside the closed enum (run-event.schema.json ``type``'s pattern branch)."""
    with open(RUN_EVENT_SCHEMA, encoding="utf-8") as f:
        branches = json.load(f)["properties"]["type"]["oneOf"]
    return re.compile(next(b["pattern"] for b in branches if "pattern" in b))
DEFAULT_SAMPLES = 5  # sample (run, sequence) pairs kept per failure kind
CURSOR_PREFETCH = 2000


def scan_sql(host, *, lower: bool, exclude: bool, null_runs: bool = False, declared: bool = False) -> str:
    """The events of the era-2 runs of one batch, each with what the reader rule makes of it.

    Parameters in order: the last run id of the previous batch (``lower``), the
    batch's last run id, the batch's runs that are not era 2 (``exclude``);
    ``null_runs``: the rows whose run id is NULL instead, no parameters.  Per
    row: run, sequence, stored type, ``try_v2p``'s text without the projected
    payload (era, or era and counts, or the refusal), whether the payload
    was projected, and whether the operator's declarations changed it.

    ``declared``: the payload is projected with the operator's declarations
    applied first (``declared_v2``, ADR 0010), as ``backfill`` writes it.
    """
    e = "e"
    run = run_col(host, e)
    payload = declared_payload_sql(host, e) if declared else None
    check = read_project_sql(host, "2::smallint", e, function="try_v2p", payload=payload)
    changed = (f"({payload}) IS DISTINCT FROM ({e}.{quote_ident(host.payload_column)})::jsonb" if declared
               else "false")
    sep = quote_literal(META_SEPARATOR)
    if null_runs:
        where = f"{run} IS NULL"
    else:
        n = 1
        where = ""
        if lower:
            where, n = f"{run} > $1 AND ", 2
        where += f"{run} <= ${n}"
        if exclude:
            where += f" AND NOT (({run})::text = ANY (${n + 1}::text[]))"
    return (f"SELECT ({run})::text AS run, ({e}.sequence)::bigint AS seq, ({e}.{quote_ident(host.type_column)})::text"
            f" AS t, CASE WHEN pg_catalog.left(x.v, 1) = {quote_literal(TRY_REFUSED)} THEN x.v "
            f"ELSE pg_catalog.left(x.v, 1) || COALESCE(pg_catalog.substr(x.v, "
            f"NULLIF(pg_catalog.strpos(x.v, {sep}), 0)), '') END AS v, "
            f"(pg_catalog.length(x.v) > 1 AND pg_catalog.substr(x.v, 2, 1) <> {sep}) AS projected, "
            f"{changed} AS declared "
            f"FROM {events_from(host, e)} CROSS JOIN LATERAL (SELECT {check} AS v) x WHERE {where}")


def era3_invalid_sql(host) -> str:
    """The events of the given era-3 runs (``$1``, text[]) whose stored payload lacks a key its v2 definition
    requires (``$2``: jsonb, v2 type -> its required keys): run, sequence, type, the missing keys (a,b).

    Era-3 rows are read as stored (the reader rule does not project them), so a payload written without a
    required key (``backfill --allow-schema-invalid``, or a writer) stays schema-invalid for every v2 reader."""
    e = "e"
    run = run_col(host, e)
    t = f"({e}.{quote_ident(host.type_column)})::text"
    p = f"({e}.{quote_ident(host.payload_column)})::jsonb"
    return (f"SELECT ({run})::text AS run, ({e}.sequence)::bigint AS seq, {t} AS t, m.missing "
            f"FROM {events_from(host, e)} CROSS JOIN LATERAL (SELECT pg_catalog.string_agg(k, ',' ORDER BY k) "
            f"AS missing FROM pg_catalog.jsonb_array_elements_text($2::jsonb OPERATOR(pg_catalog.->) {t}) k "
            f"WHERE NOT (pg_catalog.jsonb_typeof({p}) IS NOT DISTINCT FROM 'object' "
            f"AND {p} OPERATOR(pg_catalog.?) k)) m "
            f"WHERE ({run})::text = ANY ($1::text[]) AND m.missing IS NOT NULL")


def required_keys(artifacts) -> str:
    """``$2`` of :func:`era3_invalid_sql`: every v2 type's required keys, as JSON."""
    return json.dumps({t: sorted(s.required) for t, s in artifacts.payload_shapes.items() if s.required},
                      sort_keys=True)


@dataclass
class Failure:
    count: int = 0
    samples: list = field(default_factory=list)


@dataclass
class Report:
    """The counts of one audit (see :meth:`as_json` for the report's shape)."""

    tag: str
    digest: str
    samples: int
    era2_runs: int = 0
    era3_runs: int = 0
    events: int = 0
    failing_events: int = 0
    failing_runs: set = field(default_factory=set)
    failures: dict = field(default_factory=dict)  # (code, type, key) -> Failure
    types: Counter = field(default_factory=Counter)  # stored type -> events (era-2 runs)
    projected: Counter = field(default_factory=Counter)  # v2 type -> events whose payload is projected
    boxed: Counter = field(default_factory=Counter)  # v2 type -> keys boxed under x-v1
    missing: Counter = field(default_factory=Counter)  # (v2 type, key) -> events missing that required key
    invalid: dict = field(default_factory=dict)  # (v2 type, key) -> Failure: schema-invalid after projection
    invalid_events: int = 0
    invalid_runs: set = field(default_factory=set)
    # era-3 runs backfill converted with --repair (None: the era store keeps no source)
    repaired_runs: int | None = None
    declared: Counter = field(default_factory=Counter)  # v2 type -> era-2 payloads the declarations change
    declarations: object = None  # proxy.artifacts.declarations.Declarations in force
    v1_to_v2: dict = field(default_factory=dict)  # the codemap, to name a stored type by its v2 name
    era3_invalid: dict = field(default_factory=dict)  # (v2 type, key) -> Failure: stored schema-invalid, era 3
    era3_invalid_events: int = 0
    era3_invalid_runs: set = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return self.failing_events == 0 and self.invalid_events == 0 and self.era3_invalid_events == 0

    def account_era3(self, run: str, seq: int, t: str, missing: str) -> None:
        """An era-3 event whose stored payload lacks required keys (``missing``: a,b)."""
        self.era3_invalid_events += 1
        self.era3_invalid_runs.add(run)
        for key in missing.split(","):
            f = self.era3_invalid.setdefault((t, key), Failure())
            f.count += 1
            if len(f.samples) < self.samples:
                f.samples.append({"runId": run, "sequence": seq})

    def fail(self, code: str, t: str | None, key: str | None, run: str | None, seq: int | None) -> None:
        f = self.failures.setdefault((code, t, key), Failure())
        f.count += 1
        if len(f.samples) < self.samples:
            f.samples.append({"runId": run, "sequence": seq})

    def account(self, run: str | None, seq: int, t: str | None, v: str, projected: bool,
                declared: bool = False) -> None:
        self.events += 1
        self.types[t] += 1
        if v.startswith(TRY_REFUSED):
            envelope = orjson.loads(v[len(TRY_REFUSED):])
            details = envelope.get("details") or {}
            code, typ = envelope.get("error"), details.get("type", t)
            self.failing_events += 1
            self.failing_runs.add(run)
            for key in details.get("keys") or [None]:
                self.fail(code, typ, key, run, seq)
            return
        cut = v.find(META_SEPARATOR)
        if cut < 0:
            if declared:  # changed by the declarations only, then complete and left as it was by the walk
                v2type = self.v1_to_v2.get(t, t)
                self.declared[v2type] += 1
                self.projected[v2type] += 1
            return
        boxed, v2type, missing = v[cut + 1:].split(META_SEPARATOR)
        if declared:
            self.declared[v2type] += 1
        if projected or declared:
            self.projected[v2type] += 1
        if boxed != "0":
            self.boxed[v2type] += int(boxed)
        if missing:
            self.invalid_events += 1
            self.invalid_runs.add(run)
        for key in missing.split(",") if missing else ():
            self.missing[v2type, key] += 1
            f = self.invalid.setdefault((v2type, key), Failure())
            f.count += 1
            if len(f.samples) < self.samples:
                f.samples.append({"runId": run, "sequence": seq})

    def vendor_types(self, artifacts) -> dict[str, dict[str, int]]:
        """Types stored in era-2 runs that the reader rule passes by their registered org: org -> type -> events."""
        out: dict[str, dict[str, int]] = {}
        for t, n in self.types.items():
            if t is not None and t not in artifacts.v1_types and artifacts.is_vendor_type(t):
                out.setdefault(t.partition(".")[0], {})[t] = n
        return {org: dict(sorted(ts.items())) for org, ts in sorted(out.items())}

    def vendor_off_grammar(self, artifacts) -> dict[str, int]:
        """Registered-vendor types that fail the v2 event-type grammar (e.g. ``example.Bad_Type``): read as
        stored, but no v2 wire admits them; flagged, not failed (ADR 0007)."""
        grammar = vendor_type_grammar()
        return {t: n for org in self.vendor_types(artifacts).values() for t, n in sorted(org.items())
                if not grammar.fullmatch(t)}

    def never_seen(self, artifacts) -> list[str]:
        """The codemap's v1 types no era-2 event is stored under."""
        return sorted(t for t in artifacts.v1_types if t not in self.types)

    def as_json(self, artifacts) -> dict:
        return {
            "ok": self.ok,
            "artifacts": {"tag": self.tag, "digest": self.digest},
            "declarations": self.declarations.as_json() if self.declarations is not None else None,
            "runs": {"era2Scanned": self.era2_runs, "era3Skipped": self.era3_runs,
                     "wouldFail": len(self.failing_runs), "schemaInvalid": len(self.invalid_runs),
                     "era3SchemaInvalid": len(self.era3_invalid_runs)},
            "events": {"scanned": self.events, "wouldFail": self.failing_events,
                       "schemaInvalid": self.invalid_events, "projected": sum(self.projected.values()),
                       "declared": sum(self.declared.values()), "era3SchemaInvalid": self.era3_invalid_events},
            "failures": [{"code": code, "type": t, "key": key, "count": f.count, "samples": f.samples}
                         for (code, t, key), f in sorted(self.failures.items(), key=_failure_order)],
            "schemaInvalid": [{"type": t, "key": key, "reason": "required key missing", "count": f.count,
                               "samples": f.samples}
                              for (t, key), f in sorted(self.invalid.items(), key=lambda i: (-i[1].count, i[0]))],
            "era3SchemaInvalid": [{"type": t, "key": key, "reason": "required key missing", "count": f.count,
                                   "samples": f.samples}
                                  for (t, key), f in sorted(self.era3_invalid.items(),
                                                            key=lambda i: (-i[1].count, i[0]))],
            "declaredByType": dict(sorted(self.declared.items())),
            "vendorTypesByOrg": self.vendor_types(artifacts),
            "vendorTypesOffGrammar": self.vendor_off_grammar(artifacts),
            "repairedRuns": self.repaired_runs,
            "typesNeverSeen": self.never_seen(artifacts),
            "requiredKeysMissing": [{"type": t, "key": k, "count": n} for (t, k), n in sorted(self.missing.items())],
            "projectedByType": dict(sorted(self.projected.items())),
            "boxedKeysByType": dict(sorted(self.boxed.items())),
            "typesSeen": {str(t): n for t, n in sorted(self.types.items(), key=lambda i: str(i[0]))},
        }


def _failure_order(item) -> tuple:
    (code, t, key), f = item
    return (-f.count, code or "", t or "", key or "")


async def run_audit(conn, config, artifacts, *, batch: int = DEFAULT_BATCH, samples: int = DEFAULT_SAMPLES,
                    progress: Progress | None = None, declarations=None) -> Report:
    """Audit the database behind ``conn`` (already checked with :func:`proxy.tools.common.open_checked`).

    ``declarations``: the operator's declarations in force (the ones the database records; ADR 0010): era-2
    payloads are projected with them applied, as ``backfill`` writes them."""
    host = config.host
    started = time.monotonic()
    report = Report(artifacts.tag, artifacts.digest, samples)
    report.declarations = declarations
    report.v1_to_v2 = artifacts.v1_to_v2
    declared = declarations is not None and not declarations.empty
    required = required_keys(artifacts)
    era3_sql = era3_invalid_sql(host)
    total = await conn.fetchval("SELECT GREATEST(c.reltuples, 0)::bigint FROM pg_catalog.pg_class c "
                                "WHERE c.oid = pg_catalog.to_regclass($1)", events_from(host, "").strip())
    last: str | None = None
    while True:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            if last is None:
                runs = [r["run"] for r in await conn.fetch(list_runs_sql(host, False), batch)]
            else:
                runs = [r["run"] for r in await conn.fetch(list_runs_sql(host, True), last, batch)]
            if not runs:
                break
            eras = await eras_of(conn, runs)
            other = [r for r, era in eras.items() if era != 2]
            for run, era in eras.items():
                if era == 3:
                    report.era3_runs += 1
                elif era is None:
                    report.failing_runs.add(run)
                else:
                    report.era2_runs += 1
            if any(era is None for era in eras.values()):
                await _malformed_runs(conn, host, report, [r for r, era in eras.items() if era is None])
            args = ((last,) if last is not None else ()) + (runs[-1],) + ((other,) if other else ())
            sql = scan_sql(host, lower=last is not None, exclude=bool(other), declared=declared)
            async for row in conn.cursor(sql, *args, prefetch=CURSOR_PREFETCH):
                report.account(row["run"], row["seq"], row["t"], row["v"], row["projected"], row["declared"])
            era3 = [r for r, era in eras.items() if era == 3]
            if era3:  # read as stored by every v2 reader: a payload without a required key stays invalid
                async for row in conn.cursor(era3_sql, era3, required, prefetch=CURSOR_PREFETCH):
                    report.account_era3(row["run"], row["seq"], row["t"], row["missing"])
        last = runs[-1]
        if progress is not None:
            progress.update(_progress_text(report, total, time.monotonic() - started))
    # Rows without a run id: the reader reads them as era 2 (no stamp can name them).
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        null_runs = scan_sql(host, lower=False, exclude=False, null_runs=True, declared=declared)
        async for row in conn.cursor(null_runs, prefetch=CURSOR_PREFETCH):
            report.account(row["run"], row["seq"], row["t"], row["v"], row["projected"], row["declared"])
    if host.era_column is None:  # run_era says who stamped a run; an era column does not
        from proxy.tools.backfill import REPAIR_SOURCE

        report.repaired_runs = await conn.fetchval(
            f"SELECT count(*) FROM {SCHEMA}.run_era WHERE source = $1", REPAIR_SOURCE)
    if progress is not None:
        progress.done(_progress_text(report, total, time.monotonic() - started))
    return report


async def _malformed_runs(conn, host, report: Report, runs: list[str]) -> None:
    """Every event of a run whose era stamp is malformed fails (``event_row_malformed``, as the reader refuses)."""
    run = run_col(host)
    rows = await conn.fetch(f"SELECT ({run})::text AS run, (e.sequence)::bigint AS seq, "
                            f"(e.{quote_ident(host.type_column)})::text AS t FROM {events_from(host)} "
                            f"WHERE ({run})::text = ANY ($1::text[])", runs)
    for r in rows:
        report.events += 1
        report.types[r["t"]] += 1
        report.failing_events += 1
        report.fail("event_row_malformed", None, None, r["run"], r["seq"])


def _progress_text(report: Report, total: int | None, elapsed: float) -> str:
    """The progress line: events read of the table's estimated rows (pg_class.reltuples), the rate over the audit
    so far and the time left at that rate."""
    est = f" of ~{total:,}" if total else ""
    return (f"{bar(report.events, total)}{report.events:,}{est} events, {report.era2_runs:,} era-2 runs "
            f"({report.era3_runs:,} era-3 skipped), {report.failing_events:,} would fail"
            f"{rate_eta(report.events, total, elapsed, 'events')}")


def render(report: Report, artifacts) -> str:
    """The human report printed on stdout."""
    j = report.as_json(artifacts)
    lines = [f"openwop-seat audit: artifacts {report.tag} (digest {report.digest})"]
    lines += declarations_lines(report.declarations)
    lines += [
             f"runs: {report.era2_runs:,} era-2 runs scanned, {report.era3_runs:,} era-3 runs skipped",
             f"events: {report.events:,} scanned, {sum(report.projected.values()):,} payloads projected",
             f"would fail: {report.failing_events:,} events in {len(report.failing_runs):,} runs"]
    for f in j["failures"]:
        what = f"{f['code']}: type {f['type']}" + (f", key {f['key']}" if f["key"] else "")
        where = ", ".join(f"{s['runId']}@{s['sequence']}" for s in f["samples"])
        lines.append(f"  {what}: {f['count']:,} events (e.g. {where})")
    lines.append(f"schema-invalid (read, but would not validate against the v2 definition): "
                 f"{report.invalid_events:,} events in {len(report.invalid_runs):,} runs")
    for f in j["schemaInvalid"]:
        where = ", ".join(f"{s['runId']}@{s['sequence']}" for s in f["samples"])
        lines.append(f"  type {f['type']}, {f['reason']} {f['key']}: {f['count']:,} events (e.g. {where})")
    lines.append(f"schema-invalid payloads stored in era-3 runs (read as stored by every v2 reader): "
                 f"{report.era3_invalid_events:,} events in {len(report.era3_invalid_runs):,} runs")
    for f in j["era3SchemaInvalid"]:
        where = ", ".join(f"{s['runId']}@{s['sequence']}" for s in f["samples"])
        lines.append(f"  type {f['type']}, {f['reason']} {f['key']}: {f['count']:,} events (e.g. {where})")
    if report.declared:
        lines.append(f"payloads the declarations change: {sum(report.declared.values()):,} events ("
                     + ", ".join(f"{t} {n:,}" for t, n in sorted(report.declared.items())) + ")")
    vendor = j["vendorTypesByOrg"]
    lines.append(f"vendor types passed by org: {sum(len(v) for v in vendor.values())} types")
    for org, types in vendor.items():
        lines.append(f"  {org}: " + ", ".join(f"{t} ({n:,})" for t, n in types.items()))
    off = j["vendorTypesOffGrammar"]
    if off:
        lines.append(f"  flagged: {len(off)} of them fail the v2 event-type grammar (read as stored; no v2 wire "
                     f"admits them): " + ", ".join(f"{t} ({n:,})" for t, n in off.items()))
    lines.append(f"required keys missing (filled by no one; the reader passes the row): "
                 f"{len(j['requiredKeysMissing'])} type/key pairs")
    for m in j["requiredKeysMissing"]:
        lines.append(f"  {m['type']}: {m['key']} ({m['count']:,} events)")
    if report.repaired_runs is not None:
        lines.append(f"runs converted by backfill --repair (run_era.source backfill-repair): {report.repaired_runs:,}")
    never = j["typesNeverSeen"]
    lines.append(f"types never seen: {len(never)} of the codemap's {len(artifacts.v1_types)} v1 types")
    for i in range(0, len(never), 6):
        lines.append("  " + ", ".join(never[i:i + 6]))
    if report.failing_events:
        result = "SOME EVENTS WOULD FAIL the reader rule"
        if report.invalid_events or report.era3_invalid_events:
            result += "; some payloads would not validate"
    elif report.invalid_events or report.era3_invalid_events:
        result = "SOME PAYLOADS WOULD NOT VALIDATE (schema-invalid); nothing would fail the reader rule"
    else:
        result = "nothing would fail"
    lines.append("result: " + result)
    return "\n".join(lines)


def declarations_lines(decl) -> list[str]:
    """The declarations in force, for a report: file, version, digest and one line per declaration."""
    if decl is None:
        return []
    if decl.empty:
        return [f"declarations: none (host.declarations_file not set; digest {decl.digest})"]
    lines = [f"declarations: {decl.path} (version {decl.version or '-'}, digest {decl.digest})"]
    lines += [f"  {line}" for line in decl.listing()]
    return lines


# What audit reads: the events, and the runs table (the era column, a run's tenant for run.started's projection).
AUDIT_PRIVILEGES = {"events": ("SELECT",), "runs": ("SELECT",)}


async def record_verdict(conn, report, artifacts, declarations) -> bool:
    """Record the verdict in ``openwop_seat.audit_verdicts`` (``status`` shows the last one) when this role may
    insert there (the owner of openwop_seat); True when recorded."""
    table = f"{SCHEMA}.audit_verdicts"
    if not await conn.fetchval("SELECT CASE WHEN pg_catalog.to_regclass($1) IS NULL THEN false "
                               "ELSE pg_catalog.has_table_privilege($1, 'INSERT') END", table):
        return False
    j = report.as_json(artifacts)
    await conn.execute(f"INSERT INTO {table} (ok, summary, artifact_digest, declarations_digest) "
                       f"VALUES ($1, $2::jsonb, $3, $4)", report.ok,
                       orjson.dumps({"runs": j["runs"], "events": j["events"]}).decode(), artifacts.digest,
                       declarations.digest)
    return True


def cmd_audit(config, dsn: str, json_path: str | None, batch: int, samples: int, progress: bool) -> int:
    """``openwop-seat audit``: print the report; exit 0 clean, 1 would fail or schema-invalid, 2 usage, 3 cannot
    audit."""
    from proxy.artifacts.load import load_artifacts

    def fail(status: int, message: str) -> int:
        print(f"openwop-seat audit: {message}", file=sys.stderr)
        return status

    try:
        if batch < 1:
            raise UsageError(f"--batch must be at least 1, got {batch}")
        if samples < 0:
            raise UsageError(f"--samples must be 0 or more, got {samples}")
        if json_path is not None:
            _check_json_path(json_path)
    except UsageError as e:
        return fail(EXIT_USAGE, str(e))

    async def go():
        conn = await open_checked(dsn, config, artifacts, "openwop-seat audit")
        try:
            await check_privileges(conn, config.host, "audit", AUDIT_PRIVILEGES)
            report = await run_audit(conn, config, artifacts, batch=batch, samples=samples,
                                     progress=Progress("audit", enabled=progress), declarations=declarations)
            await record_verdict(conn, report, artifacts, declarations)
            return report
        finally:
            await conn.close()

    from proxy.artifacts.declarations import DeclarationsError, declarations_for

    try:
        artifacts = load_artifacts()
        declarations = declarations_for(config, artifacts)
        report = asyncio.run(go())
    except DeclarationsError as e:
        return fail(EXIT_USAGE, f"host.declarations_file: {e}")
    except KeyboardInterrupt:
        return fail(EXIT_INTERRUPTED, "interrupted: no report")
    except Exception as e:
        if (message := unavailable(e)) is None:
            raise
        return fail(EXIT_UNAVAILABLE, message)
    print(render(report, artifacts), flush=True)
    if json_path is not None:
        try:
            _write_json(json_path, report.as_json(artifacts))
        except OSError as e:
            return fail(EXIT_UNAVAILABLE, f"cannot write --json {json_path}: {e}")
    return EXIT_OK if report.ok else EXIT_REFUSED
