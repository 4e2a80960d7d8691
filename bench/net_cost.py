"""The net's cost on the host's hot path (ADR 0019): the append and a page, through the seat, as a role the net holds.

``python -m bench.net_cost [--seconds N] [--rounds N]``: a throwaway cluster with the reference host's tables, owned
by the superuser and granted to PUBLIC (as the integration tests have them), migrated; 200 era-2 runs to append to
and 20 era-3 runs of 1,000 events to page; one seat (``workers = 1``, the session major 2). pgbench ``-M prepared``
as ``host_user`` (no ``BYPASSRLS``), 2 clients, 1 thread, alternating append and page rounds; prints the
transactions per second of each round and the median. Run it from a checkout to measure that checkout's seat (run
it from two checkouts for a before/after). Not part of ``make bench``; a developer probe, like ``probe.py``."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from proxy.dev.devcluster import DevCluster, free_port
from tests.harness import HOST_SCHEMA, ROOT, render_config, wait_listening

APPEND = ("\\set run random(1, 200)\n"
          "BEGIN;\n"
          "SELECT pg_advisory_xact_lock(hashtext('a' || :run), 1);\n"
          "WITH next AS (SELECT COALESCE(MAX(sequence), 0) + 1 AS seq FROM events WHERE run_id = 'a' || :run)\n"
          "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id)\n"
          "SELECT 'a' || :run || '.' || next.seq, 'a' || :run, next.seq, 'agent.invocation-completed', 'n', "
          "'{}'::jsonb, now(), NULL FROM next\n"
          "RETURNING event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id;\n"
          "COMMIT;\n")
PAGE = ("\\set run random(1, 20)\n"
        "SELECT * FROM events WHERE run_id = 'p' || :run AND sequence > 0 ORDER BY sequence LIMIT 100;\n")


def pgbench(bin_dir: str, port: int, script: Path, seconds: int) -> float:
    out = subprocess.run([os.path.join(bin_dir, "pgbench"), "-n", "-M", "prepared", "-c", "2", "-j", "1", "-T",
                          str(seconds), "-h", "127.0.0.1", "-p", str(port), "-U", "host_user", "-f", str(script),
                          "postgres"], capture_output=True, text=True)
    line = next((x for x in out.stdout.splitlines() if x.startswith("tps = ")), None)
    failed = next((x for x in out.stdout.splitlines() if x.startswith("number of failed")), "")
    if out.returncode or line is None or not failed.endswith(": 0 (0.000%)") and failed:
        raise SystemExit(f"pgbench failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return float(line.split()[2])


# --direct: the statements as the seat sends them, straight to PostgreSQL (no relay), before and after ADR 0019 in one
# cluster, alternating: the append through the table with the ctid arm in the policy and the wrapper translating
# above it, then through events_insert_m2; the page with net_view() replaced by a plain `true`, then as installed.
# These sessions are not claimed (a v1 writer: the v1 spelling is appended); the work per row is the same.
APPEND_BEFORE = (
    "\\set run random(1, 200)\n"
    "BEGIN;\n"
    "SELECT pg_advisory_xact_lock(hashtext('a' || :run), 1);\n"
    "WITH next AS (SELECT COALESCE(max(sequence), 0) + 1 AS seq FROM openwop_seat.events_keys AS events "
    "WHERE run_id = 'a' || :run AND openwop_seat.events_named('events')), openwop_seat_written AS ("
    "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id) "
    "SELECT 'a' || :run || '.' || next.seq, 'a' || :run, next.seq, 'agent.invocation.completed', 'n', '{}'::jsonb, "
    "now(), NULL FROM next RETURNING *) "
    "SELECT event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id FROM (SELECT "
    "openwop_seat_w.event_id, openwop_seat_w.run_id, openwop_seat_w.sequence, openwop_seat.type_m2(CAST("
    "openwop_seat_w.type AS text), openwop_seat_r.era, CAST(openwop_seat_w.run_id AS text), "
    "CAST(openwop_seat_w.sequence AS bigint)) AS type, openwop_seat_w.node_id, "
    "openwop_seat.payload_m2(CAST(openwop_seat_w.type AS text), "
    "CAST(openwop_seat_w.payload AS jsonb), openwop_seat_r.era, CAST(openwop_seat_w.run_id AS text), "
    "CAST(openwop_seat_w.sequence AS bigint), CAST(openwop_seat_w.event_id AS text), CAST(openwop_seat_w.node_id AS "
    "text)) AS payload, openwop_seat_w.timestamp, openwop_seat_w.causation_id FROM openwop_seat_written AS "
    "openwop_seat_w CROSS JOIN LATERAL (SELECT openwop_seat.era_now(CAST(openwop_seat_w.run_id AS text)) AS era) AS "
    "openwop_seat_r) AS events;\n"
    "COMMIT;\n")
APPEND_AFTER = (
    "\\set run random(1, 200)\n"
    "BEGIN;\n"
    "SELECT pg_advisory_xact_lock(hashtext('a' || :run), 1);\n"
    "WITH next AS (SELECT COALESCE(max(sequence), 0) + 1 AS seq FROM openwop_seat.events_keys AS events "
    "WHERE run_id = 'a' || :run AND openwop_seat.events_named('events')), openwop_seat_written AS ("
    "INSERT INTO openwop_seat.events_insert_m2 AS events (event_id, run_id, sequence, type, node_id, payload, "
    "timestamp, causation_id) "
    "SELECT 'a' || :run || '.' || next.seq, 'a' || :run, next.seq, 'agent.invocation.completed', 'n', '{}'::jsonb, "
    "now(), NULL FROM next RETURNING event_id, run_id, sequence, node_id, timestamp, causation_id, openwop_seat_type, "
    "openwop_seat_payload) "
    "SELECT event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id FROM (SELECT "
    "openwop_seat_w.event_id, openwop_seat_w.run_id, openwop_seat_w.sequence, openwop_seat_w.openwop_seat_type AS "
    "type, openwop_seat_w.node_id, openwop_seat_w.openwop_seat_payload AS payload, openwop_seat_w.timestamp, "
    "openwop_seat_w.causation_id FROM openwop_seat_written AS openwop_seat_w) AS events;\n"
    "COMMIT;\n")
PAGE_DIRECT = ("\\set run random(1, 20)\n"
               "SELECT * FROM openwop_seat.events_m2_run('p' || :run) AS events WHERE (run_id = 'p' || :run AND "
               "sequence > 0) AND openwop_seat.events_named('events') ORDER BY sequence LIMIT 100;\n")
CTID_POLICY = ("ALTER POLICY openwop_seat_net ON public.events USING (ctid OPERATOR(pg_catalog.=) "
               "'(4294967295,0)'::pg_catalog.tid OR (SELECT openwop_seat.net_read()))")
NET_POLICY = "ALTER POLICY openwop_seat_net ON public.events USING ((SELECT openwop_seat.net_read()))"
TRUE_GATE = ("CREATE OR REPLACE FUNCTION openwop_seat.net_view(major smallint) RETURNS boolean LANGUAGE plpgsql "
             "STABLE SET search_path = pg_catalog, pg_temp AS $f$ BEGIN RETURN true; END $f$")


def direct(pg: DevCluster, tmp: str, seconds: int, rounds: int) -> None:
    gate = pg.psql("SELECT pg_get_functiondef('openwop_seat.net_view(smallint)'::regprocedure)")
    runs = {"append before (table, ctid arm)": (APPEND_BEFORE, CTID_POLICY),
            "append after (events_insert_m2)": (APPEND_AFTER, NET_POLICY),
            "page, net_view() a plain true": (PAGE_DIRECT, TRUE_GATE),
            "page, net_view() as installed": (PAGE_DIRECT, gate)}
    got: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, (script, setup) in runs.items():
            path = Path(tmp) / "direct.sql"
            path.write_text(script)
            pg.psql(setup)
            got[name].append(pgbench(pg.bin, pg.port, path, seconds))
    pg.psql(NET_POLICY)
    pg.psql(gate)
    for name, tps in got.items():
        print(f"{name}: tps {' '.join(f'{t:.0f}' for t in tps)}; median {statistics.median(tps):.0f} "
              f"({1e6 / statistics.median(tps) * 2:.0f} µs per transaction per client)")


def explain(pg: DevCluster, repeat: int) -> None:
    """Execution time of one statement from EXPLAIN (ANALYZE), medians of ``repeat`` alternating runs, in one session
    as host_user: the page with net_view() as installed and as a plain true; one append each way (rolled back)."""
    import asyncio

    import asyncpg

    gate = pg.psql("SELECT pg_get_functiondef('openwop_seat.net_view(smallint)'::regprocedure)")
    page = PAGE_DIRECT.split("\n")[1].replace(":run", "7").rstrip(";")
    appends = {name: script.split("\n", 3)[3].rsplit("COMMIT;", 1)[0].strip().rstrip(";")
               for name, script in (("before", APPEND_BEFORE), ("after", APPEND_AFTER))}

    async def run() -> None:
        conn = await asyncpg.connect(host="127.0.0.1", port=pg.port, user="host_user", database="postgres")
        own = await asyncpg.connect(host="127.0.0.1", port=pg.port, user="postgres", database="postgres")

        async def timed(sql: str) -> tuple[float, float]:
            tr = conn.transaction()
            await tr.start()
            try:
                plan = await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON, TIMING OFF) {sql}")
            finally:
                await tr.rollback()
            import json
            doc = json.loads(plan)[0]
            return doc["Planning Time"], doc["Execution Time"]

        got: dict[str, list[tuple[float, float]]] = {}
        block = 25  # the function or policy replaced once per block (a replaced PL/pgSQL function is compiled again)
        for i in range(0, repeat, block):
            for name, setup, sql in (("page, net_view() a plain true", TRUE_GATE, page),
                                     ("page, net_view() as installed", gate, page),
                                     ("append before (table, ctid arm)", CTID_POLICY, appends["before"]),
                                     ("append after (events_insert_m2)", NET_POLICY, appends["after"])):
                await own.execute(setup)
                await timed(sql.replace(":run", "1"))  # warm: the session's cache of the replaced object
                for j in range(block):
                    got.setdefault(name, []).append(await timed(sql.replace(":run", str(1 + (i + j) % 200))))
        for name, runs in got.items():
            plan, execute = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            print(f"{name}: median planning {plan * 1000:.0f} µs, execution {execute * 1000:.0f} µs "
                  f"({len(runs)} runs)")
        await conn.close()
        await own.close()

    asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--direct", action="store_true",
                    help="the statements as the seat sends them, straight to PostgreSQL, before and after ADR 0019")
    ap.add_argument("--explain", type=int, default=0, metavar="N",
                    help="EXPLAIN (ANALYZE) timings of the page and the append, before and after, N alternating runs")
    args = ap.parse_args()
    env = {**os.environ, "OPENWOP_SEAT_CLAIM_SECRET": os.environ.get("OPENWOP_SEAT_CLAIM_SECRET", os.urandom(16).hex())}
    with DevCluster(hba=["local all all trust", "host all all 127.0.0.1/32 trust"]) as pg, \
            tempfile.TemporaryDirectory() as tmp:
        pg.psql("CREATE ROLE host_user LOGIN")
        pg.psql(HOST_SCHEMA + "GRANT ALL ON runs, events TO PUBLIC;")
        done = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", pg.dsn()], capture_output=True,
                              text=True, cwd=ROOT, env=env)
        if done.returncode:
            raise SystemExit(done.stderr)
        pg.psql("INSERT INTO runs (run_id, tenant_id) SELECT 'a' || i, 't' FROM generate_series(1, 200) i;"
                "INSERT INTO runs (run_id, tenant_id) SELECT 'p' || i, 't' FROM generate_series(1, 20) i;"
                "INSERT INTO events SELECT 'p' || r || '.' || s, 'p' || r, s, 'agent.invocation-completed', 'n', "
                "'{}'::jsonb, now(), NULL FROM generate_series(1, 20) r, generate_series(1, 1000) s;"
                "INSERT INTO openwop_seat.run_era (run_id, era, source) SELECT 'p' || i, 3, 'bench' "
                "FROM generate_series(1, 20) i; ANALYZE")
        if args.explain:
            explain(pg, args.explain)
            return
        if args.direct:
            direct(pg, tmp, args.seconds, args.rounds)
            return
        port = free_port()
        config = Path(tmp) / "seat.toml"
        config.write_text(render_config({"proxy": {"listen": f"127.0.0.1:{port}", "upstream": f"127.0.0.1:{pg.port}",
                                                   "workers": 1},
                                         "metrics": {"listen": f"127.0.0.1:{free_port()}"},
                                         "host": {"dsn": pg.dsn(), "check_interval": 3600}}))
        seat = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(config)], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=open(Path(tmp) / "seat.log", "wb"))
        try:
            wait_listening(port, seat)
            scripts = {"append": Path(tmp) / "append.sql", "page": Path(tmp) / "page.sql"}
            scripts["append"].write_text(APPEND)
            scripts["page"].write_text(PAGE)
            got: dict[str, list[float]] = {"append": [], "page": []}
            for _ in range(args.rounds):
                for name, script in scripts.items():
                    got[name].append(pgbench(pg.bin, port, script, args.seconds))
            for name, tps in got.items():
                print(f"{name}: tps {' '.join(f'{t:.0f}' for t in tps)}; median {statistics.median(tps):.0f} "
                      f"({1e6 / statistics.median(tps) * 2:.0f} µs per transaction per client)")
        finally:
            seat.terminate()
            seat.wait(15)


if __name__ == "__main__":
    main()
