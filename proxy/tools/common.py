"""What the cutover tools (``audit``, ``backfill``) share: exit statuses, a checked direct connection,
the era of a batch of runs, and a plain-text progress line.

The tools connect to the host database directly (``--dsn``), never through a
seat, and refuse to touch a database whose ``openwop_seat`` schema is not at
this release's layout with this release's artifact digest (the checks of
``serve``, :func:`proxy.db.verify`): the functions they call are the ones
``migrate`` installed from these artifacts, so they read every row exactly as a
seat would.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

import orjson

from proxy.artifacts._json import ArtifactError
from proxy.config import HostConfig
from proxy.db.connect import connect
from proxy.db.layout import SCHEMA, SchemaError
from proxy.db.migrate import verify
from proxy.db.sql import quote_ident, quote_qualified
from proxy.errors import ERRORS, SeatException, describe

# Exit statuses of audit and backfill (docs/cutover-tools.md).
EXIT_OK = 0  # nothing would fail / every run asked for is era 3
EXIT_REFUSED = 1  # audit: some event would fail the reader rule or is schema-invalid; backfill: some run was
#                   skipped or refused
EXIT_USAGE = 2  # bad flags, configuration or --repair file, unknown run ids, nothing to restore (as argparse's)
EXIT_UNAVAILABLE = 3  # the database is unreachable, not migrated for these artifacts, or refused the tool's role
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT): the open transaction is rolled back with the connection

MALFORMED = ERRORS["event_row_malformed"].sqlstate


class UsageError(SeatException):
    """Bad input the tool refuses before changing anything (exit EXIT_USAGE)."""


def unavailable(e: BaseException) -> str | None:
    """What to say for an error that means the tool cannot run (exit EXIT_UNAVAILABLE), or None for another
    (a usage error, or a bug)."""
    if isinstance(e, SeatException) and not isinstance(e, (ArtifactError, SchemaError)):
        return None
    return describe(e)


async def open_checked(dsn: str, config, artifacts, application_name: str):
    """A direct connection to the host database whose seat schema ``serve`` would accept; SchemaError otherwise."""
    conn = await connect(dsn)
    try:
        await conn.execute("SELECT pg_catalog.set_config('application_name', $1, false)", application_name)
        # The tools' statements inline the generated functions into large expressions: compiling them with JIT
        # costs seconds per statement (once per audit batch), far more than it saves.
        await conn.execute("SELECT pg_catalog.set_config('jit', 'off', false)")
        await verify(conn, config, artifacts)
    except BaseException:
        await conn.close()
        raise
    return conn


class MissingPrivileges(SchemaError):
    """The tool's role lacks table privileges it needs: every GRANT to run, found before anything is read."""


async def check_privileges(conn, host: HostConfig, tool: str, needs: dict[str, tuple[str, ...]]) -> None:
    """MissingPrivileges naming every GRANT the connected role lacks for ``needs`` ({"events" or "runs": the
    privileges}), before the tool reads a row: a tool that found out per run would fail every run alike. A table
    that does not exist is left to the tool (it says so itself)."""
    missing: list[str] = []
    me = await conn.fetchval("SELECT pg_catalog.quote_ident(current_user)")
    for kind, privileges in needs.items():
        table = host.events_table if kind == "events" else host.runs_table
        row = await conn.fetchrow(
            "SELECT c.oid, pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname) AS t "
            "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = pg_catalog.to_regclass($1)", quote_qualified(table))
        if row is None:
            continue
        lacking = [p for p in privileges
                   if not await conn.fetchval("SELECT pg_catalog.has_table_privilege($1::oid, $2)", row["oid"], p)]
        if lacking:
            missing.append(f"GRANT {', '.join(lacking)} ON {row['t']} TO {me};")
    if missing:
        raise MissingPrivileges(f"the role {me} lacks privileges {tool} needs; nothing was read or changed. Run, as "
                                f"the tables' owner or a role that may grant them:\n"
                                + "\n".join(f"  {g}" for g in missing))


def rate_eta(done: int, total: int | None, elapsed: float, unit: str) -> str:
    """``, 12.5 runs/s, ETA 0:01:20`` for a progress line (the rate over the whole run so far); the ETA is
    0:00:00 once done, unknown (``ETA ?``) before the first item or without a total."""
    if done <= 0 or elapsed <= 0:
        return ", ETA ?"
    rate = done / elapsed
    if not total:
        return f", {rate:,.1f} {unit}/s, ETA ?"
    left = max(total - done, 0) / rate
    h, rest = divmod(int(round(left)), 3600)
    m, sec = divmod(rest, 60)
    return f", {rate:,.1f} {unit}/s, ETA {h}:{m:02d}:{sec:02d}"


def events_from(host: HostConfig, alias: str = "e") -> str:
    """``FROM``-clause text of the host's events table under ``alias``."""
    return f"{quote_qualified(host.events_table)} {alias}"


def run_col(host: HostConfig, alias: str = "e") -> str:
    return f"{alias}.{quote_ident(host.run_id_column)}"


def list_runs_sql(host: HostConfig, after: bool) -> str:
    """The next run ids of the events table in key order (``$1`` the last one seen when ``after``; the
    last parameter the page size): a walk of the (run_id, sequence) index, resumable between transactions."""
    run = run_col(host)
    where = f"WHERE {run} > $1 " if after else f"WHERE {run} IS NOT NULL "
    limit = "$2" if after else "$1"
    return f"SELECT ({run})::text AS run FROM {events_from(host)} {where}GROUP BY {run} ORDER BY {run} LIMIT {limit}"


async def eras_of(conn, runs: list[str]) -> dict[str, int | None]:
    """The era of each run (``era_of``, as the read path reads it); None for a run whose era stamp is malformed.

    Only ``[host] era_column`` can hold a malformed stamp, and then ``era_of``
    raises for the whole batch: the batch is read again run by run, each under a
    savepoint, to tell which.  Call inside a transaction.
    """
    sql = f"SELECT r, {SCHEMA}.era_of(r) AS era FROM pg_catalog.unnest($1::text[]) AS r"
    import asyncpg

    try:
        async with conn.transaction():  # a savepoint: a refusal leaves the caller's transaction usable
            return {r["r"]: r["era"] for r in await conn.fetch(sql, runs)}
    except asyncpg.PostgresError as e:
        if e.sqlstate != MALFORMED:
            raise
    out: dict[str, int | None] = {}
    for run in runs:
        try:
            async with conn.transaction():
                out[run] = await conn.fetchval(f"SELECT {SCHEMA}.era_of($1)", run)
        except asyncpg.PostgresError as e:
            if e.sqlstate != MALFORMED:
                raise
            out[run] = None
    return out


class Progress:
    """One progress line on stderr: redrawn in place on a terminal, a line every few seconds otherwise."""

    def __init__(self, label: str, stream: TextIO | None = None, enabled: bool = True):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty()
        self.every = 0.2 if self.tty else 5.0
        self.last = 0.0
        self.start = time.monotonic()
        self.drawn = False

    def update(self, text: str, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self.last < self.every:
            return
        self.last = now
        line = f"{self.label}: {text} [{now - self.start:.0f}s]"
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
            self.drawn = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self, text: str) -> None:
        self.update(text, force=True)
        if self.enabled and self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def bar(done: int, total: int | None, width: int = 24) -> str:
    """``[#####-----]  41%`` for a known total, empty for an unknown one."""
    if not total or total <= 0:
        return ""
    frac = min(done / total, 1.0)
    filled = int(frac * width)
    return "[" + "#" * filled + "-" * (width - filled) + f"] {frac * 100:3.0f}% "


# --- --json PATH (audit's report, backfill's summary) ---------------------------------------------------


def _check_json_path(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"--json {path}: no such directory {parent!r}")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"--json {path}: the directory {parent!r} is not writable")
    if os.path.isdir(path):
        raise UsageError(f"--json {path}: is a directory")


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
    os.replace(tmp, path)
