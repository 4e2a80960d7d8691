"""Per-row cost of the writer rule's triggers on an append: none, each trigger alone, all of them.

    .venv/bin/python -m bench.append_cost [--rows 500] [--repeat 10] [--bulk] [--store-fill]

Starts a throwaway cluster, creates the reference host's tables and installs the seat's schema (``migrate``,
the v2 store on, as by default). Then, for each row trigger ``migrate`` installed on the events table that
fires on INSERT (read from ``pg_trigger``, so the script measures whatever the installed version has), it
times the host's append statement (docs: host-traffic.md; the per-run advisory lock, then a CTE computing
``COALESCE(MAX(sequence), 0) + 1`` and ``INSERT … SELECT … RETURNING`` every column, one transaction per
append as the host sends it), ``--rows`` times to a fresh run in a PL/pgSQL procedure inside the server that
commits after each append (no client round trip counted), and takes the CPU time the session's backend spent
(``/proc/<pid>/schedstat``: nanoseconds on a CPU, not wall time, so other load on a shared machine changes the
figures little), with

* ``none``: every seat trigger on the events table disabled;
* each trigger alone, the others disabled;
* ``all``: every trigger enabled, as ``migrate`` leaves them;

for three writers: a v1 writer appending to an era-2 run (an unclaimed session: the v1 host's own traffic),
a v2 writer (a session claimed as major 2) appending a renamed v2 name to an era-2 run (stored in its v1
spelling), and a v2 writer appending to an era-3 run. Each figure is the best of ``--repeat`` rounds over
every configuration in turn (after one round that warms the session up), printed as µs of the backend's CPU
per row: the ``none`` column as measured, the others above it.
``--bulk`` adds one multi-row ``INSERT … SELECT`` of ``--rows`` rows per run (a bulk append or a ``COPY``).
``--store-fill`` adds what filling each appended era-2 row into the v2 store from the append's trigger would
cost (ADR 0015 leaves the run unmarked, read live until the next background fill; ADR 0020 measured the
alternative): the row read through ``events_m2_live`` and inserted into ``events_v2_store`` in a block that
catches a refusal, one transaction per row, for each of the reference host's stored shapes, above a loop that
only probes the run's mark.
The superuser runs the statements (the net's row-level security, ADR 0009, is not part of these figures).
Nothing here asserts a figure; docs/performance.md quotes a run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import asyncpg

from proxy.artifacts.load import load_artifacts
from proxy.config import parse_config
from proxy.db.claims import claim_async
from proxy.db.migrate import migrate
from proxy.dev.devcluster import DevCluster

from .args import positive
from .stack import backend_cpu_ns as cpu_ns

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from harness import HOST_SCHEMA  # noqa: E402

# The writers: (name, major claimed or None, the run's era, the appended type, the type stored, the payload). When
# the append guard is disabled the stored spelling is appended (the AFTER checks would refuse the other).
WRITERS = [
    ("v1 → era 2", None, 2, "node.completed", "node.completed", '{"outputs": {"text": "T0-49"}}'),
    ("v2 → era 2", 2, 2, "agent.tool-called", "agent.toolCalled", '{"toolName": "search"}'),
    ("v2 → era 3", 2, 3, "node.completed", "node.completed", '{"outputs": {"text": "T0-49"}}'),
]
GUARD = "zz_openwop_seat_append"  # the BEFORE INSERT guard, which stores a v2 name in its era-2 spelling

# The host's append, as it sends it: one row per statement, one statement per transaction, run n times for one
# run inside the server (a procedure, which commits after each append as the host does).
APPENDS_PROCEDURE = """
CREATE PROCEDURE pg_temp.appends(run text, t text, p jsonb, n integer) LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR i IN 1..n LOOP
        PERFORM pg_advisory_xact_lock(hashtext(run), 1);
        WITH next AS (SELECT COALESCE(MAX(sequence), 0) + 1 AS seq FROM events WHERE run_id = run)
        INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id)
        SELECT run || '-' || next.seq, run, next.seq, t, NULL, p, now(), NULL FROM next
        RETURNING * INTO r;
        COMMIT;
    END LOOP;
END
$$"""
# What filling an appended row into the v2 store from the append's trigger would add (ADR 0015, ADR 0020): the row
# translated by events_m2_live and inserted into the store, in a block that would catch a refusal (a
# subtransaction), for each of n rows already appended to an era-2 run; measured against the same loop that
# only reads the row's key (the unmark such a fill would replace costs about the same as that read).
FILL_PROCEDURE = """
CREATE PROCEDURE pg_temp.fill_rows(run text, n integer, fill boolean) LANGUAGE plpgsql AS $$
DECLARE
    x bigint;
BEGIN
    FOR i IN 1..n LOOP
        IF fill THEN
            BEGIN
                INSERT INTO openwop_seat.events_v2_store
                SELECT * FROM openwop_seat.events_m2_live l WHERE l.run_id = run AND l.sequence = i;
            EXCEPTION WHEN SQLSTATE 'OW001' OR SQLSTATE 'OW002' OR SQLSTATE 'OW003' THEN
                NULL;
            END;
        ELSE
            SELECT count(*) INTO x FROM openwop_seat.events_v2_runs WHERE run_id = run;
        END IF;
        COMMIT;
    END LOOP;
END
$$"""
# The reference host's stored shapes (issue 22), for the fill's cost by type.
SHAPES = [
    ("run.started", '{"workflowId": "openwop-app.uppercase"}'),
    ("node.started", '{}'),
    ("node.completed", '{"outputs": {"text": "T0-49"}}'),
    ("memory.written", '{"tags": ["a", "b"], "memoryId": "mem_1", "memoryRef": "tenant-memory"}'),
    ("run.completed", '{"output": {"text": "HELLO SEAT"}}'),
]
BULK = ("INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id) "
        "SELECT $1 || '-' || i, $1, i, $2, NULL, $3::jsonb, now(), NULL FROM generate_series(1, $4) i")

# The seat's row triggers on the events table that fire on INSERT (tgtype: bit 0 row, bit 2 insert).
TRIGGERS = ("SELECT tgname FROM pg_trigger WHERE tgrelid = 'events'::regclass AND NOT tgisinternal "
            "AND tgname LIKE 'zz\\_openwop\\_seat\\_%' AND tgtype & 5 = 5 ORDER BY tgname")


async def measure(port: int, secret: str, rows: int, repeat: int, bulk: bool,
                  store_fill: bool) -> tuple[list[str], list[dict], dict[str, float]]:
    connect = lambda: asyncpg.connect(host="127.0.0.1", port=port, user="postgres", database="postgres")  # noqa: E731
    admin, v1, v2 = await connect(), await connect(), await connect()
    try:
        await claim_async(v2, secret, 2)
        assert await v2.fetchval("SELECT openwop_seat.session_major()") == 2
        assert await v1.fetchval("SELECT openwop_seat.session_major()") is None
        for conn in (v1, v2):
            await conn.execute(APPENDS_PROCEDURE)
        names = [r["tgname"] for r in await admin.fetch(TRIGGERS)]
        pids = {conn: conn.get_server_pid() for conn in (v1, v2)}
        count = 0

        configs = [("none", [])] + [(n, [n]) for n in names] + [("all", names)]
        out = []
        for mode in (["append", "bulk"] if bulk else ["append"]):
            for label, major, era, sent, stored, p in WRITERS:
                conn = v2 if major == 2 else v1
                row = {"mode": mode, "writer": label}
                times: dict[str, list[float]] = {cname: [] for cname, _ in configs}
                # rounds over every configuration in turn, so a burst of other load hits them alike
                for i in range(repeat + 1):  # the first round warms the session's plans up; not kept
                    for cname, enabled in configs:
                        t = sent if GUARD in enabled else stored
                        await admin.execute("ALTER TABLE events DISABLE TRIGGER USER")
                        for n in enabled:
                            await admin.execute(f'ALTER TABLE events ENABLE TRIGGER "{n}"')
                        count += 1
                        run = f"bench-{count}"
                        # the run's row, committed: by a v2 writer for an era-3 run (stamped), else a v1 writer
                        await (v2 if era == 3 else v1).execute(
                            "INSERT INTO runs (run_id, tenant_id) VALUES ($1, 'acme')", run)
                        start = cpu_ns(pids[conn])
                        if mode == "bulk":
                            await conn.execute(BULK, run, t, p, rows)
                        else:  # simple protocol: a procedure that commits is called outside any transaction
                            await conn.execute(f"CALL pg_temp.appends('{run}', '{t}', '{p}'::jsonb, {int(rows)})")
                        if i:
                            times[cname].append((cpu_ns(pids[conn]) - start) / 1e9)
                for cname, took in times.items():
                    row[cname] = min(took) / rows * 1e6
                await admin.execute("ALTER TABLE events ENABLE TRIGGER USER")
                out.append(row)
        fills = {}
        if store_fill:
            await admin.execute(FILL_PROCEDURE)
            pid = admin.get_server_pid()
            for t, p in SHAPES:
                count += 1
                run = f"bench-{count}"
                await v1.execute("INSERT INTO runs (run_id, tenant_id) VALUES ($1, 'acme')", run)
                await v1.execute(BULK, run, t, p, rows)
                took = {True: [], False: []}
                for i in range(repeat + 1):
                    for fill in (False, True):
                        await admin.execute("DELETE FROM openwop_seat.events_v2_store WHERE run_id = $1", run)
                        start = cpu_ns(pid)
                        await admin.execute(f"CALL pg_temp.fill_rows('{run}', {int(rows)}, {fill})")
                        if i:
                            took[fill].append(cpu_ns(pid) - start)
                if not await admin.fetchval("SELECT count(*) = $2 FROM openwop_seat.events_v2_store WHERE run_id = $1",
                                            run, rows):
                    raise RuntimeError(f"the fill of {t} rows left rows out of the store")
                fills[t] = (min(took[True]) - min(took[False])) / rows / 1e3
        return names, out, fills
    finally:
        await admin.execute("ALTER TABLE events ENABLE TRIGGER USER")
        for conn in (admin, v1, v2):
            await conn.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.append_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=positive, default=500, help="appends per run (default 500)")
    parser.add_argument("--repeat", type=positive, default=10, help="rounds, the best of them kept (default 10)")
    parser.add_argument("--bulk", action="store_true", help="also one multi-row INSERT … SELECT of --rows rows")
    parser.add_argument("--store-fill", action="store_true",
                        help="also what filling each appended row into the v2 store would add, by stored type")
    args = parser.parse_args(argv)
    secret = os.environ.setdefault("OPENWOP_SEAT_CLAIM_SECRET", os.urandom(16).hex())
    cluster = DevCluster(settings={"shared_buffers": "256MB"}).start()
    try:
        cluster.psql(HOST_SCHEMA)
        dsn = cluster.dsn()
        host = {"dsn": dsn, "tenant_column": "tenant_id", "node_id_column": "node_id", "event_id_column": "event_id"}
        config = parse_config({"proxy": {"listen": "127.0.0.1:1", "upstream": f"127.0.0.1:{cluster.port}"},
                               "host": host})
        asyncio.run(migrate(dsn, config, load_artifacts(), out=lambda _line: None))
        names, results, fills = asyncio.run(measure(cluster.port, secret, args.rows, args.repeat, args.bulk,
                                                    args.store_fill))
    finally:
        cluster.stop()
    short = [n.removeprefix("zz_openwop_seat_") for n in names]
    print(f"the backend's CPU µs per appended row, best of {args.repeat} rounds of {args.rows} appends; "
          "'none' as measured, the others above it")
    print(f"{'statement':<7} {'writer':<11} {'none':>7} " + " ".join(f"{s:>13}" for s in short) + f" {'all':>7}")
    for r in results:
        print(f"{r['mode']:<7} {r['writer']:<11} {r['none']:>7.2f} "
              + " ".join(f"{'+' + format(r[n] - r['none'], '.2f'):>13}" for n in names)
              + f" {'+' + format(r['all'] - r['none'], '.2f'):>7}")
    if fills:
        print("\nfilling an appended era-2 row into the v2 store instead of unmarking its run, the backend's CPU µs "
              "per row: " + ", ".join(f"{t} +{us:.2f}" for t, us in fills.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
