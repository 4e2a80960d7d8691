"""``openwop-seat adr``: a draft ADR naming the seat as the storage boundary, with the per-store disposition table.

persistence.md §"The seat": a host leg MUST name its seat in its ADR.  §"Per-store
disposition": the ADR MUST name every store the host persists and give each one
disposition from a closed set, decided before the migration, never during it.
This module lists every table of the host database (outside the system schemas
and the seat's own ``openwop_seat``) and prefills each row from the spec's
template: the events and runs tables by the ``[host]`` configuration, the rest by
their names, and anything unrecognised ``unchanged`` with a TODO for the
operator.  It only reads the catalogue; the draft is for people to review.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import sys
from dataclasses import dataclass

from proxy import __version__
from proxy.config import Config

# The closed set (persistence.md §"Per-store disposition"), with its meanings.
DISPOSITIONS = {
    "unchanged": "Rows keep their shape and keys; a v2 reader consumes them as they are.",
    "translated": "Read through the codemap at the storage boundary; rewritten in place only by the atomic "
                  "per-run backfill.",
    "drained": "Rows complete under their own v1 contract until exhausted or expired; no new v1-shaped rows "
               "are written.",
    "legacy-stamped": "A missing v2 field gets its legacy value at first v2 read and is never rewritten.",
    "never-upgraded": "Rows remain v1 evidence only; v2 evidence is produced fresh.",
    "not-persisted": "Nothing to migrate.",
}


@dataclass(frozen=True)
class Rule:
    """A row of the spec's template, matched by words in a table's name (all of ``words`` for one of ``any_of``)."""

    any_of: tuple[str, ...]
    store: str
    artifact: str
    disposition: str
    words: tuple[str, ...] = ()


# Tried in order, on the table's name in lower case; the first match prefills the row.
RULES = (
    Rule(("deliver", "queue", "outbox", "pending"), "webhook deliveries", "serialized deliveries", "drained",
         words=("webhook",)),
    Rule(("subscri",), "webhook subscriptions", "subscriptions (event type names)", "unchanged",
         words=("webhook",)),
    Rule(("webhook",), "webhooks", "subscriptions or deliveries", "unchanged"),
    Rule(("interrupt",), "interrupts", "un-prefixed (v1) tokens", "drained"),
    Rule(("audit",), "audit log", "audit facts", "never-upgraded"),
    Rule(("certif",), "certification bundles", "v1 bundles", "never-upgraded"),
    Rule(("idempot", "invocation", "outbox", "correlation"),
         "idempotency, invocation, outbox, correlation tables", "keyed records", "unchanged"),
)


@dataclass(frozen=True)
class Row:
    table: str  # schema.table
    artifact: str
    disposition: str
    note: str


def classify_table(name: str) -> Row:
    """The prefilled row of a table that is neither the events nor the runs table, by its (unqualified) name."""
    lower = name.lower()
    for rule in RULES:
        if all(w in lower for w in rule.words) and any(w in lower for w in rule.any_of):
            return Row("", rule.artifact, rule.disposition,
                       f"prefilled from the name as the template's {rule.store}: confirm")
    return Row("", "host-internal (outside the wire)?", "unchanged",
               "TODO: not recognised: confirm it is host-internal, or choose its disposition")


@dataclass(frozen=True)
class Table:
    oid: int
    schema: str
    name: str
    kind: str  # pg_class.relkind

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


TABLES_SQL = r"""
SELECT c.oid, n.nspname::text AS schema, c.relname::text AS name, c.relkind::text AS kind
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'm', 'f') AND NOT c.relispartition
  AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'openwop_seat')
  AND n.nspname !~ '^pg_(toast|temp_|toast_temp_)'
ORDER BY n.nspname, c.relname
"""

_KINDS = {"p": "partitioned table", "m": "materialized view", "f": "foreign table"}


def disposition_rows(tables: list[Table], events_oid: int, runs_oid: int | None) -> list[Row]:
    """One row per table: the events table ``translated``, the runs table ``legacy-stamped``, the rest by name."""
    rows = []
    for t in tables:
        if t.oid == events_oid:
            row = Row("", "v1 vocabulary; UNIQUE (run id, sequence)", "translated",
                      "the events table (host.events_table): read through the seat; rewritten in place only by "
                      "`openwop-seat backfill`")
        elif t.oid == runs_oid:
            row = Row("", "no eventLogSchemaVersion; owner fields", "legacy-stamped",
                      "the runs table (host.runs_table): era in the seat's era store; a missing Subject is "
                      "legacy-stamped at first v2 read")
        else:
            row = classify_table(t.name)
        note = row.note if t.kind not in _KINDS else f"{_KINDS[t.kind]}; {row.note}"
        rows.append(Row(t.qualified, row.artifact, row.disposition, note))
    assert all(r.disposition in DISPOSITIONS for r in rows)
    return rows


def _cell(text: str) -> str:
    """A Markdown table cell: pipes escaped, no line breaks."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return "`" + _cell(text).replace("`", "'") + "`"


@dataclass(frozen=True)
class SeatFacts:
    database: str
    tag: str
    digest: str
    recorded: dict | None  # openwop_seat.meta, or None without the schema
    era_store: str
    declarations: object = None  # proxy.artifacts.declarations.Declarations of [host] declarations_file


def declarations_section(decl, recorded: dict | None) -> list[str]:
    """The ADR's lines on the operator's declarations (ADR 0010): file, version, digest, and each declaration."""
    if decl is None:
        return []
    have = (recorded or {}).get("declarations_digest")
    if recorded is None:
        state = "not recorded: no `openwop_seat` schema yet"
    elif have == decl.digest:
        state = "recorded in the database (matches)"
    else:
        state = f"the database records `{have}`: DIFFERS: TODO run `openwop-seat migrate` with this configuration"
    lines = [
        "## Decision: the host's own payload names (declarations)",
        "",
        "The spec leaves the projection of host-stored fields to the host and is silent on v2-required keys a v1 "
        "host never stored. What this host declares, applied on the major-2 read of era-2 rows and by "
        "`openwop-seat backfill`, never as a type mapping:",
        "",
        f"- file: {_code(decl.path) if decl.path else 'none (`host.declarations_file` is not set)'}"
        + (f", version {_code(decl.version)}" if decl.version else ""),
        f"- digest (sha256 of the canonical declarations): {_code(decl.digest)}, {state}",
    ]
    listing = decl.listing()
    lines += [f"- {_code(line)}" for line in listing] or ["- no declarations: payloads are projected as stored"]
    lines.append("")
    return lines


def render(facts: SeatFacts, rows: list[Row], today: datetime.date) -> str:
    """The ADR as Markdown."""
    if facts.recorded is None:
        recorded = "no `openwop_seat` schema in this database yet: run `openwop-seat migrate` before the cut"
    else:
        digest = facts.recorded.get("artifact_digest")
        match = "matches this release's" if digest == facts.digest else "DIFFERS from this release's: TODO resolve"
        recorded = (f"layout {facts.recorded.get('layout_version', '?')}, artifact digest `{digest}` "
                    f"(tag `{facts.recorded.get('artifact_tag', '?')}`), which {match}")
    todo = sum(1 for r in rows if r.note.startswith("TODO") or "; TODO" in r.note)
    lines = [
        "# ADR: openwop-seat is the storage boundary of the event log; every store's disposition at the v2 cut",
        "",
        f"- Status: proposed (drafted by `openwop-seat adr` on {today.isoformat()}; resolve every TODO, then accept)",
        f"- Database: {_code(facts.database)}",
        "",
        "## Context",
        "",
        "OpenWOP v2 (RFC 0176, persistence.md) lets a v2 host keep the event logs its v1 release wrote. An "
        "adapter at the storage boundary every reader passes through serves era-2 rows to v2 readers by the "
        "reader rule, and a host leg must name that seat in its ADR. The host must also name every store it "
        "persists and give each one disposition from the closed set below, before the migration.",
        "",
        "## Decision: the seat",
        "",
        "| | |",
        "| --- | --- |",
        "| seat | openwop-seat, a PostgreSQL wire-protocol proxy between the host and this database |",
        f"| version | {_cell(__version__)} |",
        f"| spec artifacts tag | {_code(facts.tag)} |",
        f"| spec artifacts digest (sha256) | {_code(facts.digest)} |",
        f"| recorded in the database | {recorded} |",
        f"| era store | {_cell(facts.era_store)} |",
        "| deployment | TODO: how the seat is deployed (image and version, replicas, listen address), and how it "
        "is ensured that every reader of the events table connects through it |",
        "",
        "The reader rule and the payload projection run inside this database, in SQL functions that "
        "`openwop-seat migrate` installs; the writer rule runs in triggers on the host's tables. A reader "
        "that bypasses the seat reads rows as stored.",
        "",
        *declarations_section(facts.declarations, facts.recorded),
        "## Decision: per-store disposition",
        "",
        "Dispositions (closed set, persistence.md §\"Per-store disposition\"):",
        "",
    ]
    lines += [f"- `{name}`: {meaning}" for name, meaning in DISPOSITIONS.items()]
    lines += [
        "",
        f"Every table of the database, outside the system schemas and the seat's own `openwop_seat` "
        f"({len(rows)} tables, {todo} with a TODO):",
        "",
        "| Store | v1 artifact | Disposition | Notes |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {_code(r.table)} | {_cell(r.artifact)} | `{r.disposition}` | {_cell(r.note)} |" for r in rows]
    lines += [
        "| certification bundles (outside this database?) | v1 bundles | `never-upgraded` | TODO: where they are "
        "kept; a fresh v2 bundle is produced before the cut |",
        "",
        "TODO: stores outside this database (files, object storage, caches, queues) are not listed above: add "
        "one row for each, and `not-persisted` for what the host keeps nowhere.",
        "",
        "## Consequences",
        "",
        "- Every reader of the events table goes through the seat; a new reader must too.",
        "- Era-2 runs are converted to era 3 only by the atomic per-run backfill; runs pinned to v1 change ids "
        "the host no longer implements are cancelled with `run.cancelled` reason `v1_pin_unsupported` "
        "(`openwop-seat pinned-runs`).",
        "- A disposition is not changed during the migration: a change is a new ADR.",
        "",
        "## Retire record",
        "",
        "TODO once the seat is retired: append the addendum `openwop-seat retire` prints (`--adr FILE` writes it "
        "to a file): what was retired and when, the artifact and declarations digests in force, the runs by era and "
        "how they became era 3, the era-2 runs left v1-only, the writer counters, the last v1 writer seen, and what "
        "was kept as evidence (docs/lifecycle.md). If the seat is uninstalled instead, say so here, with the era-3 "
        "runs `uninstall --keep-era3` listed.",
        "",
    ]
    return "\n".join(lines)


async def draft(config: Config, dsn: str, today: datetime.date | None = None) -> str:
    """Read the catalogue and the seat's meta, and render the ADR."""
    from proxy.artifacts.declarations import declarations_for
    from proxy.artifacts.load import load_artifacts
    from proxy.db.connect import connect
    from proxy.db.layout import SCHEMA, SchemaError
    from proxy.db.sql import quote_qualified
    from proxy.db.verify import read_meta

    artifacts = load_artifacts()
    declarations = declarations_for(config, artifacts)  # before connecting: a bad file is bad input
    host = config.host
    conn = await connect(dsn)
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            database = await conn.fetchval("SELECT pg_catalog.current_database()")
            tables = [Table(r["oid"], r["schema"], r["name"], r["kind"]) for r in await conn.fetch(TABLES_SQL)]
            events_oid = await conn.fetchval("SELECT pg_catalog.to_regclass($1)::oid",
                                             quote_qualified(host.events_table))
            runs_oid = await conn.fetchval("SELECT pg_catalog.to_regclass($1)::oid", quote_qualified(host.runs_table))
            recorded = await read_meta(conn)
    finally:
        await conn.close()
    if events_oid is None:
        raise SchemaError(f"the events table {host.events_table!r} (host.events_table) is not in database "
                          f"{database!r}: check --config and --dsn")
    if runs_oid is None:
        raise SchemaError(f"the runs table {host.runs_table!r} (host.runs_table) is not in database {database!r}: "
                          f"check --config and --dsn")
    era_store = (f"`{SCHEMA}.run_era` (a row only for runs stamped era 3)" if host.era_column is None
                 else f"the column `{host.era_column}` of `{host.runs_table}` (NULL: era 2; 3: era 3)")
    facts = SeatFacts(database, artifacts.tag, artifacts.digest, recorded, era_store, declarations)
    return render(facts, disposition_rows(tables, events_oid, runs_oid), today or datetime.date.today())


def cmd_adr(config: Config, dsn: str, out_path: str | None) -> int:
    """``openwop-seat adr``: the ADR on stdout or in a new file; 0, 1 (database, artifacts) or 2 (an existing file)."""
    from proxy.tools.common import unavailable

    name = "openwop-seat adr"
    if out_path is not None and os.path.lexists(out_path):
        print(f"{name}: --out {out_path!r} exists: refusing to overwrite an ADR (remove it or choose another path)",
              file=sys.stderr)
        return 2
    from proxy.artifacts.declarations import DeclarationsError

    try:
        text = asyncio.run(draft(config, dsn))
    except DeclarationsError as e:
        print(f"{name}: host.declarations_file: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        if (message := unavailable(e)) is None:
            raise
        print(f"{name}: {message}", file=sys.stderr)
        return 1
    if out_path is None:
        sys.stdout.write(text)
        return 0
    try:
        with open(out_path, "x", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        print(f"{name}: cannot write {out_path!r}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"wrote {out_path}", file=sys.stderr)
    return 0
