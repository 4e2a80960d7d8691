"""The seat's own schema (``openwop_seat``) in the host database: layout steps, artifact objects, checks.

Layout versioning follows the seed on evolving stores:

* ``meta.layout_version`` records the layout the schema was migrated to.  The
  layout is changed only by the ordered :data:`STEPS`; a published step never
  changes (a later change is a new step), and each step runs in its own
  transaction under a session advisory lock, so replicas starting together
  migrate once.
* A layout newer than this code is refused (:class:`SchemaTooNew`); a layout the
  code has no step path from is refused (:class:`SchemaGap`) instead of guessed.

Separately from the layout, every ``migrate`` (re)installs the *artifact
objects*: SQL functions generated from the pinned spec artifacts (the v1 type
list, the registered vendor orgs, the bijection verdict) and from the
configured era store, in one transaction together with recording the artifact
digest and tag in ``meta``.  A proxy whose artifact digest differs from the
recorded one refuses to serve (:class:`DigestMismatch`), so every replica reads
one log one way.

The era of a run is read by the database itself, in the statement's own
snapshot: the read path appends :func:`read_check_sql` over :func:`era_sql` to
each translated statement.  ``read_v2``/``read_v1`` are single-expression SQL
functions that PostgreSQL inlines into the statement; a row the reader rule
cannot read makes ``refuse_row`` raise, which fails the statement (and aborts
an explicit transaction) exactly as any PostgreSQL error does, with the
dedicated SQLSTATE of :mod:`proxy.errors` and the OpenWOP error envelope as
JSON in DETAIL.

Era stores.  By default the era lives in ``openwop_seat.run_era``: a row only
for runs stamped 3, absent means 2, never an explicit 2 (the table's CHECK
enforces it).  With ``[host] era_column`` the era lives in a nullable integer
column of the host's runs table instead, with the same meaning: NULL, or no
runs row at all, means 2 (as an absent ``run_era`` row does), 3 means 3, and
any other value (including an explicit 2) is refused as ``event_row_malformed``
rather than guessed at: the seat only ever writes 3 there, so another value
means something else wrote the column, and the two stores must read alike.
``migrate`` suggests ``smallint CHECK (col = 3)`` for the column, which makes
such values impossible.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable

from . import __version__
from .config import Config, HostConfig
from .errors import ERRORS

SCHEMA = "openwop_seat"

# The session advisory lock every migrate takes: the first 8 bytes of
# sha256("openwop_seat.migrate") as a signed 64-bit integer.
LOCK_KEY = int.from_bytes(hashlib.sha256(b"openwop_seat.migrate").digest()[:8], "big", signed=True)

# Alias of the era store inside era_sql's sub-select; chosen so that it cannot
# shadow an alias of the host's own statement (``r``, ``e``, ``x`` ...).
ERA_ALIAS = "openwop_seat_era"

INTEGER_TYPES = ("smallint", "integer", "bigint")


# --- errors --------------------------------------------------------------------


class SchemaError(Exception):
    """The seat's schema is absent, unusable by this code, or the host's tables do not fit."""


class SchemaMissing(SchemaError):
    """There is no ``openwop_seat`` schema (run ``openwop-seat migrate``)."""


class SchemaTooOld(SchemaMissing):
    """The layout is older than this code's: the objects this code needs are missing (run migrate)."""


class SchemaTooNew(SchemaError):
    """The database's layout is newer than this code knows: refused, never guessed at."""


class SchemaGap(SchemaError):
    """The database is at a layout this code has no step path from."""


class DigestMismatch(SchemaError):
    """The artifact digest recorded in the database differs from the running artifacts'."""


# --- layout steps ----------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    version: int
    description: str
    sql: str


# Published steps never change; a later change is a new step appended here
# (and LAYOUT_VERSION bumped to it).
STEPS: tuple[Step, ...] = (
    Step(1, "create schema openwop_seat with meta and run_era", """
CREATE SCHEMA openwop_seat;
COMMENT ON SCHEMA openwop_seat IS 'owned by openwop-seat: change it only with openwop-seat migrate';
CREATE TABLE openwop_seat.meta (
    key text PRIMARY KEY,
    value text NOT NULL
);
CREATE TABLE openwop_seat.run_era (
    run_id text PRIMARY KEY,
    era smallint NOT NULL CHECK (era = 3),
    stamped_at timestamptz NOT NULL DEFAULT now(),
    source text NOT NULL
);
COMMENT ON TABLE openwop_seat.run_era IS 'a row only for runs stamped era 3; absent means era 2 (never an explicit 2)';
GRANT USAGE ON SCHEMA openwop_seat TO PUBLIC;
GRANT SELECT ON openwop_seat.meta, openwop_seat.run_era TO PUBLIC;
"""),
)

LAYOUT_VERSION = 1


def _check_steps() -> None:
    versions = [s.version for s in STEPS]
    if versions != list(range(1, LAYOUT_VERSION + 1)):  # pragma: no cover - a packaging mistake
        raise AssertionError(f"schema steps {versions} are not 1..{LAYOUT_VERSION}")


_check_steps()


# --- quoting -------------------------------------------------------------------


def quote_ident(name: str) -> str:
    """A double-quoted identifier (always quoted: names are literal and case-sensitive)."""
    if not name or "\0" in name:
        raise ValueError(f"not an identifier: {name!r}")
    return '"' + name.replace('"', '""') + '"'


def quote_qualified(name: str) -> str:
    """``table`` or ``schema.table``, each part quoted separately."""
    parts = name.split(".")
    if len(parts) > 2:
        raise ValueError(f"not a table name, optionally schema-qualified: {name!r}")
    return ".".join(quote_ident(p) for p in parts)


def quote_literal(value: str) -> str:
    """A SQL string literal that reads the same whatever standard_conforming_strings says."""
    if "\0" in value:
        raise ValueError("a SQL literal cannot hold NUL")
    body = value.replace("'", "''")
    if "\\" in body:
        return "E'" + body.replace("\\", "\\\\") + "'"
    return "'" + body + "'"


def text_array_literal(values) -> str:
    """A ``text[]`` constant holding ``values`` (sorted, so the generated SQL is deterministic)."""
    items = ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in sorted(values))
    return quote_literal("{" + items + "}") + "::text[]"


# --- read-path SQL builders ---------------------------------------------------------

EQ = "OPERATOR(pg_catalog.=)"


def era_sql(host: HostConfig, run_id_expr: str) -> str:
    """A scalar SQL expression: the era (smallint 2 or 3) of the run whose id is ``run_id_expr``.

    Default store: the ``run_era`` row (absent means 2).  With ``host.era_column``:
    that column of the runs table, keyed by ``host.run_id_column``; NULL or no
    runs row means 2, 3 means 3, any other value refuses the statement with
    ``event_row_malformed`` (see the module docstring).
    """
    a = ERA_ALIAS
    if host.era_column is None:
        return (f"COALESCE((SELECT {a}.era FROM {SCHEMA}.run_era {a} "
                f"WHERE {a}.run_id {EQ} ({run_id_expr})::text), 2::smallint)")
    col = f"{a}.{quote_ident(host.era_column)}"
    key = f"{a}.{quote_ident(host.run_id_column)}"
    return (f"COALESCE((SELECT CASE WHEN {col} IS NULL THEN 2::smallint "
            f"WHEN {col} {EQ} 3 THEN 3::smallint "
            f"ELSE {SCHEMA}.refuse_row('event_row_malformed', NULL, ({key})::text, NULL) END "
            f"FROM {quote_qualified(host.runs_table)} {a} WHERE {key} {EQ} ({run_id_expr})), 2::smallint)")


def read_check_sql(major: int, era_expr: str, type_expr: str, run_id_expr: str, seq_expr: str) -> str:
    """The per-row check of a translated read: yields the row's era, or fails the statement."""
    if major == 2:
        fn = "read_v2"
    elif major == 1:
        fn = "read_v1"
    else:
        raise ValueError(f"read_check_sql: major must be 1 or 2, got {major!r}")
    return f"{SCHEMA}.{fn}({era_expr}, ({type_expr})::text, ({run_id_expr})::text, ({seq_expr})::bigint)"


# --- artifact objects ---------------------------------------------------------------

# The sentence of each refusal raised per row (MESSAGE is "<code>: <sentence>").
# Codes without an entry use their meaning from proxy.errors.
_ROW_SENTENCES = {
    "event_type_unmapped":
        "format('event type %s in era-2 run %s at sequence %s has no codemap row and no registered vendor prefix', "
        "quote_nullable(t), quote_nullable(run), coalesce(seq::text, 'unknown'))",
    "v1_representation_refused":
        "format('event type %s in era-3 run %s at sequence %s cannot be read in the v1 representation: "
        "the pinned codemap is not a bijection', "
        "quote_nullable(t), quote_nullable(run), coalesce(seq::text, 'unknown'))",
}


def _refuse_row_sql() -> str:
    sqlstates = "\n".join(f"        WHEN {quote_literal(e.code)} THEN {quote_literal(e.sqlstate)}"
                          for e in ERRORS.values())
    sentences = "\n".join(f"        WHEN {quote_literal(code)} THEN {expr}" for code, expr in _ROW_SENTENCES.items())
    meanings = "\n".join(f"            WHEN {quote_literal(e.code)} THEN {quote_literal(e.meaning)}"
                         for e in ERRORS.values())
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.refuse_row(code text, t text, run text, seq bigint)
RETURNS smallint LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $ow$
DECLARE
    v_sqlstate text;
    v_sentence text;
BEGIN
    v_sqlstate := CASE code
{sqlstates}
    END;
    IF v_sqlstate IS NULL THEN
        RAISE EXCEPTION 'openwop_seat.refuse_row: unknown refusal code %', quote_nullable(code);
    END IF;
    v_sentence := CASE
        WHEN code = 'event_row_malformed' AND seq IS NULL THEN
            format('run %s has an era stamp that is neither 3 nor absent (absent means era 2)', quote_nullable(run))
        WHEN code = 'event_row_malformed' THEN
            format('the event row of run %s at sequence %s has a NULL type', quote_nullable(run),
                   coalesce(seq::text, 'unknown'))
    END;
    IF v_sentence IS NULL THEN
        v_sentence := CASE code
{sentences}
        END;
    END IF;
    IF v_sentence IS NULL THEN
        v_sentence := format('%s (type %s, run %s, sequence %s)', CASE code
{meanings}
            END, quote_nullable(t), quote_nullable(run), coalesce(seq::text, 'unknown'));
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = v_sqlstate,
        MESSAGE = code || ': ' || v_sentence,
        DETAIL = jsonb_build_object(
            'error', code,
            'message', v_sentence,
            'details', jsonb_build_object('type', t, 'runId', run, 'sequence', seq))::text;
END
$ow$;
"""


def _read_v2_sql(artifacts) -> str:
    orgs = frozenset(artifacts.vendor_orgs) - frozenset(artifacts.reserved_orgs)
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.read_v2(era smallint, t text, run text, seq bigint)
RETURNS smallint LANGUAGE sql VOLATILE
AS $ow$
SELECT CASE
    WHEN era {EQ} 3 THEN 3::smallint
    WHEN t {EQ} ANY ({text_array_literal(artifacts.v1_types)}) THEN 2::smallint
    WHEN pg_catalog.strpos(t, '.') OPERATOR(pg_catalog.>) 0
         AND pg_catalog.split_part(t, '.', 1) {EQ} ANY ({text_array_literal(orgs)}) THEN 2::smallint
    ELSE {SCHEMA}.refuse_row(CASE WHEN t IS NULL THEN 'event_row_malformed' ELSE 'event_type_unmapped' END,
                             t, run, seq)
END
$ow$;
"""


def _read_v1_sql(artifacts) -> str:
    if artifacts.v2_to_v1 is not None:
        body = f"""SELECT CASE
    WHEN era {EQ} 2 THEN 2::smallint
    WHEN t IS NULL THEN {SCHEMA}.refuse_row('event_row_malformed', t, run, seq)
    ELSE 3::smallint
END"""
    else:
        body = f"""SELECT CASE
    WHEN era {EQ} 2 THEN 2::smallint
    ELSE {SCHEMA}.refuse_row(CASE WHEN t IS NULL THEN 'event_row_malformed' ELSE 'v1_representation_refused' END,
                             t, run, seq)
END"""
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.read_v1(era smallint, t text, run text, seq bigint)
RETURNS smallint LANGUAGE sql VOLATILE
AS $ow$
{body}
$ow$;
"""


def _refuse_statement_sql() -> str:
    code = "statement_untranslatable"
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.refuse_statement(kind text, detail text)
RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $ow$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = {quote_literal(ERRORS[code].sqlstate)},
        MESSAGE = {quote_literal(code + ': ')} || detail,
        DETAIL = jsonb_build_object(
            'error', {quote_literal(code)},
            'message', detail,
            'details', jsonb_build_object('kind', kind))::text;
END
$ow$;
"""


def _era_of_sql(host: HostConfig, run_id_type: str | None) -> str:
    arg = "$1" if host.era_column is None or run_id_type is None else f"CAST($1 AS {run_id_type})"
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.era_of(run text)
RETURNS smallint LANGUAGE sql STABLE
AS $ow$
SELECT {era_sql(host, arg)}
$ow$;
"""


FUNCTIONS = (
    "refuse_row(text, text, text, bigint)",
    "read_v2(smallint, text, text, bigint)",
    "read_v1(smallint, text, text, bigint)",
    "refuse_statement(text, text)",
    "era_of(text)",
)


def artifact_objects_sql(artifacts, host: HostConfig, run_id_type: str | None = None) -> str:
    """The DDL of every artifact-dependent object (CREATE OR REPLACE; idempotent)."""
    grants = "\n".join(f"GRANT EXECUTE ON FUNCTION {SCHEMA}.{f} TO PUBLIC;" for f in FUNCTIONS)
    return "".join((_refuse_row_sql(), _read_v2_sql(artifacts), _read_v1_sql(artifacts),
                    _refuse_statement_sql(), _era_of_sql(host, run_id_type))) + "\n" + grants + "\n"


# --- connecting ----------------------------------------------------------------------

_KV = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*")


def parse_keyword_dsn(dsn: str) -> dict[str, str]:
    """Parse a libpq keyword/value connection string (``host=... port=... dbname='x y'``)."""
    out: dict[str, str] = {}
    i, n = 0, len(dsn)
    while True:
        while i < n and dsn[i].isspace():
            i += 1
        if i >= n:
            return out
        m = _KV.match(dsn, i)
        if not m:
            raise SchemaError(f"invalid connection string near {dsn[i:i + 20]!r}: expected keyword=value")
        key, i = m.group(1), m.end()
        value = []
        if i < n and dsn[i] == "'":
            i += 1
            while True:
                if i >= n:
                    raise SchemaError(f"invalid connection string: unterminated quoted value of {key}")
                c = dsn[i]
                if c == "\\" and i + 1 < n:
                    value.append(dsn[i + 1])
                    i += 2
                elif c == "'":
                    i += 1
                    break
                else:
                    value.append(c)
                    i += 1
        else:
            while i < n and not dsn[i].isspace():
                if dsn[i] == "\\" and i + 1 < n:
                    value.append(dsn[i + 1])
                    i += 2
                else:
                    value.append(dsn[i])
                    i += 1
        out[key] = "".join(value)


async def connect(dsn: str):
    """An asyncpg connection from a URL or a libpq keyword/value string."""
    import asyncpg

    if re.match(r"^postgres(ql)?://", dsn):
        return await asyncpg.connect(dsn)
    params = parse_keyword_dsn(dsn)
    kwargs: dict[str, Any] = {}
    if "connect_timeout" in params:
        kwargs["timeout"] = float(params.pop("connect_timeout"))
    if "dbname" in params:
        params["database"] = params.pop("dbname")
    for key in ("host", "port", "user", "password", "database", "passfile"):
        if key in params:
            kwargs[key] = params.pop(key)
    if "port" in kwargs:
        kwargs["port"] = int(kwargs["port"])
    if params:  # sslmode, sslrootcert, application_name, ...: asyncpg reads them from a URL's query
        from urllib.parse import urlencode

        return await asyncpg.connect("postgresql://?" + urlencode(params), **kwargs)
    return await asyncpg.connect(**kwargs)


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
    return await conn.fetchval(
        "SELECT pg_catalog.bool_and(pg_catalog.to_regprocedure(f) IS NOT NULL) FROM pg_catalog.unnest($1::text[]) f",
        [f"{SCHEMA}.{f}" for f in FUNCTIONS])


async def migrate(dsn: str, config: Config, artifacts, *, out: Callable[[str], Any] = print) -> list[str]:
    """Bring the seat's schema to LAYOUT_VERSION and install the artifact objects; returns what was done."""
    done: list[str] = []

    def say(line: str) -> None:
        done.append(line)
        out(line)

    conn = await connect(dsn)
    try:
        await conn.execute("SELECT pg_catalog.pg_advisory_lock($1)", LOCK_KEY)
        try:
            await _migrate_locked(conn, config, artifacts, say)
        finally:
            if not conn.is_closed():
                await conn.execute("SELECT pg_catalog.pg_advisory_unlock($1)", LOCK_KEY)
    finally:
        await conn.close()
    if not done:
        say("nothing to do")
    return done


async def _migrate_locked(conn, config: Config, artifacts, say: Callable[[str], None]) -> None:
    current = await read_layout(conn)
    # Check the host's tables before changing anything.
    run_id_type = await check_era_column(conn, config.host) if config.host.era_column is not None else None
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

    sql = artifact_objects_sql(artifacts, config.host, run_id_type)
    fingerprint = _objects_fingerprint(sql)
    async with conn.transaction():
        meta = await read_meta(conn) or {}
        if (meta.get("artifact_digest") == artifacts.digest and meta.get("artifact_tag") == artifacts.tag
                and meta.get("objects_sha256") == fingerprint and await _functions_present(conn)):
            return
        await conn.execute(sql)
        await _upsert_meta(conn, {"artifact_digest": artifacts.digest, "artifact_tag": artifacts.tag,
                                  "objects_sha256": fingerprint})
    old = meta.get("artifact_digest")
    line = f"installed artifact objects for digest {artifacts.digest} (tag {artifacts.tag})"
    if old is not None and old != artifacts.digest:
        line += (f", replacing digest {old} (tag {meta.get('artifact_tag')}): seats still running the old "
                 f"artifacts now refuse to serve")
    say(line)


async def verify(conn_or_dsn, config: Config, artifacts) -> None:
    """Refuse to serve unless the schema is at LAYOUT_VERSION and records the running artifacts' digest.

    Raises SchemaMissing (no schema; SchemaTooOld, a subclass, when the layout is
    older than this code's), SchemaTooNew, SchemaGap, DigestMismatch, or a plain
    SchemaError when ``host.era_column`` does not fit.
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
    if config.host.era_column is not None:
        await check_era_column(conn, config.host)


def cmd_migrate(config: Config, dsn: str) -> int:
    """``openwop-seat migrate --dsn DSN``: print what was done; 0, or 1 with the reason on stderr."""
    import asyncpg

    from .artifacts import ArtifactError, load_artifacts

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
