"""`make demo`: a throwaway PostgreSQL with a host-shaped schema, the seat in front, both rules at work.

The demo starts a cluster, creates the host's tables owned by a role of their
own (the host connects as another, ordinary role), makes a random claim
secret, runs `openwop-seat migrate` as the superuser (the schema owner) with
the secret in $OPENWOP_SEAT_CLAIM_SECRET, starts `openwop-seat serve` with the
same secret and a config that gives `application_name` "v1-host" major 1 and
"ops" major "raw" (everyone else gets the default, 2), seeds an era-2 run and
an era-3 run directly in the database, and reads them through the seat as each
major. It then shows two read refusals and the writer rule: a v2 host
appending into the old era-2 run (stored in v1 spelling, read back in v2), a
v2 host creating a new run (stamped era 3), and a v1 writer refused on it.

Everything runs on loopback and is removed on exit (Ctrl-C and errors included).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import asyncpg

from proxy.artifacts.load import load_artifacts
from proxy.db.layout import CLAIM_SECRET_ENV
from proxy.dev.devcluster import DevCluster, PostgresNotFound, free_port
from proxy.errors import SeatException

HOST_ROLE = "app"  # the host's role: not a superuser, not the owner of openwop_seat, not the tables' owner
TABLE_OWNER = "app_owner"  # owns runs and events, so the host's role cannot disable their triggers

# The recommended role layout (docs/host-database.md, "Recommended role layout"): a role that owns the host's tables and
# a host role that may only read and write their rows.
ROLES = f"""
CREATE ROLE {TABLE_OWNER} NOLOGIN;
CREATE ROLE {HOST_ROLE} LOGIN;
GRANT CREATE ON SCHEMA public TO {TABLE_OWNER};
"""

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
GRANTS = f"GRANT SELECT, INSERT, UPDATE, DELETE ON runs, events TO {HOST_ROLE};"

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

# The writer rule's part: a v1 name, and its v2 name from the pinned codemap (never spelled here).
APPENDED_V1 = "agent.toolCalled"
APPENDED_V2 = load_artifacts().v1_to_v2[APPENDED_V1]
NEW_RUN = "run-new"

# Who connects how: the seat's [[proxy.clients]] rules match application_name.
READERS = {"raw": "ops", "v2": "host-v2", "v1": "v1-host"}

CONFIG = """\
# written by `python -m proxy.dev.demo`
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


class DemoError(SeatException, RuntimeError):
    """An expected failure (a command failed, the seat did not start): reported without a traceback."""


def _section(title: str) -> None:
    print(f"\n== {title}")


def _check_artifacts() -> None:
    a = load_artifacts()
    for v1, v2 in zip(ERA2_TYPES, ERA3_TYPES):
        if v1 in a.v1_to_v2 and a.v1_to_v2[v1] != v2:
            raise DemoError(f"demo data out of date: the pinned codemap maps {v1} to {a.v1_to_v2[v1]}, not {v2}")
    print(f"spec artifacts: tag {a.tag}, digest {a.digest[:16]}…, {a.rows} codemap rows, {a.renamed_count} renamed")


def _run_cli(env: dict[str, str], *args: str) -> None:
    """Run `python -m proxy ARGS` and show its output (migrate, like serve, is a separate process)."""
    out = subprocess.run([sys.executable, "-m", "proxy", *args], capture_output=True, text=True, timeout=60,
                         check=False, env=env)
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


async def _direct(cluster: DevCluster) -> asyncpg.Connection:
    """A session straight to the database as the superuser, bypassing the seat (so: no claim, a v1 writer)."""
    return await asyncpg.connect(host="127.0.0.1", port=cluster.port, user="postgres", database="postgres")


async def _seed(cluster: DevCluster) -> None:
    """Write the two runs straight into the database, bypassing the seat."""
    conn = await _direct(cluster)
    try:
        rows = []
        for run, types, status in ((ERA2_RUN, ERA2_TYPES, "running"), (ERA3_RUN, ERA3_TYPES, "completed")):
            await conn.execute("INSERT INTO runs (run_id, tenant_id, status) VALUES ($1, 'tenant-1', $2)",
                               run, status)
            rows += [(f"{run}-{i}", run, i, t) for i, t in enumerate(types, 1)]
        # The writer rule is in force here too: this session bypasses the seat, so it has no claim and
        # is a v1 writer, which may append to era-2 runs only (an append to an era-3 run would be refused
        # with OW005). So the era-3 run's rows go in first, while the run is still era 2, and the run is
        # stamped afterwards with stamp_run, under the run's lock, as a backfill stamps a run. (The other
        # way, SET session_replication_role = replica as the superuser, would switch off every trigger,
        # the host's own included, as a restore does; keeping the rule on shows it is not in the way.)
        await conn.executemany(
            "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
            "VALUES ($1, $2, $3, $4, 'n1', '{}', now())", rows)
        await conn.execute("SELECT openwop_seat.stamp_run($1, 'demo')", ERA3_RUN)  # the host's role cannot
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
                for row in (v2, v1):  # payloads: the next section
                    others_equal &= [v for k, v in row.items() if k not in ("type", "payload")] == \
                        [v for k, v in raw.items() if k not in ("type", "payload")]
        print("\n  * = the seat changed the type on the way out. Era 2 is stored in v1 vocabulary: the v2")
        print("  reader gets it through the codemap, the v1 reader as stored. Era 3 is stored in v2: the v1")
        print("  reader gets it through the inverted codemap. Identity rows and the registered vendor type")
        print("  (example.*) read the same everywhere. The hidden era column never shows.")
        print("  every other column but the payload equal for all three readers:", "yes" if others_equal else "NO")
    finally:
        for c in conns.values():
            await c.close()


PAYLOAD_ROWS = [  # (run, sequence, type, stored payload)
    ("run-payloads", 1, "run.started", '{"workflowId": "wf-demo", "engineVersion": "7"}'),
    ("run-payloads", 2, "variable.changed", '{"name": "total", "value": 2}'),
    ("run-payloads", 3, "agent.toolCalled", '{"agentId": "a-1", "toolName": "echo", "callId": "c-1"}'),
    ("run-unseatable", 1, "provider.usage",
     '{"provider": "p", "model": "m", "inputTokens": 1, "outputTokens": 1, "latencyMs": 30}'),
]


async def _payloads(cluster: DevCluster, port: int) -> None:
    direct = await _direct(cluster)
    try:
        for run in ("run-payloads", "run-unseatable"):
            await direct.execute("INSERT INTO runs (run_id, tenant_id, status) VALUES ($1, 'tenant-1', 'x')", run)
        await direct.executemany(
            "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
            "VALUES ($1, $2, $3, $4, 'n1', $5::jsonb, now())",
            [(f"{run}-{seq}", run, seq, t, payload) for run, seq, t, payload in PAYLOAD_ROWS])
    finally:
        await direct.close()
    _section("payload projection: era-2 run 'run-payloads' (tenant 'tenant-1'), stored vs read by a v2 reader")
    v2, raw = await _connect(port, "v2"), await _connect(port, "raw")
    try:
        stored = await raw.fetch(PAGE, "run-payloads", 0, 100)
        read = await v2.fetch(PAGE, "run-payloads", 0, 100)
        for s_row, r_row in zip(stored, read):
            print(f"  {s_row['sequence']}  {s_row['type']} (v2 reads {r_row['type']})\n     stored  {s_row['payload']}")
            mark = "(unchanged: the server's own bytes)" if r_row["payload"] == s_row["payload"] else ""
            print(f"     v2 read {r_row['payload']} {mark}")
        print("  run.started: engineVersion \"7\" is read as 7, and the owner block carries the legacy Subject")
        print("  (issuer urn:openwop:legacy) with the run's tenant, read in the same statement. variable.changed")
        print("  has no seat for 'value' in its closed, hatched definition: it is boxed under \"x-v1\", never dropped.")
        _section("an unseatable key: provider.usage is closed without the hatch, and the row holds 'latencyMs'")
        try:
            await v2.fetch(PAGE, "run-unseatable", 0, 100)
            print("  (unexpectedly succeeded)")
        except asyncpg.PostgresError as e:
            _show_error(e)
    finally:
        await v2.close()
        await raw.close()


def _show_error(e: asyncpg.PostgresError) -> None:
    print(f"  SQLSTATE {e.sqlstate}")
    print(f"  message  {e.message}")
    if e.detail:
        json.loads(e.detail)  # the DETAIL is the OpenWOP error envelope as JSON
    print(f"  detail   {e.detail}" if e.detail else "  detail   (none)")
    if getattr(e, "hint", None):
        print(f"  hint     {e.hint}")


async def _refusals(cluster: DevCluster, port: int) -> None:
    direct = await _direct(cluster)
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

        sql = "CREATE VIEW run_starts AS SELECT run_id FROM events WHERE type = 'run.started'"
        _section("a refused statement: a view over the events table would keep a read no later reader's major "
                 "applies to")
        print(f"v2 reader: BEGIN; INSERT INTO runs … 'run-rolled-back'; {sql}")
        await v2.execute("BEGIN")
        await v2.execute("INSERT INTO runs (run_id, tenant_id, status) VALUES ('run-rolled-back', 'tenant-1', 'x')")
        try:
            await v2.execute(sql)
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


async def _stored(cluster: DevCluster, run: str, seq: int) -> tuple[str, int]:
    """(the type as stored, the run's era), read directly in the database, bypassing the seat."""
    conn = await _direct(cluster)
    try:
        return (await conn.fetchval("SELECT type FROM events WHERE run_id = $1 AND sequence = $2", run, seq),
                await conn.fetchval("SELECT openwop_seat.era_of($1)", run))
    finally:
        await conn.close()


async def _append(conn: asyncpg.Connection, run: str, event_id: str, etype: str) -> asyncpg.Record:
    """The host's append: BEGIN, advisory xact lock, CTE INSERT … RETURNING, COMMIT."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1), 1)", run)
        return await conn.fetchrow(APPEND, run, event_id, etype, "n1", '{"tool": "search"}', None)


def _show_append(run: str, etype: str, commits: bool = True) -> None:
    print("  BEGIN")
    print(f"  SELECT pg_advisory_xact_lock(hashtext($1), 1)                    $1 = {run!r}")
    print(f"  WITH next AS (…) INSERT INTO events (…) SELECT … RETURNING …    "
          f"$1 = {run!r}, $3 (type) = {etype!r}")
    print("  COMMIT" if commits else "  COMMIT (not reached: the INSERT fails, and the driver sends ROLLBACK)")


async def _writer_rule(cluster: DevCluster, port: int) -> None:
    _section("the writer rule: a v2 host appending into an old run (stored v1, read v2), "
             "and a v1 writer refused on a new run")
    v2, v1 = await _connect(port, "v2"), await _connect(port, "v1")
    try:
        print("who is writing: the seat claimed each session's major right after authentication")
        for name, conn in (("v2 host (host-v2)", v2), ("v1 host (v1-host)", v1)):
            major = await conn.fetchval("SELECT openwop_seat.session_major()")
            print(f"  {name}: openwop_seat.session_major() = {major}")

        seq = await v2.fetchval("SELECT max(sequence) + 1 FROM events WHERE run_id = $1", ERA2_RUN)
        print(f"\nv2 host appends {APPENDED_V2!r} (a v2 name) to the era-2 run {ERA2_RUN}, through the seat:")
        _show_append(ERA2_RUN, APPENDED_V2)
        row = await _append(v2, ERA2_RUN, f"{ERA2_RUN}-{seq}", APPENDED_V2)
        stored, era = await _stored(cluster, ERA2_RUN, row["sequence"])
        print(f"  RETURNING gave   sequence {row['sequence']}, type {row['type']!r}")
        print(f"  stored (direct)  type {stored!r}: the v1 spelling, so the era-2 log stays one vocabulary")
        print(f"  the run's era    {era} (still era 2: an append never stamps a run)")

        print(f"\nv2 host creates a new run {NEW_RUN} through the seat and appends {ERA3_TYPES[1]!r}:")
        await v2.execute("INSERT INTO runs (run_id, tenant_id, status) VALUES ($1, 'tenant-1', 'running')", NEW_RUN)
        print(f"  INSERT INTO runs (run_id, …) VALUES ({NEW_RUN!r}, …)")
        stamp = await v2.fetchrow("SELECT run_id, era, source FROM openwop_seat.run_era WHERE run_id = $1", NEW_RUN)
        print(f"  openwop_seat.run_era: run_id={stamp['run_id']!r} era={stamp['era']} source={stamp['source']!r} "
              f"(stamped by the trigger on runs, in the INSERT's transaction)")
        row = await _append(v2, NEW_RUN, f"{NEW_RUN}-1", ERA3_TYPES[1])
        stored, era = await _stored(cluster, NEW_RUN, row["sequence"])
        print(f"  appended sequence {row['sequence']}: RETURNING type {row['type']!r}, stored {stored!r} "
              f"(era {era}: v2 names as sent)")

        print(f"\nv1 host (application_name v1-host, major 1) appends {APPENDED_V1!r} (a v1 name) to {NEW_RUN}:")
        _show_append(NEW_RUN, APPENDED_V1, commits=False)
        try:
            await _append(v1, NEW_RUN, f"{NEW_RUN}-v1", APPENDED_V1)
            print("  (unexpectedly succeeded)")
        except asyncpg.PostgresError as e:
            _show_error(e)
        count = await v1.fetchval("SELECT count(*) FROM events WHERE run_id = $1", NEW_RUN)
        print(f"  the transaction rolled back; {NEW_RUN} still has {count} event(s); the session goes on.")

        print("\nand the claim cannot be made by a client (the classifier refuses it before it is sent):")
        try:
            await v1.execute("SELECT openwop_seat.claim('a-guess', 2)")
            print("  (unexpectedly succeeded)")
        except asyncpg.PostgresError as e:
            print(f"  SQLSTATE {e.sqlstate}: {e.message}")
    finally:
        await v1.close()
        await v2.close()


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
    await _payloads(cluster, port)
    await _refusals(cluster, port)
    await _writer_rule(cluster, port)


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
        cluster.psql(ROLES)
        cluster.psql(f"SET ROLE {TABLE_OWNER};" + HOST_SCHEMA + GRANTS)
        print(f"host tables runs and events owned by role {TABLE_OWNER!r}; the host connects as {HOST_ROLE!r} "
              f"(not a superuser, not their owner: it cannot disable their triggers)")

        # The claim secret: migrate stores its salted SHA-256, serve presents it on every session. Random
        # for each run of the demo, handed over in the environment, and never printed.
        env = {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"}
        env[CLAIM_SECRET_ENV] = secrets.token_hex(24)

        owner_dsn = cluster.dsn()  # the superuser: owns openwop_seat
        port = free_port()
        config_path = os.path.join(workdir, "openwop-seat.toml")
        with open(config_path, "w") as f:
            f.write(CONFIG.format(port=port, upstream=cluster.port, dsn=cluster.dsn(user=HOST_ROLE)))

        _section("installing the seat's schema (as the schema owner), then again: re-running is safe")
        print(f"(with a random claim secret in ${CLAIM_SECRET_ENV})")
        _run_cli(env, "migrate", "--config", config_path, "--dsn", owner_dsn)
        _run_cli(env, "migrate", "--config", config_path, "--dsn", owner_dsn)

        _section("starting the seat")
        print(f"config ({os.path.basename(config_path)} in a temporary folder):")
        with open(config_path) as f:
            print("".join(f"  {line}" for line in f if not line.startswith("#")), end="")
        log_path = os.path.join(workdir, "seat.log")
        with open(log_path, "wb") as log_file:
            seat = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", config_path],
                                    stdout=subprocess.DEVNULL, stderr=log_file, env=env)
        _wait_listening(port, seat, log_path)
        print("serve checked the schema layout, the artifact digest and the writer rule's triggers in the")
        print(f"database, and is listening; it has the claim secret (${CLAIM_SECRET_ENV}).")

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
