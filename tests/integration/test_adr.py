"""`openwop-seat adr`: the seat and every host table's disposition, on a host-shaped database.

The database holds conftest's HOST_SCHEMA, the seat's schema (`migrate`), and
host-like tables of the kinds the spec's template names, plus tables it does
not know, in two schemas, with a partitioned table and a materialized view.
The command runs as a subprocess against it, as the host's role.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid

import pytest

from harness import HOST_SCHEMA, ROOT, render_config
from proxy import __version__
from proxy.artifacts.load import load_artifacts
from proxy.dev.devcluster import free_port
from proxy.tools.adr import DISPOSITIONS

A = load_artifacts()

EXTRA = """
CREATE TABLE interrupts (token text PRIMARY KEY, run_id text);
CREATE TABLE webhook_subscriptions (id text PRIMARY KEY, event_types text[]);
CREATE TABLE webhook_deliveries (id bigserial PRIMARY KEY, body jsonb);
CREATE TABLE idempotency_keys (key text PRIMARY KEY, response jsonb);
CREATE TABLE invocation_claims (id text PRIMARY KEY);
CREATE TABLE dispatch_outbox (id bigserial PRIMARY KEY);
CREATE TABLE audit_log (id bigserial PRIMARY KEY, fact jsonb);
CREATE TABLE widgets (id int PRIMARY KEY);
CREATE TABLE "Odd|Name" (id int);
CREATE SCHEMA ops;
CREATE TABLE ops.leases (id int);
CREATE TABLE measurements (at date NOT NULL, v int) PARTITION BY RANGE (at);
CREATE TABLE measurements_2026 PARTITION OF measurements FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
CREATE MATERIALIZED VIEW run_counts AS SELECT count(*) AS n FROM runs;
"""

# The prefilled disposition of every table, and whether its row asks the operator to confirm it.
EXPECTED = {
    "public.events": "translated",
    "public.runs": "legacy-stamped",
    "public.interrupts": "drained",
    "public.webhook_subscriptions": "unchanged",
    "public.webhook_deliveries": "drained",
    "public.idempotency_keys": "unchanged",
    "public.invocation_claims": "unchanged",
    "public.dispatch_outbox": "unchanged",
    "public.audit_log": "never-upgraded",
    "public.widgets": "unchanged",
    "public.Odd\\|Name": "unchanged",
    "ops.leases": "unchanged",
    "public.measurements": "unchanged",
    "public.run_counts": "unchanged",
}
UNKNOWN = {"public.widgets", "public.Odd\\|Name", "ops.leases", "public.measurements", "public.run_counts"}


@pytest.fixture(scope="module")
def host_db(pg, tmp_path_factory):
    name = f"adr_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {name} OWNER host_user")
    pg.psql(HOST_SCHEMA + EXTRA, user="host_user", dbname=name)
    config = tmp_path_factory.mktemp("adr") / "openwop-seat.toml"
    config.write_text(render_config({"host": {"events_table": "events"}}))
    yield name, config
    pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", check=False)


def adr(pg, name: str, config, *args: str, dsn: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proxy", "adr", "--config", str(config),
                           "--dsn", dsn or pg.dsn(user="host_user", dbname=name), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def table_rows(text: str) -> dict[str, tuple[str, str, str]]:
    """Store -> (v1 artifact, disposition, notes) of the disposition table's rows naming a database table."""
    rows = {}
    for line in text.splitlines():
        m = re.fullmatch(r"\| `(.+)` \| (.*) \| `([a-z-]+)` \| (.*) \|", line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} listed twice"
            rows[m.group(1)] = (m.group(2), m.group(3), m.group(4))
    return rows


def test_before_migrate_and_after_it_every_table_once_with_an_allowed_disposition(pg, host_db):
    name, config = host_db
    before = adr(pg, name, config)
    assert before.returncode == 0, before.stderr
    assert "no `openwop_seat` schema in this database yet" in before.stdout
    migrate = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--config", str(config), "--dsn",
                              pg.dsn(dbname=name)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert migrate.returncode == 0, migrate.stderr
    out = adr(pg, name, config)
    assert out.returncode == 0, out.stderr
    rows = table_rows(out.stdout)
    assert {store: d for store, (_, d, _) in rows.items()} == EXPECTED
    assert not any(store.startswith("openwop_seat.") or store == "public.measurements_2026" for store in rows)
    for store, (_, disposition, note) in rows.items():
        assert disposition in DISPOSITIONS
        assert ("TODO" in note) == (store in UNKNOWN), (store, note)
    # Every disposition in the whole document (the certification-bundle row too) is from the closed set.
    cells = re.findall(r"^\|.*\| `([^`]+)` \| [^|]*\|$", out.stdout, flags=re.M)
    assert cells and set(cells) <= set(DISPOSITIONS)
    # The seat, named with its version and the artifacts this database records.
    assert f"| version | {__version__} |" in out.stdout
    assert f"| spec artifacts tag | `{A.tag}` |" in out.stdout
    assert f"| spec artifacts digest (sha256) | `{A.digest}` |" in out.stdout
    assert f"artifact digest `{A.digest}`" in out.stdout and "which matches this release's" in out.stdout
    assert "| deployment | TODO:" in out.stdout
    assert f"- Database: `{name}`" in out.stdout


def test_out_writes_a_new_file_and_never_overwrites_one(pg, host_db, tmp_path):
    name, config = host_db
    path = tmp_path / "0042-openwop-seat.md"
    out = adr(pg, name, config, "--out", str(path))
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
    text = path.read_text()
    assert text.startswith("# ADR: openwop-seat is the storage boundary")
    assert set(table_rows(text)) == set(EXPECTED)
    path.write_text("edited by the operator\n")
    again = adr(pg, name, config, "--out", str(path))
    assert again.returncode == 2
    assert "exists: refusing to overwrite" in again.stderr
    assert path.read_text() == "edited by the operator\n"


def test_a_missing_events_table_and_an_unreachable_database_are_errors(pg, host_db, tmp_path):
    name, _ = host_db
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(render_config({"host": {"events_table": "event_log"}}))
    out = adr(pg, name, wrong)
    assert out.returncode == 1
    assert "the events table 'event_log' (host.events_table) is not in database" in out.stderr
    assert out.stdout == ""
    out = adr(pg, name, wrong, dsn=f"host=127.0.0.1 port={free_port()} user=host_user dbname={name}")
    assert out.returncode == 1
    assert out.stderr.startswith("openwop-seat adr: cannot connect to the database: ")
