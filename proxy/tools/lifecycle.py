"""The way in and the way out (docs/lifecycle.md): ``status``, ``retire`` (forward) and ``uninstall`` (back).

``status`` reads where the cutover stands (:mod:`proxy.db.cutover`). ``retire`` removes the seat's machinery
once every run is era 3 (or the operator accepts the era-2 runs left), no v1 writer has connected for the quiet
period and no seat serves: the translated views, the writer rule's triggers and functions, the claims and the
net, in one transaction, keeping the era records and the preserved originals as evidence (or not, with
``--drop-evidence``). ``uninstall`` puts the database back as it was before the first ``migrate``: every
backfilled run restored (``backfill --restore``, one run per transaction under the same locks), then every object
``migrate`` created, the triggers and policies on the host's tables included, and the schema, in one transaction.

Both take the advisory lock ``migrate`` takes (so neither runs beside a migrate or another of them), check the
role first and name every grant it lacks, refuse with every blocker named and nothing changed, and are
idempotent: a re-run after a crash finishes the job (``status`` says where it stopped).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import datetime, timezone

from proxy import __version__
from proxy.db.cutover import LISTED, SEAT_SOURCES, SERVING_WINDOW_SECONDS, Facts, read_facts
from proxy.db.layout import LAYOUT_VERSION, LOCK_KEY, SCHEMA, SchemaError, SchemaMissing, SchemaTooOld
from proxy.db.sql import quote_ident, quote_qualified
from proxy.tools.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    Progress,
    UsageError,
    bar,
    unavailable,
)

# What retire keeps of the schema as evidence (besides meta): the era records, the preserved originals, who
# connected, and audit's verdicts.
EVIDENCE = ("meta", "run_era", "events_v1_original", "sessions_seen", "audit_verdicts")


class Refused(Exception):
    """The command will not run in this state; every reason is listed and nothing changed (exit 1)."""

    def __init__(self, reasons: list[str], runs: list | None = None):
        super().__init__("; ".join(reasons))
        self.reasons, self.runs = reasons, runs or []


# --- status ---------------------------------------------------------------------------------------------


def _iso(t) -> str | None:
    return t.isoformat() if t is not None else None


def status_json(f: Facts, artifacts, config, quiet: float) -> dict:
    from proxy.artifacts.declarations import declarations_for

    m = f.meta
    decl = declarations_for(config, artifacts)
    retire = f.retire_blockers(quiet, False)
    retire_era2 = f.retire_blockers(quiet, True)
    return {
        "state": f.state,
        "database": f.database,
        "layout": {"database": int(m.get("layout_version", 0)), "thisSeat": LAYOUT_VERSION},
        "artifacts": {"tag": m.get("artifact_tag"), "digest": m.get("artifact_digest"),
                      "thisSeat": {"tag": artifacts.tag, "digest": artifacts.digest},
                      "match": m.get("artifact_digest") == artifacts.digest},
        "declarations": {"digest": m.get("declarations_digest"), "version": m.get("declarations_version") or None,
                         "thisSeat": decl.digest, "match": m.get("declarations_digest") == decl.digest},
        "installedSha256": m.get("objects_sha256"),
        "updatedAt": m.get("updated_at"),
        "retiredAt": m.get("retired_at"),
        "uninstallingSince": m.get("uninstalling_since"),
        "runs": {"total": sum(f.eras.values()), "era2": f.era2, "era2Open": f.era2_open, "era3": f.era3,
                 "era3BySource": {k: v for k, v in sorted(f.eras.items()) if k != "2"}},
        "newestEra2Append": None if f.newest_era2 is None else {"column": f.newest_era2[0],
                                                                "at": _iso(f.newest_era2[1])},
        "backfilledRuns": len(f.backfilled),
        "era3WithoutOriginal": {"count": len(f.era3_without_original),
                                "runs": [{"runId": r, "why": w} for r, w in f.era3_without_original[:LISTED]]},
        "counters": f.counters,
        "audit": None if f.audit is None else {
            "finishedAt": _iso(f.audit["finished_at"]), "ok": f.audit["ok"], "byRole": f.audit["by_role"],
            "artifactDigest": f.audit["artifact_digest"], "declarationsDigest": f.audit["declarations_digest"],
            "summary": f.audit["summary"]},
        "majorsSeen": [{"major": s["major"], "user": s["user"], "firstSeen": _iso(s["first_seen"]),
                        "lastSeen": _iso(s["last_seen"]), "secondsAgo": round(s["age"], 1),
                        "sessions": s["sessions"], "lastSeat": s["last_seat"]} for s in f.sightings],
        "seats": [{"seat": s["seat"], "startedAt": _iso(s["started_at"]), "lastSeen": _iso(s["last_seen"]),
                   "stoppedAt": _iso(s["stopped_at"]), "secondsAgo": round(s["age"], 1), "version": s["version"],
                   "serving": s["age"] < SERVING_WINDOW_SECONDS and s["stopped_at"] is None} for s in f.seats],
        "liveClaims": {("raw" if k == 0 else str(k)): v for k, v in sorted(f.live_claims.items())},
        "retire": {"possible": not retire, "blockers": retire, "quietSeconds": quiet,
                   "possibleWithAllowEra2": not retire_era2},
        "uninstall": {"possible": not f.uninstall_blockers(False), "blockers": f.uninstall_blockers(False),
                      "possibleWithKeepEra3": not f.uninstall_blockers(True)},
    }


def status_text(j: dict) -> str:
    out = [f"database {j['database']}: the seat is {j['state']} (layout {j['layout']['database']}; this "
           f"openwop-seat {__version__} knows {j['layout']['thisSeat']})"]
    if j["retiredAt"]:
        out.append(f"retired at {j['retiredAt']}: only the evidence is left in {SCHEMA}")
    if j["uninstallingSince"]:
        out.append(f"an uninstall is under way since {j['uninstallingSince']}: run `openwop-seat uninstall` again "
                   f"to finish it")
    a, d = j["artifacts"], j["declarations"]
    out.append(f"artifacts: tag {a['tag']}, digest {a['digest']}"
               + ("" if a["match"] else f" (this openwop-seat runs {a['thisSeat']['digest']}: they differ)"))
    out.append(f"declarations: digest {d['digest']} (version {d['version'] or '-'})"
               + ("" if d["match"] else f" (this configuration's: {d['thisSeat']}: they differ)"))
    out.append(f"generated objects sha256 {j['installedSha256']}, last migrate {j['updatedAt']}")
    r = j["runs"]
    by = ", ".join(f"{SEAT_SOURCES.get(k, k)} {v:,}" for k, v in r["era3BySource"].items())
    out.append(f"runs: {r['total']:,} in all; era 2 (v1 logs, unstamped): {r['era2']:,}, open (no terminal event): "
               f"{r['era2Open'] if r['era2Open'] is not None else '-'}; era 3: {r['era3']:,}"
               + (f" ({by})" if by else ""))
    n = j["newestEra2Append"]
    out.append("newest era-2 append: " + ("unknown (the events table has no timestamp column)" if n is None
                                           else f"{n['at'] or 'none'} (by events.{n['column']})"))
    e = j["era3WithoutOriginal"]
    out.append(f"backfilled runs (v1 originals preserved): {j['backfilledRuns']:,}; era-3 runs without a v1 "
               f"original: {e['count']:,}" + (": " + ", ".join(x["runId"] for x in e["runs"])
                                              + (" ..." if e["count"] > len(e["runs"]) else "") if e["runs"] else ""))
    c = j["counters"]
    if c:
        out.append(f"writer counters: runs stamped at creation {c.get('runs_stamped_created', 0):,}, v2 appends "
                   f"into era-2 runs {c.get('appends_translated', 0):,}")
    au = j["audit"]
    out.append("audit: no verdict recorded (audit records it when run as the owner of openwop_seat)" if au is None
               else f"audit: last verdict {'ok' if au['ok'] else 'NOT ok'} at {au['finishedAt']} by {au['byRole']}"
                    f" (runs {au['summary'].get('runs')}, events {au['summary'].get('events')})")
    out.append("majors seen through a seat, per database user:" if j["majorsSeen"] else
               "majors seen through a seat: none recorded")
    for s in j["majorsSeen"]:
        out.append(f"  major {s['major']:<3} user {s['user']}: last {s['lastSeen']} ({s['secondsAgo']:.0f} s ago), "
                   f"{s['sessions']:,} sessions since {s['firstSeen']}")
    serving = [s for s in j["seats"] if s["serving"]]
    out.append("seats serving: " + (", ".join(f"{s['seat']} (heartbeat {s['secondsAgo']:.0f} s ago)"
                                              for s in serving) or "none")
               + (f"; last heartbeat of any seat {j['seats'][0]['lastSeen']}" if j["seats"] and not serving else ""))
    live = j["liveClaims"]
    out.append("claimed sessions open now: " + (", ".join(f"major {k}: {v}" for k, v in live.items()) or "none"))
    for what, key, flag in (("retire", "retire", "possibleWithAllowEra2"),
                            ("uninstall", "uninstall", "possibleWithKeepEra3")):
        b = j[key]
        if key == "retire" and j["state"] == "retired":
            out.append(f"retire: done at {j['retiredAt']}")
        elif b["possible"]:
            out.append(f"{what}: possible now" + (f" (quiet period {b['quietSeconds']:.0f} s)" if key == "retire"
                                                   else ""))
        else:
            extra = {"retire": " (with --allow-era2: possible)", "uninstall": " (with --keep-era3: possible)"}
            out.append(f"{what}: not possible now{extra[key] if b[flag] else ''}:")
            out += [f"  - {x}" for x in b["blockers"]]
    return "\n".join(out)


def cmd_status(config, args) -> int:
    """``openwop-seat status``: 0 with the report, 2 bad input, 3 no seat schema or the database unreachable."""
    from proxy.artifacts.load import load_artifacts

    if args.quiet < 0:
        return _fail("status", EXIT_USAGE, f"--quiet must be 0 or more seconds, got {args.quiet}")

    async def go():
        conn = await _connect(args.dsn, "openwop-seat status")
        try:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                return await read_facts(conn, config, artifacts)
        finally:
            await conn.close()

    try:
        artifacts = load_artifacts()
        facts = asyncio.run(go())
        j = status_json(facts, artifacts, config, args.quiet)
    except Exception as e:
        return _unavailable("status", e)
    if args.json:
        print(json.dumps(j, indent=2, sort_keys=False))
    else:
        print(status_text(j))
    return EXIT_OK


# --- shared ---------------------------------------------------------------------------------------------


def _fail(cmd: str, status: int, message: str) -> int:
    print(f"openwop-seat {cmd}: {message}", file=sys.stderr)
    return status


def _unavailable(cmd: str, e: BaseException) -> int:
    from proxy.artifacts.declarations import DeclarationsError

    if isinstance(e, (UsageError, DeclarationsError)):
        return _fail(cmd, EXIT_USAGE, str(e))
    if (message := unavailable(e)) is None:
        raise e
    return _fail(cmd, EXIT_UNAVAILABLE, message)


async def _connect(dsn: str, name: str):
    from proxy.db.connect import connect

    conn = await connect(dsn)
    await conn.execute("SELECT pg_catalog.set_config('application_name', $1, false)", name)
    return conn


async def needed_grants(conn, config, *, restore: bool) -> list[tuple[str, str]]:
    """What the connected role lacks for retire (``restore`` False) or uninstall, as (why, the GRANT)."""
    host = config.host
    me = await conn.fetchval("SELECT pg_catalog.quote_ident(current_user)")
    out = []
    owner = await conn.fetchrow(
        "SELECT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(n.nspowner)) AS owner, "
        "pg_catalog.pg_has_role(current_user, n.nspowner, 'USAGE') AS owns "
        "FROM pg_catalog.pg_namespace n WHERE n.nspname = $1", SCHEMA)
    if owner is not None and not owner["owns"]:
        out.append((f"dropping {SCHEMA}'s objects needs its owner's rights (connect as the role that runs migrate)",
                    f"GRANT {owner['owner']} TO {me};"))
    for kind, table in (("events", host.events_table), ("runs", host.runs_table)):
        row = await conn.fetchrow(
            "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname) AS t, "
            "pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(c.relowner)) AS owner, "
            "pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE') AS owns, "
            "pg_catalog.has_table_privilege(c.oid, 'SELECT') AS reads, "
            "pg_catalog.has_table_privilege(c.oid, 'UPDATE') AS updates "
            "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = pg_catalog.to_regclass($1)", quote_qualified(table))
        if row is None:
            continue
        if not row["owns"]:
            out.append((f"dropping the writer rule's triggers{' and the net' if kind == 'events' else ''} on "
                        f"{row['t']} needs its owner's rights", f"GRANT {row['owner']} TO {me};"))
        if restore and kind == "events" and not (row["reads"] and row["updates"]):
            out.append(("restoring the backfilled runs reads and rewrites their events",
                        f"GRANT SELECT, UPDATE ON {row['t']} TO {me};"))
        if restore and kind == "runs" and host.era_column is not None and not row["updates"]:
            out.append(("restoring a backfilled run clears its era column", f"GRANT UPDATE ON {row['t']} TO {me};"))
    return list(dict.fromkeys(out))


async def _check_grants(conn, config, *, restore: bool) -> None:
    needed = await needed_grants(conn, config, restore=restore)
    if needed:
        raise SchemaError("the connected role lacks what this command needs; nothing was changed; run, as a role "
                          "that may grant it:\n" + "\n".join(f"  {g}    -- {why}" for why, g in needed))


async def _remove_host_objects(conn, config, meta: dict, say) -> None:
    """Drop the seat's triggers on the host's tables and the net's policies, and put the events table's
    row-level security flags back as they were before the first migrate (inside the caller's transaction)."""
    from proxy.db import net_sql
    from proxy.db.migrate import EVENTS_RLS_BEFORE
    from proxy.db.verify import _seat_triggers

    on_host = 0
    for rel, name in sorted(await _seat_triggers(conn)):
        table = await conn.fetchval("SELECT $1::oid::regclass::text", rel)
        await conn.execute(f"DROP TRIGGER {quote_ident(name)} ON {table}")
        on_host += not table.startswith(f"{SCHEMA}.")  # not one on the seat's own tables (claims, run_era)
    say(f"dropped {on_host} triggers of the writer rule on the host's tables")
    events = quote_qualified(config.host.events_table)
    state = await net_sql.net_state(conn, events)
    if state is None:
        return
    names = [p[0] for p in state["policies"] if p[0] in net_sql.POLICIES]
    for name in names:
        await conn.execute(f"DROP POLICY {quote_ident(name)} ON {events}")
    try:
        before = json.loads(meta.get(EVENTS_RLS_BEFORE) or "null")
    except ValueError:
        before = None
    if not isinstance(before, dict):
        before = {"rls": False, "force": False, "known": False}
    await conn.execute(f"ALTER TABLE {events} {'ENABLE' if before.get('rls') else 'DISABLE'} ROW LEVEL SECURITY")
    await conn.execute(f"ALTER TABLE {events} {'' if before.get('force') else 'NO '}FORCE ROW LEVEL SECURITY")
    say(f"dropped the net's {len(names)} policies on {events}; row-level security put back to "
        f"{'enabled' if before.get('rls') else 'disabled'}, {'' if before.get('force') else 'not '}forced"
        + ("" if before.get("known") else " (the state before the first migrate was not recorded: PostgreSQL's "
                                          "default assumed)"))


# The namespace of a dependent object, or of the relation or type it belongs to (a view's rule, a default).
_DEPENDENT_NAMESPACE = """CASE d.classid
    WHEN 'pg_catalog.pg_class'::regclass THEN (SELECT c.relnamespace FROM pg_catalog.pg_class c WHERE c.oid = d.objid)
    WHEN 'pg_catalog.pg_proc'::regclass THEN (SELECT p.pronamespace FROM pg_catalog.pg_proc p WHERE p.oid = d.objid)
    WHEN 'pg_catalog.pg_type'::regclass THEN (SELECT t.typnamespace FROM pg_catalog.pg_type t WHERE t.oid = d.objid)
    WHEN 'pg_catalog.pg_rewrite'::regclass THEN (SELECT c.relnamespace FROM pg_catalog.pg_rewrite r
        JOIN pg_catalog.pg_class c ON c.oid = r.ev_class WHERE r.oid = d.objid)
    WHEN 'pg_catalog.pg_attrdef'::regclass THEN (SELECT c.relnamespace FROM pg_catalog.pg_attrdef a
        JOIN pg_catalog.pg_class c ON c.oid = a.adrelid WHERE a.oid = d.objid)
    WHEN 'pg_catalog.pg_constraint'::regclass THEN (SELECT COALESCE(c.relnamespace, t.typnamespace, k.connamespace)
        FROM pg_catalog.pg_constraint k LEFT JOIN pg_catalog.pg_class c ON c.oid = k.conrelid
        LEFT JOIN pg_catalog.pg_type t ON t.oid = k.contypid WHERE k.oid = d.objid)
    WHEN 'pg_catalog.pg_trigger'::regclass THEN (SELECT c.relnamespace FROM pg_catalog.pg_trigger g
        JOIN pg_catalog.pg_class c ON c.oid = g.tgrelid WHERE g.oid = d.objid)
    WHEN 'pg_catalog.pg_policy'::regclass THEN (SELECT c.relnamespace FROM pg_catalog.pg_policy g
        JOIN pg_catalog.pg_class c ON c.oid = g.polrelid WHERE g.oid = d.objid)
END"""


async def _foreign_dependents(conn) -> list[str]:
    """Objects outside the seat's schema that depend on something in it (a host view over events_m2, say)."""
    rows = await conn.fetch(
        "SELECT DISTINCT pg_catalog.pg_describe_object(d.classid, d.objid, 0) AS what "
        "FROM pg_catalog.pg_depend d "
        "WHERE d.deptype IN ('n', 'a') AND d.refobjid IN ("
        "  SELECT c.oid FROM pg_catalog.pg_class c WHERE c.relnamespace = $1::regnamespace "
        "  UNION ALL SELECT p.oid FROM pg_catalog.pg_proc p WHERE p.pronamespace = $1::regnamespace "
        "  UNION ALL SELECT t.oid FROM pg_catalog.pg_type t WHERE t.typnamespace = $1::regnamespace) "
        f"AND ({_DEPENDENT_NAMESPACE}) IS DISTINCT FROM $1::regnamespace::oid "
        "AND d.classid <> 'pg_catalog.pg_namespace'::regclass ORDER BY 1", SCHEMA)
    return [r["what"] for r in rows]


async def _lock_events(conn, config) -> None:
    """Appends and rewrites wait from here to the commit (when the events table exists)."""
    events = quote_qualified(config.host.events_table)
    if await conn.fetchval("SELECT pg_catalog.to_regclass($1) IS NOT NULL", events):
        await conn.execute(f"LOCK TABLE {events} IN SHARE ROW EXCLUSIVE MODE")


async def _lock(conn) -> None:
    await conn.execute("SELECT pg_catalog.pg_advisory_lock($1)", LOCK_KEY)


async def _facts_checked(conn, config, artifacts) -> Facts:
    facts = await read_facts(conn, config, artifacts)
    layout = int(facts.meta.get("layout_version", 0))
    if facts.state == "installed" and layout < LAYOUT_VERSION:
        raise SchemaTooOld(f"the database's {SCHEMA} layout is version {layout}, older than this openwop-seat's "
                           f"({LAYOUT_VERSION}): run `openwop-seat migrate` with this release first")
    return facts


# --- retire ---------------------------------------------------------------------------------------------


def addendum(record: dict) -> str:
    """The retire record, as the ADR's last section (docs/adr/ and `openwop-seat adr`)."""
    eras = record["runs"]
    lines = [
        "## Addendum: the seat retired",
        "",
        f"- Retired: {record['retiredAt']} by `openwop-seat retire` ({record['version']}), as {record['role']}, "
        f"from database `{record['database']}`.",
        f"- Spec artifacts in force: tag `{record['artifactTag']}`, digest `{record['artifactDigest']}`; "
        f"declarations digest `{record['declarationsDigest']}`.",
        f"- Runs: {eras['total']} in all; era 3: {eras['era3']} ("
        + ", ".join(f"{k} {v}" for k, v in eras["era3BySource"].items()) + f"); era 2 left (v1-only, "
        f"accepted with --allow-era2): {eras['era2']}.",
        f"- Writer counters: {record['counters']}.",
        f"- Last v1 writer seen through a seat: {record['lastV1Seen'] or 'never'}; quiet period required: "
        f"{record['quietSeconds']:.0f} s.",
        f"- Removed: {', '.join(record['removed'])}.",
        f"- Kept as evidence: {', '.join(record['kept']) or 'nothing (--drop-evidence)'}.",
        "- After this, v2 hosts connect to PostgreSQL directly and read every era-3 run exactly as the seat "
        "served it; no v1 host may write to this database any more.",
        "",
    ]
    return "\n".join(lines)


async def run_retire(conn, config, artifacts, *, quiet: float, allow_era2: bool, drop_evidence: bool,
                     say=print) -> dict | None:
    """Retire the seat (see the module's doc); the retire record, or None when it was retired already."""
    from proxy.db.migrate import RETIRED_AT
    from proxy.db.verify import read_meta

    await _lock(conn)
    if await read_meta(conn) is None:
        raise SchemaMissing(f"database has no {SCHEMA} schema: nothing to retire (never migrated, uninstalled, "
                            f"or retired with --drop-evidence)")
    await _check_grants(conn, config, restore=False)
    facts = await _facts_checked(conn, config, artifacts)
    if facts.state == "retired":
        if drop_evidence:
            async with conn.transaction():
                await conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
            say(f"dropped the evidence kept at retire ({SCHEMA} and everything in it)")
        else:
            say(f"nothing to do: the seat was retired at {facts.meta.get(RETIRED_AT)}")
        return None
    blockers = facts.retire_blockers(quiet, allow_era2)
    if blockers:
        raise Refused(blockers)
    async with conn.transaction():
        # Appends wait from here to the commit: nothing is written half under the writer rule.
        await _lock_events(conn, config)
        facts = await read_facts(conn, config, artifacts)  # again, under the locks: a seat may have started
        blockers = facts.retire_blockers(quiet, allow_era2)
        if blockers:
            raise Refused(blockers)
        meta = facts.meta
        await _remove_host_objects(conn, config, meta, say)
        rels = await conn.fetch(
            "SELECT c.relname::text AS name, c.relkind::text AS kind FROM pg_catalog.pg_class c "
            "WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'v', 'm', 'S', 'p') ORDER BY 1", SCHEMA)
        keep = () if drop_evidence else EVIDENCE
        views = [r["name"] for r in rels if r["kind"] in ("v", "m")]
        tables = [r["name"] for r in rels if r["kind"] in ("r", "p") and r["name"] not in keep]
        sequences = [r["name"] for r in rels if r["kind"] == "S"]
        functions = [r["f"] for r in await conn.fetch(
            "SELECT p.oid::regprocedure::text AS f FROM pg_catalog.pg_proc p "
            "WHERE p.pronamespace = $1::regnamespace ORDER BY 1", SCHEMA)]
        foreign = await _foreign_dependents(conn)
        if foreign:
            raise Refused([f"objects outside {SCHEMA} depend on the seat's objects: {', '.join(foreign)}: drop or "
                           f"change them first"])
        record = {
            "retiredAt": datetime.now(timezone.utc).isoformat(), "version": __version__,
            "role": await conn.fetchval("SELECT current_user::text"), "database": facts.database,
            "artifactTag": meta.get("artifact_tag"), "artifactDigest": meta.get("artifact_digest"),
            "declarationsDigest": meta.get("declarations_digest"),
            "runs": {"total": sum(facts.eras.values()), "era2": facts.era2, "era3": facts.era3,
                     "era3BySource": {k: v for k, v in sorted(facts.eras.items()) if k != "2"}},
            "era2Runs": None,
            "counters": facts.counters,
            "lastV1Seen": max((s["last_seen"].isoformat() for s in facts.sightings if s["major"] in ("1", "raw")),
                              default=None),
            "quietSeconds": quiet,
            "removed": ([f"views {', '.join(views)}"] if views else [])
            + [f"{len(functions)} functions", f"tables {', '.join(tables)}" if tables else "no tables",
               f"sequences {', '.join(sequences)}" if sequences else "no sequences",
               "the writer rule's triggers", "the net's policies"],
            "kept": [f"{SCHEMA}.{t}" for t in keep],
        }
        if facts.era2 and allow_era2:
            era2 = await conn.fetch(
                f"SELECT k.run FROM (SELECT e.{quote_ident(config.host.run_id_column)}::text AS run "
                f"FROM {quote_qualified(config.host.events_table)} e GROUP BY 1) k "
                f"WHERE {SCHEMA}.era_of(k.run) = 2 ORDER BY 1")
            record["era2Runs"] = [r["run"] for r in era2]
        if drop_evidence:
            await conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
            say(f"dropped {SCHEMA} and everything in it (--drop-evidence)")
            return record
        # a function returning a view's rows (events_m2_run, ADR 0015) depends on the view: it goes first; the
        # others after the views, which call them
        of_views = [r["f"] for r in await conn.fetch(
            "SELECT p.oid::regprocedure::text AS f FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_type t "
            "ON t.oid = p.prorettype JOIN pg_catalog.pg_class c ON c.oid = t.typrelid "
            "WHERE p.pronamespace = $1::regnamespace AND c.relkind IN ('v', 'm') ORDER BY 1", SCHEMA)]
        if of_views:
            await conn.execute("DROP FUNCTION " + ", ".join(of_views))
        if views:
            await conn.execute("DROP VIEW " + ", ".join(f"{SCHEMA}.{quote_ident(v)}" for v in views))
        functions = [f for f in functions if f not in of_views]
        if functions:
            await conn.execute("DROP FUNCTION " + ", ".join(functions))
        if tables:
            await conn.execute("DROP TABLE " + ", ".join(f"{SCHEMA}.{quote_ident(t)}" for t in tables))
        if sequences:
            await conn.execute("DROP SEQUENCE " + ", ".join(f"{SCHEMA}.{quote_ident(s)}" for s in sequences))
        say(f"dropped {len(views)} views, {len(functions) + len(of_views)} functions, {len(tables)} tables and "
            f"{len(sequences)} sequences of {SCHEMA}; kept {', '.join(record['kept'])}")
        await conn.executemany(
            f"INSERT INTO {SCHEMA}.meta (key, value) VALUES ($1, $2) "
            f"ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            [(RETIRED_AT, record["retiredAt"]), ("retire_record", json.dumps(record, sort_keys=True))])
    return record


def cmd_retire(config, args) -> int:
    """``openwop-seat retire``: 0 retired (or already), 1 refused (the blockers), 2 bad input, 3 cannot run."""
    from proxy.artifacts.load import load_artifacts

    if args.quiet < 0:
        return _fail("retire", EXIT_USAGE, f"--quiet must be 0 or more seconds, got {args.quiet}")
    if args.adr is not None:
        if os.path.exists(args.adr):
            return _fail("retire", EXIT_USAGE, f"--adr {args.adr}: exists; the addendum is written to a new file "
                                               f"(append it to the ADR yourself)")
        parent = os.path.dirname(os.path.abspath(args.adr))
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            return _fail("retire", EXIT_USAGE, f"--adr {args.adr}: the directory {parent!r} cannot be written")

    def say(line: str) -> None:
        print(line, flush=True)

    async def go():
        conn = await _connect(args.dsn, "openwop-seat retire")
        try:
            return await run_retire(conn, config, artifacts, quiet=args.quiet, allow_era2=args.allow_era2,
                                    drop_evidence=args.drop_evidence, say=say)
        finally:
            await conn.close()

    try:
        artifacts = load_artifacts()
        record = asyncio.run(go())
    except Refused as e:
        print("openwop-seat retire: refused, nothing was changed:", file=sys.stderr)
        for reason in e.reasons:
            print(f"  - {reason}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return _fail("retire", EXIT_INTERRUPTED, "interrupted: the transaction was rolled back, nothing changed")
    except Exception as e:
        return _unavailable("retire", e)
    if record is None:
        return EXIT_OK
    text = addendum(record)
    say(f"retired the seat from database {record['database']}; the ADR addendum:\n")
    say(text)
    if args.adr is not None:
        with open(args.adr, "x", encoding="utf-8") as f:
            f.write(text)
    return EXIT_OK


# --- uninstall ------------------------------------------------------------------------------------------


async def run_uninstall(conn, config, artifacts, *, keep_era3: bool, say=print,
                        progress: Progress | None = None) -> dict:
    """Put the database back as before the first migrate (see the module's doc): what was done."""
    from proxy.db.migrate import RETIRED_AT, UNINSTALLING_SINCE
    from proxy.db.verify import read_meta
    from proxy.tools.backfill import Backfill, Skip

    await _lock(conn)
    if await read_meta(conn) is None:
        say(f"nothing to do: the database has no {SCHEMA} schema (never migrated, or uninstalled)")
        return {"restored": [], "kept": [], "done": False}
    await _check_grants(conn, config, restore=True)
    facts = await _facts_checked(conn, config, artifacts)
    if facts.state == "retired":
        raise Refused([f"the seat was retired at {facts.meta.get(RETIRED_AT)}: the way back is closed (v2 hosts "
                       f"have written since); `openwop-seat retire --drop-evidence` removes what is left"])
    blockers = facts.uninstall_blockers(keep_era3)
    if blockers:
        raise Refused(blockers, facts.era3_without_original)
    kept = facts.era3_without_original
    kept_ids = {r for r, _ in kept}
    if facts.state != "uninstalling":
        async with conn.transaction():
            await conn.execute(
                f"INSERT INTO {SCHEMA}.meta (key, value) VALUES ($1, pg_catalog.now()::text) "
                f"ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value", UNINSTALLING_SINCE)
        say("uninstall started: seats and tools now refuse this database until it is finished")
    todo = [r for r in facts.backfilled if r not in kept_ids]
    b = Backfill(conn, config)
    if todo:
        await b.prepare()
    restored = []
    for i, run in enumerate(todo, 1):
        try:
            await b.restore(run)
        except Skip as e:
            raise Refused([f"run {run}: {e.reason}; the runs restored so far stay restored: run uninstall again "
                           f"once it is resolved"]) from None
        restored.append(run)
        if progress is not None:
            progress.update(f"{bar(i, len(todo))}{i:,} of {len(todo):,} backfilled runs restored")
    if progress is not None and todo:
        progress.done(f"{bar(len(todo), len(todo))}{len(todo):,} of {len(todo):,} backfilled runs restored")
    say(f"restored {len(restored):,} backfilled runs from {SCHEMA}.events_v1_original (era 2 again)")
    async with conn.transaction():
        await _lock_events(conn, config)
        facts = await read_facts(conn, config, artifacts)
        blockers = facts.uninstall_blockers(keep_era3)
        if blockers:
            raise Refused(blockers, facts.era3_without_original)
        await _remove_host_objects(conn, config, facts.meta, say)
        foreign = await _foreign_dependents(conn)
        if foreign:
            raise Refused([f"objects outside {SCHEMA} depend on the seat's objects: {', '.join(foreign)}: drop or "
                           f"change them first (the runs restored so far stay restored)"])
        await conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
    say(f"dropped {SCHEMA} and everything in it, its grants included")
    return {"restored": restored, "kept": kept, "done": True}


def cmd_uninstall(config, args) -> int:
    """``openwop-seat uninstall``: 0 done (or nothing to do), 1 refused, 2 bad input, 3 cannot run."""
    from proxy.artifacts.load import load_artifacts

    def say(line: str) -> None:
        print(line, flush=True)

    async def go():
        conn = await _connect(args.dsn, "openwop-seat uninstall")
        try:
            return await run_uninstall(conn, config, artifacts, keep_era3=args.keep_era3, say=say,
                                       progress=Progress("uninstall", enabled=not args.no_progress))
        finally:
            await conn.close()

    try:
        artifacts = load_artifacts()
        result = asyncio.run(go())
    except Refused as e:
        print("openwop-seat uninstall: refused, nothing more was changed:", file=sys.stderr)
        for reason in e.reasons:
            print(f"  - {reason}", file=sys.stderr)
        for run, why in e.runs:
            print(f"  era-3 run without a v1 original: {run} ({why})", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return _fail("uninstall", EXIT_INTERRUPTED, "interrupted: the runs restored so far stay restored; run "
                                                    "uninstall again to finish")
    except Exception as e:
        return _unavailable("uninstall", e)
    for run, why in result["kept"]:
        say(f"kept era-3 run {run} as it is (--keep-era3: {why})")
    if result["done"]:
        say(f"uninstalled: {len(result['restored']):,} runs restored, {len(result['kept']):,} era-3 runs kept; the "
            f"host's tables are as before the first migrate"
            + (" except those runs" if result["kept"] else ""))
    return EXIT_OK
