"""`make demo`: a throwaway PostgreSQL with a host-shaped schema, the seat in front, the reader rule at work.

The demo starts a cluster, creates the host's tables as an ordinary role, runs
`openwop-seat migrate` as the superuser (the schema owner), starts
`openwop-seat serve` with a config that gives `application_name` "v1-host"
major 1 and "ops" major "raw" (everyone else gets the default, 2), seeds an
era-2 run and an era-3 run directly in the database, and reads them through
the seat as each major. It then shows two refusals and the host's append path.

Everything runs on loopback and is removed on exit (Ctrl-C and errors included).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import asyncpg

from .artifacts import load_artifacts
from .devcluster import DevCluster, PostgresNotFound, free_port

HOST_ROLE = "app"  # the host's role: not a superuser, not the owner of openwop_seat

HOST_SCHEMA = """
CREATE TABLE runs (
    run_id text PRIMARY KEY, tenant_id text NOT NULL, status text, inputs jsonb, metadata jsonb,
    configurable jsonb, parent_run_id text, created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE events (
    event_id text PRIMARY KEY, run_id text NOT NULL, sequence integer NOT NULL, type text NOT NULL,
    node_id text, payload jsonb, timestamp timestamptz NOT NULL, causation_id text,
    UNIQUE (run_id, sequence));
"""

# The host's append: advisory xact lock, then a CTE computing the next sequence, RETURNING the row.
APPEND = """
WITH next AS (SELECT COALESCE(MAX(sequence), 0) + 1 AS seq FROM events WHERE run_id = $1)
INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id)
SELECT $2, $1, next.seq, $3, $4, $5, now(), $6 FROM next
RETURNING event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id
"""

PAGE = "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3"

# Two runs seeded directly in the database (not through the seat), as a host would have stored them.
# Era 2 (no run_era row): v1 vocabulary. Era 3 (stamped in openwop_seat.run_era): v2 vocabulary.
ERA2_RUN, ERA3_RUN = "run-era2", "run-era3"
ERA2_TYPES = ["run.started", "agent.reasoning.delta", "run.resuming", "replay.divergedAtRefusal",
              "example.thing-happened", "run.completed"]
# The same events as a v2 host writes them: the v2 names come from the pinned codemap.
ERA3_TYPES = [load_artifacts().v1_to_v2.get(t, t) for t in ERA2_TYPES]

# Who connects how: the seat's [[proxy.clients]] rules match application_name.
READERS = {"raw": "ops", "v2": "host-v2", "v1": "v1-host"}

CONFIG = """\
# written by `python -m proxy.demo`
[proxy]
listen = "127.0.0.1:{port}"
upstream = "127.0.0.1:{upstream}"
default_major = 2
shutdown_timeout = 5

[[proxy.clients]]
application_name = "v1-host"
major = 1

[[proxy.clients]]
application_name = "ops"
major = "raw"

[host]
dsn = "{dsn}"
"""


class DemoError(RuntimeError):
    """An expected failure (a command failed, the seat did not start): reported without a traceback."""


def _section(title: str) -> None:
    print(f"\n== {title}")


def _check_artifacts() -> None:
    a = load_artifacts()
    for v1, v2 in zip(ERA2_TYPES, ERA3_TYPES):
        if v1 in a.v1_to_v2 and a.v1_to_v2[v1] != v2:
            raise DemoError(f"demo data out of date: the pinned codemap maps {v1} to {a.v1_to_v2[v1]}, not {v2}")
    print(f"spec artifacts: tag {a.tag}, digest {a.digest[:16]}…, {a.rows} codemap rows, {a.renamed_count} renamed")


def _run_cli(*args: str) -> None:
    """Run `python -m proxy ARGS` and show its output (migrate, like serve, is a separate process)."""
    out = subprocess.run([sys.executable, "-m", "proxy", *args], capture_output=True, text=True, timeout=60,
                         check=False)
    shown = " ".join(a if " " not in a else f"'{a}'" for a in args)
    shown = shown.replace(os.path.dirname(args[args.index("--config") + 1]), "$DEMO_DIR") if "--config" in args \
        else shown
    print(f"$ openwop-seat {shown}")
    for line in (out.stdout + out.stderr).splitlines():
        print(f"  {line}")
    if out.returncode != 0:
        raise DemoError(f"openwop-seat {args[0]} exited {out.returncode}")


async def _connect(port: int, reader: str) -> asyncpg.Connection:
    return await asyncpg.connect(host="127.0.0.1", port=port, user=HOST_ROLE, database="postgres",
                                 server_settings={"application_name": READERS[reader]})


async def _seed(cluster: DevCluster) -> None:
    """Write the two runs straight into the database, bypassing the seat."""
    conn = await asyncpg.connect(host="127.0.0.1", port=cluster.port, user="postgres", database="postgres")
    try:
        rows = []
        for run, types in ((ERA2_RUN, ERA2_TYPES), (ERA3_RUN, ERA3_TYPES)):
            await conn.execute("INSERT INTO runs (run_id, tenant_id, status) VALUES ($1, 'tenant-1', 'completed')",
                               run)
            rows += [(f"{run}-{i}", run, i, t) for i, t in enumerate(types, 1)]
        await conn.executemany(
            "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
            "VALUES ($1, $2, $3, $4, 'n1', '{\"k\": 1}', now())", rows)
        # The era-3 stamp, as the writer rule will write it for runs a v2 host creates. The host's role cannot.
        await conn.execute("INSERT INTO openwop_seat.run_era (run_id, era, source) VALUES ($1, 3, 'demo')", ERA3_RUN)
    finally:
        await conn.close()


async def _side_by_side(port: int) -> None:
    conns = {r: await _connect(port, r) for r in READERS}
    try:
        w = 29
        head = ("stored (raw reader)", "v2 reader (major 2)", "v1 reader (major 1)")
        print(f"\n  {'run':<9} {'seq':>3}  {head[0]:<{w}} {head[1]:<{w}} {head[2]}")
        print(f"  {'-' * 9} {'-' * 3}  {'-' * w} {'-' * w} {'-' * w}")
        others_equal = True
        for run in (ERA2_RUN, ERA3_RUN):
            got = {r: await c.fetch(PAGE, run, 0, 100) for r, c in conns.items()}
            for raw, v2, v1 in zip(got["raw"], got["v2"], got["v1"]):
                seen = [row["type"] if row["type"] == raw["type"] else f"{row['type']} *" for row in (v2, v1)]
                print(f"  {run:<9} {raw['sequence']:>3}  {raw['type']:<{w}} {seen[0]:<{w}} {seen[1]}")
                for row in (v2, v1):
                    others_equal &= [v for k, v in row.items() if k != "type"] == \
                        [v for k, v in raw.items() if k != "type"]
        print("\n  * = the seat changed the type on the way out. Era 2 is stored in v1 vocabulary: the v2")
        print("  reader gets it through the codemap, the v1 reader as stored. Era 3 is stored in v2: the v1")
        print("  reader gets it through the inverted codemap. Identity rows and the registered vendor type")
        print("  (example.*) read the same everywhere. The hidden era column never shows.")
        print("  every other column equal for all three readers:", "yes" if others_equal else "NO")
    finally:
        for c in conns.values():
            await c.close()


def _show_error(e: asyncpg.PostgresError) -> None:
    print(f"  SQLSTATE {e.sqlstate}")
    print(f"  message  {e.message}")
    if e.detail:
        json.loads(e.detail)  # the DETAIL is the OpenWOP error envelope as JSON
    print(f"  detail   {e.detail}" if e.detail else "  detail   (none)")
    if getattr(e, "hint", None):
        print(f"  hint     {e.hint}")


async def _refusals(cluster: DevCluster, port: int) -> None:
    direct = await asyncpg.connect(host="127.0.0.1", port=cluster.port, user="postgres", database="postgres")
    try:
        await direct.execute("INSERT INTO runs (run_id, tenant_id, status) VALUES ('run-unmapped', 'tenant-1', 'x')")
        await direct.executemany(
            "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
            "VALUES ($1, 'run-unmapped', $2, $3, 'n1', NULL, now())",
            [("u-1", 1, "run.started"), ("u-2", 2, "foo.bar"), ("u-3", 3, "run.completed")])
    finally:
        await direct.close()

    v2 = await _connect(port, "v2")
    try:
        _section("an unmapped type: era-2 run 'run-unmapped' holds 'foo.bar' (no codemap row, no registered org)")
        print(f"v2 reader: {PAGE}")
        try:
            await v2.fetch(PAGE, "run-unmapped", 0, 100)
            print("  (unexpectedly succeeded)")
        except asyncpg.PostgresError as e:
            _show_error(e)
        print("  the statement failed inside PostgreSQL, so the driver gets this error instead of a page.")
        print("  the session goes on:", await v2.fetchval("SELECT 'still usable'"))
        v1 = await _connect(port, "v1")
        try:
            types = [r["type"] for r in await v1.fetch(PAGE, "run-unmapped", 0, 100)]
            print(f"  a v1 reader reads the same era-2 run as stored: {types}")
        finally:
            await v1.close()

        sql = "SELECT * FROM events WHERE type = 'x'"
        _section("a refused statement: a predicate on the event type cannot be translated exactly")
        print(f"v2 reader: BEGIN; INSERT INTO runs … 'run-rolled-back'; {sql}")
        await v2.execute("BEGIN")
        await v2.execute("INSERT INTO runs (run_id, tenant_id, status) VALUES ('run-rolled-back', 'tenant-1', 'x')")
        try:
            await v2.fetch(sql)
            print("  (unexpectedly succeeded)")
        except asyncpg.PostgresError as e:
            _show_error(e)
        try:
            await v2.fetchval("SELECT 1")
        except asyncpg.PostgresError as e:
            print(f"  next statement in the transaction: SQLSTATE {e.sqlstate}: {e.message}")
        print(f"  COMMIT answers: {await v2.execute('COMMIT')}")
        left = await v2.fetchval("SELECT count(*) FROM runs WHERE run_id = 'run-rolled-back'")
        print(f"  runs named 'run-rolled-back' afterwards: {left}. The refused statement was never sent; a")
        print("  failing stand-in ran in its place, so the transaction failed as after any PostgreSQL error.")
    finally:
        await v2.close()


async def _host_append(port: int) -> None:
    _section("the host's append path through the seat (v2 reader; advisory lock, CTE, INSERT … RETURNING)")
    print("The writer rule is not there yet: a v2 host's appends are stored as sent. Here the demo")
    print("appends the v1 spellings an era-2 run holds (what the writer rule will store); the RETURNING")
    print("row already reads in v2 vocabulary.")
    conn = await _connect(port, "v2")
    try:
        await conn.execute("INSERT INTO runs (run_id, tenant_id, status) VALUES ('run-demo', 'tenant-1', 'running')")
        for i, (etype, payload) in enumerate([
            ("run.started", '{"engineVersion": "1"}'),
            ("agent.reasoning.delta", '{"text": "thinking..."}'),
            ("node.completed", '{"nodeId": "n1"}'),
        ]):
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1), 1)", "run-demo")
                row = await conn.fetchrow(APPEND, "run-demo", f"evt-{i}", etype, "n1", payload, None)
            print(f"  appended {row['event_id']} as sequence {row['sequence']}: sent {etype!r}, "
                  f"RETURNING type {row['type']!r}")
        print("\nlog page read through the seat (SELECT * … ORDER BY sequence LIMIT 100):")
        for r in await conn.fetch(PAGE, "run-demo", 0, 100):
            print(f"  #{r['sequence']:<2} {r['type']:<28} {r['payload']}")
        print("\nand today's gap: a v2 spelling appended to the era-2 run is not a v1 type, so the read")
        print("check on RETURNING refuses it (the INSERT fails with it):")
        try:
            async with conn.transaction():
                await conn.fetchrow(APPEND, "run-demo", "evt-v2", ERA3_TYPES[1], "n1", None, None)
            print("  (unexpectedly succeeded)")
        except asyncpg.PostgresError as e:
            print(f"  SQLSTATE {e.sqlstate}: {e.message}")
        count = await conn.fetchval("SELECT count(*) FROM events WHERE run_id = 'run-demo'")
        print(f"  run-demo still has {count} events")
    finally:
        await conn.close()


async def _through_seat(cluster: DevCluster, port: int) -> None:
    probe = await _connect(port, "v2")
    try:
        print(f"\nconnected through the seat on 127.0.0.1:{port} as role {HOST_ROLE!r}; server says:",
              await probe.fetchval("SELECT version()"))
    finally:
        await probe.close()
    await _seed(cluster)
    _section(f"two runs seeded directly in the database: {ERA2_RUN} (era 2, no stamp), "
             f"{ERA3_RUN} (era 3, stamped)")
    print("read through the seat with the same statement by three clients; the [[proxy.clients]] rules")
    print('give application_name "ops" major "raw", "v1-host" major 1; "host-v2" gets default_major 2.')
    await _side_by_side(port)
    await _refusals(cluster, port)
    await _host_append(port)


def _wait_listening(port: int, seat: subprocess.Popen, log_path: str) -> None:
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or seat.poll() is not None:
                with open(log_path) as f:
                    print(f"seat log:\n{f.read()}", file=sys.stderr)
                raise DemoError("the seat did not start (its log is above)")
            time.sleep(0.1)


def main() -> int:
    try:
        cluster = DevCluster()
    except PostgresNotFound as e:
        print(f"openwop-seat demo: {e}", file=sys.stderr)
        return 1
    seat = None
    workdir = tempfile.mkdtemp(prefix="openwop-seat-demo-")
    try:
        _check_artifacts()
        print("starting a throwaway PostgreSQL …")
        cluster.start()
        cluster.psql(f"CREATE ROLE {HOST_ROLE} LOGIN; GRANT CREATE ON SCHEMA public TO {HOST_ROLE}")
        cluster.psql(HOST_SCHEMA, user=HOST_ROLE)
        print(f"host tables runs and events created by role {HOST_ROLE!r} (not a superuser)")

        owner_dsn = cluster.dsn()  # the superuser: owns openwop_seat
        port = free_port()
        config_path = os.path.join(workdir, "openwop-seat.toml")
        with open(config_path, "w") as f:
            f.write(CONFIG.format(port=port, upstream=cluster.port, dsn=cluster.dsn(user=HOST_ROLE)))

        _section("installing the seat's schema (as the schema owner), then again: re-running is safe")
        _run_cli("migrate", "--config", config_path, "--dsn", owner_dsn)
        _run_cli("migrate", "--config", config_path, "--dsn", owner_dsn)

        _section("starting the seat")
        print(f"config ({os.path.basename(config_path)} in a temporary folder):")
        with open(config_path) as f:
            print("".join(f"  {line}" for line in f if not line.startswith("#")), end="")
        log_path = os.path.join(workdir, "seat.log")
        with open(log_path, "wb") as log_file:
            seat = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", config_path],
                                    stdout=subprocess.DEVNULL, stderr=log_file)
        _wait_listening(port, seat, log_path)
        print("serve checked the schema layout and the artifact digest in the database, and is listening.")

        asyncio.run(_through_seat(cluster, port))

        _section("seat log")
        seat.send_signal(signal.SIGTERM)
        seat.wait(20)
        with open(log_path) as f:
            print("".join(f"  {line}" for line in f), end="")
        print(f"\nthe seat exited {seat.returncode}; the cluster and the temporary folders are removed on exit.")
        return 0
    except DemoError as e:
        print(f"openwop-seat demo: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        if seat is not None and seat.poll() is None:
            seat.kill()
            seat.wait()
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
