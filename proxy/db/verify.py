"""Reading what is installed in the host database and checking it: layout, era column, host tables, triggers."""


from __future__ import annotations

import json
import re
from dataclasses import replace

from proxy import __version__
from proxy.config import Config, HostConfig
from proxy.db.layout import (
    INTEGER_TYPES,
    LAYOUT_VERSION,
    SCHEMA,
    SchemaError,
    SchemaGap,
    SchemaTooNew,
    SchemaTooOld,
)
from proxy.db.sql import quote_ident, quote_qualified
from proxy.db.writer_sql import EventsRef, Trigger, writer_triggers

# --- reading the layout ------------------------------------------------------------


async def _schema_exists(conn) -> bool:
    return await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)", SCHEMA)


async def read_meta(conn) -> dict[str, str] | None:
    """``meta`` as a dict; None when the schema is absent; SchemaGap when the schema has no meta table."""
    if not await _schema_exists(conn):
        return None
    if await conn.fetchval("SELECT pg_catalog.to_regclass('openwop_seat.meta') IS NULL"):
        raise SchemaGap(
            f"schema {SCHEMA} exists but has no meta table, so its layout is unknown (it was not made by "
            f"openwop-seat migrate, or has been damaged); this openwop-seat (layout {LAYOUT_VERSION}) has no step "
            f"path from it: restore the schema from a backup, or drop it if it holds nothing, then migrate")
    rows = await conn.fetch("SELECT key, value FROM openwop_seat.meta")
    return {r["key"]: r["value"] for r in rows}


def _layout_of(meta: dict[str, str] | None) -> int:
    """The layout version recorded in ``meta`` (0: no schema); SchemaTooNew/SchemaGap when unusable."""
    if meta is None:
        return 0
    raw = meta.get("layout_version")
    known = f"this openwop-seat ({__version__}) knows layouts 1..{LAYOUT_VERSION}"
    if raw is None or not re.fullmatch(r"[0-9]+", raw.strip()):
        what = "no layout_version" if raw is None else f"layout_version {raw!r}"
        raise SchemaGap(
            f"{SCHEMA}.meta records {what}: there is no step path from an unknown layout ({known}); "
            f"refusing to guess: restore the schema from a backup or repair meta by hand")
    version = int(raw)
    if version > LAYOUT_VERSION:
        raise SchemaTooNew(
            f"the database's {SCHEMA} layout is version {version}, newer than {known}: refusing to use it; "
            f"upgrade openwop-seat on every replica before (or together with) the first one that migrates")
    # STEPS is 1..LAYOUT_VERSION without holes (checked at import), so there is a
    # path from every version in that range and from none outside it.
    if version < 1:
        raise SchemaGap(
            f"{SCHEMA}.meta records layout_version {version}, and {known} with no step path from {version} "
            f"to {LAYOUT_VERSION}: refusing to guess: restore the schema from a backup or repair meta by hand")
    return version


async def read_layout(conn) -> int:
    """The database's layout version: 0 when the schema is absent; raises SchemaTooNew/SchemaGap."""
    return _layout_of(await read_meta(conn))


# --- the era column --------------------------------------------------------------------


async def check_era_column(conn, host: HostConfig) -> str:
    """Check ``host.era_column`` fits (nullable integer column of the runs table); returns the run id's type."""
    runs = quote_qualified(host.runs_table)
    col = quote_ident(host.era_column)
    suggestion = f"ALTER TABLE {runs} ADD COLUMN {col} smallint CHECK ({col} = 3);"
    oid = await conn.fetchval("SELECT pg_catalog.to_regclass($1)::oid", runs)
    if oid is None:
        raise SchemaError(
            f"host.era_column is {host.era_column!r}, but the runs table {host.runs_table!r} (host.runs_table) "
            f"does not exist in this database (as seen through the migrating role's search_path)")
    rows = await conn.fetch(
        """SELECT a.attname, a.attnum, a.attnotnull, pg_catalog.format_type(a.atttypid, a.atttypmod) AS type
           FROM pg_catalog.pg_attribute a
           WHERE a.attrelid = $1 AND a.attname = ANY($2::text[]) AND a.attnum > 0 AND NOT a.attisdropped""",
        oid, [host.era_column, host.run_id_column])
    cols = {r["attname"]: r for r in rows}
    key = cols.get(host.run_id_column)
    if key is None:
        raise SchemaError(
            f"the runs table {host.runs_table!r} has no column {host.run_id_column!r} (host.run_id_column), "
            f"so the era column cannot be looked up by run id: fix host.run_id_column")
    unique = await conn.fetchval(
        """SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                          WHERE i.indrelid = $1 AND i.indisunique AND i.indpred IS NULL
                            AND i.indnkeyatts = 1 AND i.indkey[0] = $2)""", oid, key["attnum"])
    if not unique:
        raise SchemaError(
            f"{host.runs_table}.{host.run_id_column} has no unique index, so a run's era is not well defined; "
            f"run: ALTER TABLE {runs} ADD UNIQUE ({quote_ident(host.run_id_column)});")
    era = cols.get(host.era_column)
    if era is None:
        raise SchemaError(
            f"host.era_column is {host.era_column!r}, but the runs table {host.runs_table!r} has no such column; "
            f"run: {suggestion}")
    if era["type"] not in INTEGER_TYPES:
        raise SchemaError(
            f"{host.runs_table}.{host.era_column} is of type {era['type']}, expected an integer type "
            f"(smallint, integer or bigint); run: ALTER TABLE {runs} ALTER COLUMN {col} TYPE smallint "
            f"USING {col}::smallint;")
    if era["attnotnull"]:
        raise SchemaError(
            f"{host.runs_table}.{host.era_column} is NOT NULL, but NULL is how it says era 2; "
            f"run: ALTER TABLE {runs} ALTER COLUMN {col} DROP NOT NULL;")
    return key["type"]


# --- the host's tables and the writer rule's triggers ---------------------------------------

MIN_SERVER_VERSION = 140000  # CREATE OR REPLACE TRIGGER


async def writer_tables(conn, host: HostConfig) -> frozenset[str]:
    """Which of the host's tables exist (``"runs"``, ``"events"``); SchemaError when one lacks a configured column."""
    found = set()
    for kind, table, key, columns in (
            ("runs", host.runs_table, "host.runs_table", (("host.run_id_column", host.run_id_column),)),
            ("events", host.events_table, "host.events_table",
             (("host.run_id_column", host.run_id_column), ("host.type_column", host.type_column)))):
        oid = await conn.fetchval("SELECT pg_catalog.to_regclass($1)::oid", quote_qualified(table))
        if oid is None:
            continue
        have = {r["attname"] for r in await conn.fetch(
            "SELECT a.attname FROM pg_catalog.pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 "
            "AND NOT a.attisdropped", oid)}
        for column_key, column in columns:
            if column not in have:
                raise SchemaError(f"the {kind} table {table!r} ({key}) has no column {column!r} ({column_key}), "
                                  f"so the writer rule cannot be installed on it: fix {column_key}")
        found.add(kind)
    return frozenset(found)


async def qualified_host(conn, host: HostConfig) -> HostConfig:
    """``host`` with its runs table schema-qualified as the connected role's search_path finds it.

    The writer rule's functions pin their search_path (they are SECURITY
    DEFINER), so a host table they name must carry its schema: the runs table,
    which the era column store writes (it exists by then: check_era_column) and
    the append guard reads (``era2_orphan_appends``); unchanged when there is no
    runs table and no era column.
    """
    row = await conn.fetchrow(
        "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE c.oid = pg_catalog.to_regclass($1)", quote_qualified(host.runs_table))
    if row is None:
        if host.era_column is None:
            return host  # no runs table yet: nothing of the writer rule names it (migrate says so)
        raise SchemaError(f"the runs table {host.runs_table!r} (host.runs_table) does not exist")  # pragma: no cover
    if "." in row["nspname"] or "." in row["relname"]:
        raise SchemaError(f"the runs table {host.runs_table!r} resolves to {row['nspname']}.{row['relname']}, "
                          f"whose names hold a dot: rename it, or name it in host.runs_table without one")
    return replace(host, runs_table=f"{row['nspname']}.{row['relname']}")


async def events_ref(conn, host: HostConfig) -> EventsRef:
    """The events table (which exists) schema-qualified, and the type of its run id column; SchemaError when the
    connected role (the owner of openwop_seat) cannot read it: stamp_run reads a run's events before it stamps."""
    row = await conn.fetchrow(
        "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname) AS t, "
        "pg_catalog.format_type(a.atttypid, a.atttypmod) AS run_type, "
        "pg_catalog.has_table_privilege(c.oid, 'SELECT') AS readable "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attname = $2 AND NOT a.attisdropped "
        "WHERE c.oid = pg_catalog.to_regclass($1)", quote_qualified(host.events_table), host.run_id_column)
    if row is None:  # pragma: no cover - writer_tables found it with the column
        raise SchemaError(f"the events table {host.events_table!r} (host.events_table) does not exist")
    if not row["readable"]:
        role = await conn.fetchval("SELECT current_user")
        raise SchemaError(f"the migrating role (the owner of openwop_seat) cannot read the events table "
                          f"{host.events_table!r}: stamp_run reads a run's events before it stamps the run era 3 "
                          f"(a run with era-2 events is not stamped): GRANT SELECT ON {row['t']} TO {role}")
    return EventsRef(row["t"], row["run_type"])


# What the database runs for the writer rule, as text that does not depend on the session (search_path is set
# to pg_catalog for the query, so every name outside it comes out schema-qualified): one hash over every
# function of openwop_seat (signature, SECURITY DEFINER, its SET clauses, owner, body), and one per trigger
# that runs one (its definition and enabled state), keyed by table and name.  migrate records them in meta
# (installed_sha256, JSON); verify, the periodic check and SIGHUP compare (ADR 0006).
_INSTALLED_SQL = """
SELECT 'functions' AS k, pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
    COALESCE(pg_catalog.string_agg(
        p.proname::text || '(' || pg_catalog.pg_get_function_identity_arguments(p.oid) || ')|'
        || p.prosecdef::text || '|' || COALESCE(pg_catalog.array_to_string(p.proconfig, ','), '')
        || '|' || pg_catalog.pg_get_userbyid(p.proowner)::text || '|' || p.prosrc,
        E'\\n' ORDER BY p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid)), ''), 'UTF8')), 'hex') AS v
FROM pg_catalog.pg_proc p
WHERE p.pronamespace = (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = 'openwop_seat')
UNION ALL
SELECT t.tgrelid::pg_catalog.regclass::text || ' ' || t.tgname::text,
       pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
           pg_catalog.pg_get_triggerdef(t.oid) || '|' || t.tgenabled::text, 'UTF8')), 'hex')
FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
WHERE p.pronamespace = (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = 'openwop_seat')
  AND NOT t.tgisinternal"""


async def installed_objects(conn) -> dict[str, str]:
    """The hashes of the writer rule's functions and triggers as the database has them (see _INSTALLED_SQL)."""
    if conn.is_in_transaction():  # migrate's: set the path for this query only
        old = await conn.fetchval("SELECT pg_catalog.current_setting('search_path')")
        await conn.execute("SELECT pg_catalog.set_config('search_path', 'pg_catalog', true)")
        rows = await conn.fetch(_INSTALLED_SQL)  # (an error aborts the transaction: nothing to restore)
        await conn.execute("SELECT pg_catalog.set_config('search_path', $1, true)", old)
    else:
        async with conn.transaction():
            await conn.execute("SET LOCAL search_path TO pg_catalog")
            rows = await conn.fetch(_INSTALLED_SQL)
    return {r["k"]: r["v"] for r in rows}


async def installed_fingerprint(conn) -> str:
    """What meta.installed_sha256 holds: :func:`installed_objects` as canonical JSON."""
    return json.dumps(await installed_objects(conn), sort_keys=True, separators=(",", ":"))


async def check_installed(conn, meta: dict[str, str]) -> None:
    """SchemaError unless the functions, and each trigger that is there, are as migrate installed them.

    A trigger that is missing (or a table that is gone) is :func:`check_writer_rule`'s business; one that is
    there must be the one migrate installed, not replaced (``WHEN (false)``) or re-enabled otherwise.
    """
    raw = meta.get("installed_sha256")
    try:
        recorded = json.loads(raw) if raw is not None else None
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict):
        raise SchemaTooOld(f"{SCHEMA}.meta records no usable installed_sha256 (the fingerprint of the writer "
                           f"rule's functions and triggers): run `openwop-seat migrate` with this release")
    now = await installed_objects(conn)
    changed = []
    if now.get("functions") != recorded.get("functions"):
        changed.append(f"a function of {SCHEMA} was replaced, added or removed")
    for key, value in sorted(now.items()):
        if key != "functions" and value != recorded.get(key):
            table, _, name = key.rpartition(" ")
            changed.append(f"trigger {name} on {table} is not the one migrate installed (replaced, or its "
                           f"enabled state changed)")
    if changed:
        raise SchemaError(
            f"the writer rule is not in force as `openwop-seat migrate` installed it: {'; '.join(changed)}; run "
            f"`openwop-seat migrate` and find out who changed it")


async def _seat_triggers(conn) -> dict[tuple[int, str], str]:
    """Every trigger that runs a function of openwop_seat: (table oid, name) -> tgenabled."""
    rows = await conn.fetch(
        "SELECT t.tgrelid::oid AS rel, t.tgname::text AS tgname, t.tgenabled::text AS tgenabled "
        "FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid "
        "WHERE p.pronamespace = (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = $1) "
        "AND NOT t.tgisinternal", SCHEMA)
    return {(r["rel"], r["tgname"]): r["tgenabled"] for r in rows}


async def _expected_triggers(conn, triggers) -> dict[tuple[int, str], Trigger]:
    out = {}
    for t in triggers:
        oid = await conn.fetchval("SELECT pg_catalog.to_regclass($1)::oid", quote_qualified(t.table))
        out[(oid, t.name)] = t
    return out


def _trigger_problems(expected: dict, present: dict[tuple[int, str], str]) -> tuple[list[str], list[tuple[int, str]]]:
    """(what is missing or disabled, the seat's triggers that should not be there)."""
    missing = []
    for key, t in expected.items():
        state = present.get(key)
        if state is None:
            missing.append(f"trigger {t.name} on {t.table} is missing")
        elif state not in ("O", "A"):
            missing.append(f"trigger {t.name} on {t.table} is disabled")
    return missing, sorted(k for k in present if k not in expected)


async def check_writer_rule(conn, config: Config) -> None:
    """SchemaError unless every writer-rule trigger is installed and enabled on the host's tables that exist."""
    host = config.host
    expected = await _expected_triggers(conn, writer_triggers(host, await writer_tables(conn, host)))
    missing, stray = _trigger_problems(expected, await _seat_triggers(conn))
    if missing:
        raise SchemaError(
            f"the writer rule is not in force: {'; '.join(missing)}: run `openwop-seat migrate` with this "
            f"configuration (it installs the triggers on the host's tables that exist)")
    from proxy.db import net_sql

    meta = await read_meta(conn) or {}
    net = net_sql.net_problems(await net_sql.net_state(conn, quote_qualified(host.events_table)),
                               meta.get("net_state"))
    if net:
        raise SchemaError(
            f"the net is not in force (ADR 0009): {'; '.join(net)}: run `openwop-seat migrate` and find out who "
            f"changed it")
    if stray:
        names = []
        for rel, name in stray:
            names.append(f"{name} on {await conn.fetchval('SELECT $1::oid::regclass::text', rel)}")
        names = ", ".join(names)
        raise SchemaError(
            f"openwop_seat triggers that this configuration does not install are still in place ({names}): "
            f"the database was migrated with another [host] configuration; run `openwop-seat migrate` with this one")
