"""`migrate` and `verify`: install or check the seat's schema and generated objects in the host database."""


from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from typing import Any, Callable

from proxy.config import Config
from proxy.db import net_sql, relations
from proxy.db.claims import _install_claim_secret, load_claim_secret
from proxy.db.connect import connect
from proxy.db.layout import (
    LAYOUT_VERSION,
    LOCK_KEY,
    SCHEMA,
    STEPS,
    DeclarationsMismatch,
    DigestMismatch,
    SchemaError,
    SchemaGap,
    SchemaMissing,
    SchemaTooOld,
)
from proxy.db.sql import quote_ident, quote_qualified
from proxy.db.verify import (
    MIN_SERVER_VERSION,
    _expected_triggers,
    _layout_of,
    _seat_triggers,
    _trigger_problems,
    check_era_column,
    check_installed,
    check_writer_rule,
    events_ref,
    installed_fingerprint,
    qualified_host,
    read_layout,
    read_meta,
    writer_tables,
)
from proxy.db.writer_sql import FUNCTIONS, artifact_objects_sql, writer_triggers

# meta keys of the operator's declarations (ADR 0010): their digest, and the operator's version of the file
DECLARATIONS_DIGEST = "declarations_digest"
DECLARATIONS_VERSION = "declarations_version"
# meta key: the events table's row-level security flags before the first migrate installed the net (JSON
# {"rls", "force", "known"}), which uninstall and retire put back (docs/lifecycle.md)
EVENTS_RLS_BEFORE = "events_rls_before"
# meta keys of the way out (docs/lifecycle.md): set by retire (the schema then keeps only the evidence) and by an
# uninstall under way; a seat, a tool and migrate refuse such a database
RETIRED_AT = "retired_at"
UNINSTALLING_SINCE = "uninstalling_since"


def check_not_leaving(meta: dict[str, str] | None) -> None:
    """SchemaError when the database's seat was retired or is being uninstalled (docs/lifecycle.md)."""
    if not meta:
        return
    if meta.get(RETIRED_AT):
        raise SchemaError(
            f"the seat was retired from this database at {meta[RETIRED_AT]} (openwop-seat retire): only its "
            f"evidence is left in {SCHEMA}; no seat serves it and migrate does not install it again (see "
            f"docs/lifecycle.md)")
    if meta.get(UNINSTALLING_SINCE):
        raise SchemaError(
            f"an openwop-seat uninstall of this database is under way since {meta[UNINSTALLING_SINCE]}: run "
            f"`openwop-seat uninstall` again to finish it (see docs/lifecycle.md)")


def load_configured_declarations(config: Config, artifacts):
    """The declarations ``[host] declarations_file`` names, checked against ``artifacts``; a bad file is
    :class:`DeclarationsMismatch` (a SchemaError: whoever checks the database reports it as such)."""
    from proxy.artifacts.declarations import DeclarationsError, declarations_for

    try:
        return declarations_for(config, artifacts)
    except DeclarationsError as e:
        raise DeclarationsMismatch(f"host.declarations_file: {e}") from None


def declarations_objects_sql(decl) -> str:
    """``declared_v2`` for ``decl`` and its grant: installed before the projection functions, which call it."""
    from proxy.db.declarations_sql import SIGNATURE, declarations_sql

    return declarations_sql(SCHEMA, decl) + f"GRANT EXECUTE ON FUNCTION {SCHEMA}.{SIGNATURE} TO PUBLIC;\n"

# --- migrate and verify --------------------------------------------------------------


def _objects_fingerprint(sql: str) -> str:
    return hashlib.sha256(sql.encode("utf-8")).hexdigest()


async def _upsert_meta(conn, values: dict[str, str]) -> None:
    await conn.executemany(
        "INSERT INTO openwop_seat.meta (key, value) VALUES ($1, $2) "
        "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
        list(values.items()))
    await conn.execute(
        "INSERT INTO openwop_seat.meta (key, value) VALUES ('updated_at', pg_catalog.now()::text) "
        "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value")


async def _functions_present(conn) -> bool:
    from proxy.db.declarations_sql import SIGNATURE

    return await conn.fetchval(
        "SELECT pg_catalog.bool_and(pg_catalog.to_regprocedure(f) IS NOT NULL) FROM pg_catalog.unnest($1::text[]) f",
        [f"{SCHEMA}.{f}" for f in (*FUNCTIONS, SIGNATURE)])


async def migrate(dsn: str, config: Config, artifacts, *, out: Callable[[str], Any] = print) -> list[str]:
    """Bring the seat's schema to LAYOUT_VERSION and install the artifact objects; returns what was done."""
    done: list[str] = []

    def say(line: str) -> None:
        done.append(line)
        out(line)

    secret = load_claim_secret(config)  # before connecting: a bad secret file changes nothing
    decl = load_configured_declarations(config, artifacts)  # so is a bad declarations file
    conn = await connect(dsn)
    try:
        await conn.execute("SELECT pg_catalog.pg_advisory_lock($1)", LOCK_KEY)
        try:
            await _migrate_locked(conn, config, artifacts, secret, say, out, decl)
        finally:
            if not conn.is_closed():
                await conn.execute("SELECT pg_catalog.pg_advisory_unlock($1)", LOCK_KEY)
    finally:
        await conn.close()
    if not done:
        say("nothing to do")
    return done


async def _migrate_locked(conn, config: Config, artifacts, secret: str | None, say: Callable[[str], None],
                          note: Callable[[str], None], decl=None) -> None:
    """``say``: something done (returned by migrate); ``note``: printed only."""
    if decl is None:
        decl = load_configured_declarations(config, artifacts)
    current = await read_layout(conn)
    check_not_leaving(await read_meta(conn))
    # Check the server and the host's tables before changing anything.
    version = int(await conn.fetchval("SELECT pg_catalog.current_setting('server_version_num')"))
    if version < MIN_SERVER_VERSION:
        raise SchemaError(f"PostgreSQL {await conn.fetchval('SHOW server_version')} is too old for openwop-seat: "
                          f"it needs PostgreSQL 14 or newer")
    run_id_type = await check_era_column(conn, config.host) if config.host.era_column is not None else None
    tables = await writer_tables(conn, config.host)
    sees_sessions = await conn.fetchval(
        "SELECT pg_catalog.pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')")
    owner_problem = ("the migrating role (the owner of openwop_seat's functions) cannot see other roles' sessions "
                     "in pg_stat_activity, so openwop_seat.claim cannot tell one backend from a later one with the "
                     "same pid and refuses every claim: GRANT pg_read_all_stats TO " + (
                         await conn.fetchval("SELECT current_user")))
    # Every grant migrate needs, named at once, before anything changes (ADR 0009).
    needed = await needed_grants(conn, config, tables, secret is not None)
    if needed:
        raise SchemaError("the migrating role lacks what migrate needs; run, as a role that may grant it:\n"
                          + "\n".join(f"  {grant}    -- {why}" for why, grant in needed))
    events = await events_ref(conn, config.host) if "events" in tables else None  # before anything changes
    for step in STEPS[current:]:
        async with conn.transaction():
            # Re-read inside the step's transaction: a migrate that did not take
            # the lock (an older release) may have moved the layout meanwhile.
            now = await read_layout(conn)
            if now >= step.version:
                continue
            if now != step.version - 1:  # pragma: no cover - read_layout already refuses gaps
                raise SchemaGap(f"layout {now} cannot take step {step.version}")
            await conn.execute(step.sql)
            await _upsert_meta(conn, {"layout_version": str(step.version)})
        say(f"applied step {step.version}: {step.description}")

    for kind, table, key in (("runs", config.host.runs_table, "host.runs_table"),
                             ("events", config.host.events_table, "host.events_table")):
        if kind not in tables:
            note(f"the {kind} table {table!r} ({key}) does not exist in this database: the writer rule is not "
                 f"installed on it; create it and run migrate again")
    if not sees_sessions:
        note(owner_problem)

    triggers = writer_triggers(config.host, tables)
    writer_host = await qualified_host(conn, config.host)
    columns = await relations.events_columns(conn, config.host) if "events" in tables else None
    seat_owner = await conn.fetchval("SELECT current_user::text")
    # declared_v2 first: the projection functions call it (ADR 0010), and a SQL function's body is checked when
    # it is created
    sql = (declarations_objects_sql(decl)
           + artifact_objects_sql(artifacts, config.host, run_id_type, writer_host, events,
                                  orphans="runs" in tables and "." in writer_host.runs_table)
           + (relations.relations_sql(artifacts, await relations.qualified_tables(conn, config.host), columns,
                                      frozenset(decl.types), "runs" in tables)
              + net_sql.net_sql(events.table, [c.name for c in columns],
                                (config.host.type_column, config.host.payload_column), seat_owner)
              if columns is not None else "")
           + "".join(t.sql for t in triggers) + "\n")
    if events is not None:
        for line in await net_notes(conn, events.table):
            note(line)
    fingerprint = _objects_fingerprint(sql)
    installed = False
    cleared = emptied = 0
    async with conn.transaction():
        meta = await read_meta(conn) or {}
        expected = await _expected_triggers(conn, triggers)
        missing, stray = _trigger_problems(expected, await _seat_triggers(conn))
        # A function or trigger changed since the last migrate (not by one): install again rather than bless it.
        tampered = await installed_fingerprint(conn) != meta.get("installed_sha256")
        if events is not None and EVENTS_RLS_BEFORE not in meta:
            # what the way out puts back: known only while the net was never installed on the table
            before = await net_sql.net_state(conn, events.table)
            known = not any(p[0] in net_sql.POLICIES for p in before["policies"])
            await _upsert_meta(conn, {EVENTS_RLS_BEFORE: json.dumps(
                {"rls": before["rls"] if known else False, "force": before["force"] if known else False,
                 "known": known}, sort_keys=True)})
        if tampered or not (meta.get("artifact_digest") == artifacts.digest
                and meta.get("artifact_tag") == artifacts.tag
                and meta.get("objects_sha256") == fingerprint and await _functions_present(conn)
                and meta.get(DECLARATIONS_DIGEST) == decl.digest
                and not missing and not stray
                and (columns is None or not await relations.relation_problems(conn, config.host))
                and (events is None or not net_sql.net_problems(await net_sql.net_state(conn, events.table),
                                                                meta.get("net_state")))):
            for rel, name in stray:  # left by a migrate with another [host] configuration
                table = await conn.fetchval("SELECT $1::oid::regclass::text", rel)
                await conn.execute(f"DROP TRIGGER {quote_ident(name)} ON {table}")
            if await conn.fetchval(f"SELECT pg_catalog.to_regclass('{SCHEMA}.events_v2_runs') IS NOT NULL"):
                emptied = await conn.fetchval(f"SELECT count(*) FROM {SCHEMA}.events_v2_runs")
            await conn.execute(sql)
            # The payloads-clean marks were made by the fast check being replaced: they are checked again by
            # the next mark_payloads_clean, never trusted across a change of the generated functions.
            cleared = await conn.fetchval(f"WITH d AS (DELETE FROM {SCHEMA}.payloads_clean RETURNING 1) "
                                          f"SELECT count(*) FROM d")
            await _upsert_meta(conn, {"artifact_digest": artifacts.digest, "artifact_tag": artifacts.tag,
                                      "objects_sha256": fingerprint, DECLARATIONS_DIGEST: decl.digest,
                                      DECLARATIONS_VERSION: decl.version or ""})
            installed = True
        now = await installed_fingerprint(conn)
        if meta.get("installed_sha256") != now:
            await _upsert_meta(conn, {"installed_sha256": now})
        if events is not None:
            net_now = net_sql.fingerprint(await net_sql.net_state(conn, events.table))
            if meta.get("net_state") != net_now:
                await _upsert_meta(conn, {"net_state": net_now})
    if installed:
        old = meta.get("artifact_digest")
        line = f"installed artifact objects for digest {artifacts.digest} (tag {artifacts.tag})"
        if old is not None and old != artifacts.digest:
            line += (f", replacing digest {old} (tag {meta.get('artifact_tag')}): seats still running the old "
                     f"artifacts now refuse to serve")
        say(line)
        old_decl = meta.get(DECLARATIONS_DIGEST)
        if old_decl != decl.digest and (old_decl is not None or not decl.empty):
            what = (f"{len(decl.listing())} declarations from {decl.path} (version {decl.version or '-'})"
                    if not decl.empty else "no declarations")
            line = f"installed declarations digest {decl.digest}: {what}"
            if old_decl is not None:
                line += f", replacing digest {old_decl}: seats running other declarations now refuse to serve"
            say(line)
        if cleared:
            say(f"cleared {cleared} payloads-clean marks (the generated checks changed; mark the runs again)")
        if emptied:
            say(f"emptied the v2 store of {emptied} filled runs (ADR 0015): they are read at read time until "
                f"serve fills them again")
    await _install_claim_secret(conn, secret, say, note)


async def needed_grants(conn, config: Config, tables, claims: bool) -> list[tuple[str, str]]:
    """What the migrating role lacks, as (why, the exact GRANT), all of it at once.

    The net needs the events table's owner's rights (membership in its owner); the rights that membership brings
    (every privilege on the tables that role owns) are not asked for again."""
    me = await conn.fetchval("SELECT pg_catalog.quote_ident(current_user)")
    out: list[tuple[str, str]] = []
    if claims and not await conn.fetchval(
            "SELECT pg_catalog.pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')"):
        out.append(("openwop_seat.claim tells one backend from a later one with the same pid by pg_stat_activity",
                    f"GRANT pg_read_all_stats TO {me};"))
    granted_owner = None  # the events table's owner, when its membership is asked for
    for kind, table in (("events", config.host.events_table), ("runs", config.host.runs_table)):
        if kind not in tables:
            continue
        row = await conn.fetchrow(
            "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname) AS t, "
            "pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(c.relowner)) AS owner, "
            "pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE') AS owns, "
            "pg_catalog.has_table_privilege(c.oid, 'SELECT') AS reads, "
            "pg_catalog.has_table_privilege(c.oid, 'UPDATE') AS updates, "
            "pg_catalog.has_table_privilege(c.oid, 'DELETE') AS deletes, "
            "pg_catalog.has_table_privilege(c.oid, 'INSERT') AS inserts, "
            "pg_catalog.has_table_privilege(c.oid, 'TRIGGER') AS triggers "
            "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = pg_catalog.to_regclass($1)", quote_qualified(table))
        owns = row["owns"] or row["owner"] == granted_owner
        if kind == "events":
            if not owns:
                granted_owner = row["owner"]
                out.append((f"the net (row-level security on {row['t']}: ALTER TABLE … FORCE ROW LEVEL SECURITY "
                            f"and CREATE POLICY need its owner's rights; they bring SELECT, DELETE and TRIGGER on "
                            f"the tables {row['owner']} owns)", f"GRANT {row['owner']} TO {me};"))
                continue
            if not row["reads"]:
                out.append(("stamp_run reads a run's events before it stamps the run era 3",
                            f"GRANT SELECT ON {row['t']} TO {me};"))
            if not row["deletes"]:
                out.append(("a translated session's DELETE by run_id runs through openwop_seat.events_delete, as "
                            "its owner", f"GRANT DELETE ON {row['t']} TO {me};"))
            if not row["inserts"]:  # (an upsert's update through them needs UPDATE too, which an owner has)
                out.append(("a translated session's INSERT … RETURNING runs through openwop_seat.events_insert_m2/_m1, "
                            "as their owner (ADR 0019)", f"GRANT INSERT ON {row['t']} TO {me};"))
        if owns:  # an owner (or a member of the owner asked for above) has every privilege on the table
            continue
        if not row["triggers"]:
            out.append((f"the writer rule's triggers on {row['t']}", f"GRANT TRIGGER ON {row['t']} TO {me};"))
        if kind == "runs" and config.host.era_column is not None:
            lacking = [p for p, has in (("SELECT", row["reads"]), ("UPDATE", row["updates"])) if not has]
            if lacking:
                out.append((f"with host.era_column the append trigger reads {row['t']}.{config.host.era_column} "
                            f"and stamp_run writes it, as this role",
                            f"GRANT {', '.join(lacking)} ON {row['t']} TO {me};"))
    return out


async def net_notes(conn, events: str) -> list[str]:
    """What migrate cannot enforce about the net, to print: who can turn it off or read past it."""
    lines = []
    owner = await conn.fetchrow(
        "SELECT pg_catalog.pg_get_userbyid(c.relowner)::text AS owner, r.rolcanlogin, "
        "r.rolname OPERATOR(pg_catalog.=) current_user AS me "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_roles r ON r.oid = c.relowner "
        "WHERE c.oid = pg_catalog.to_regclass($1)", events)
    if owner is not None and not owner["me"]:
        lines.append(
            f"note: the events table {events} is owned by {owner['owner']}"
            + (", a role that can log in" if owner["rolcanlogin"] else "")
            + ": the net holds for its sessions too (FORCE ROW LEVEL SECURITY), but that role and its members can "
              "turn the net off (ALTER TABLE … NO FORCE / DISABLE ROW LEVEL SECURITY, DROP POLICY, or a permissive "
              "CREATE POLICY) and the writer rule's triggers with it; the seat checks both every "
              "host.check_interval and then ends the sessions on the host database, but what is read or written in "
              "between is not undone"
            + (": if the host logs in as it, give the table to a role the host does not log in as (ALTER TABLE … "
               "OWNER TO …)" if owner["rolcanlogin"] else ""))
    bypass = await conn.fetch(
        "SELECT r.rolname::text AS name FROM pg_catalog.pg_roles r WHERE (r.rolsuper OR r.rolbypassrls) "
        "AND r.rolcanlogin AND pg_catalog.has_table_privilege(r.oid, pg_catalog.to_regclass($1), 'SELECT') "
        "ORDER BY 1", events)
    if bypass:
        lines.append("note: these roles bypass row-level security, so the net does not hold for sessions logged "
                     "in as them (only the seat's rewrite does): " + ", ".join(b["name"] for b in bypass))
    return lines


async def verify(conn_or_dsn, config: Config, artifacts) -> None:
    """Refuse to serve unless the schema is at LAYOUT_VERSION and records the running artifacts' digest.

    Raises SchemaMissing (no schema; SchemaTooOld, a subclass, when the layout is
    older than this code's), SchemaTooNew, SchemaGap, DigestMismatch, or a plain
    SchemaError when ``host.era_column`` does not fit or the writer rule's
    triggers are not in force on the host's tables that exist.
    """
    if isinstance(conn_or_dsn, str):
        conn = await connect(conn_or_dsn)
        try:
            return await verify(conn, config, artifacts)
        finally:
            await conn.close()
    conn = conn_or_dsn
    meta = await read_meta(conn)
    if meta is None:
        db = await conn.fetchval("SELECT pg_catalog.current_database()")
        raise SchemaMissing(
            f"database {db!r} has no {SCHEMA} schema: run `openwop-seat migrate --dsn ...` as the role "
            f"that is to own it (not the host's role) before serving")
    version = _layout_of(meta)
    check_not_leaving(meta)
    if version < LAYOUT_VERSION:
        raise SchemaTooOld(
            f"the database's {SCHEMA} layout is version {version}, older than this openwop-seat's "
            f"({LAYOUT_VERSION}): run `openwop-seat migrate` with this release")
    recorded = meta.get("artifact_digest")
    if recorded is None:
        raise DigestMismatch(
            f"{SCHEMA}.meta records no artifact digest (a migrate did not finish installing the artifact "
            f"objects): run `openwop-seat migrate` with this release's artifacts (digest {artifacts.digest})")
    if recorded != artifacts.digest:
        raise DigestMismatch(
            f"the database records spec-artifact digest {recorded} (tag {meta.get('artifact_tag')}), but this "
            f"openwop-seat runs digest {artifacts.digest} (tag {artifacts.tag}); every replica must read one log "
            f"one way: run seats whose artifacts match, or switch the database to these artifacts with "
            f"`openwop-seat migrate` (seats on the old artifacts then refuse to serve)")
    check_declarations(meta, config, artifacts)
    if config.host.era_column is not None:
        await check_era_column(conn, config.host)
    await check_writer_rule(conn, config)
    await check_installed(conn, meta)


def check_declarations(meta: dict[str, str], config: Config, artifacts):
    """DeclarationsMismatch unless ``meta`` records the digest of the declarations ``config`` names; returns them.

    Every replica applies the declarations ``migrate`` installed (``declared_v2``), whatever its own file says: a
    replica whose file differs would claim declarations the database does not apply, so it refuses to serve."""
    decl = load_configured_declarations(config, artifacts)
    recorded = meta.get(DECLARATIONS_DIGEST)
    if recorded is None:
        raise DeclarationsMismatch(
            f"{SCHEMA}.meta records no declarations digest (migrated by an earlier release, or a migrate did not "
            f"finish): run `openwop-seat migrate` with this release and this configuration")
    if recorded != decl.digest:
        mine = (f"{decl.path} (version {decl.version or '-'}, digest {decl.digest})" if not decl.empty
                else f"no declarations (digest {decl.digest})")
        raise DeclarationsMismatch(
            f"the database records declarations digest {recorded} (version "
            f"{meta.get(DECLARATIONS_VERSION) or '-'}), but this openwop-seat's host.declarations_file is {mine}; "
            f"every replica must read one log one way: run seats with the declarations the database records, or "
            f"switch the database to these with `openwop-seat migrate` (seats on the old ones then refuse to serve)")
    return decl


def cmd_migrate(config: Config, dsn: str) -> int:
    """``openwop-seat migrate --dsn DSN``: print what was done; 0, or 1 with the reason on stderr."""
    import asyncpg

    from proxy.artifacts.load import ArtifactError, load_artifacts

    try:
        artifacts = load_artifacts()
        asyncio.run(migrate(dsn, config, artifacts, out=lambda line: print(line, flush=True)))
    except (SchemaError, ArtifactError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
        print(f"openwop-seat migrate: {e}", file=sys.stderr)
        return 1
    except (OSError, TimeoutError) as e:
        print(f"openwop-seat migrate: cannot connect to the database: {e}", file=sys.stderr)
        return 1
    return 0
