"""What a major-2 page costs PostgreSQL: backend CPU per page, direct against the seat's statement and its parts.

    .venv/bin/python -m bench.page_backend_cost [--pages 1000] [--rounds 3] [--guard] [--sketches]

Starts a throwaway cluster loaded as ``make bench`` loads it (``bench.seed``: the page runs, era-3 runs,
projection runs and host-mix runs, the era-2 ones filled into the v2 store), then, in fresh sessions, runs the
host's page statement (``SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT 100``)
``--pages`` times over each class's runs, as a named prepared statement (as the seat sends it: plan once per
session; each form's generic plan, forced: left to choose, PostgreSQL keeps custom plans for some arms alone),
in these forms:

* ``direct``: the statement as the host sends it, on the host's table;
* ``seat``: the statement as the seat's classifier rewrites it for a major-2 session on a database with the v2
  store (the page form: the store's arm and the live arm, each in index order, ADR 0015);
* ``twin``: its fast twin, what the seat sends first (ADR 0024): the page of ``events_m2_run_era3(run)``, an era-3
  run's rows as stored, else none (an era-2 run's figure is that empty answer's cost, which the seat pays once a
  minute a run);
* ``store``: the same page of ``openwop_seat.events_v2_store`` itself (the floor of a filled run's page);
* ``filled``: the page of ``events_v2_filled``, the store's arm (the store joined to its marks, and the gates);
* ``live``: the page of ``events_m2_run_live(run)``, the live arm (empty for a filled run);
* with ``--guard``, the seat's statement with its search_path guard as the PL/pgSQL check it was before ADR 0021
  (``events_named_refuse``) and with no guard (decision 1's figures);
* with ``--sketches``, a fast page the seat does not send (ADR 0021, finding 3), made in the probe's cluster only:
  ``fast: store`` (the store's arm, only for a run marked with no row above its mark), ``fast: store, wrapped``
  (the same arm, described as the seat's statement is: a UNION ALL with an empty arm, and the guard; the probe
  checks that the two RowDescriptions are the same before it measures; ADR 0021's second addendum), ``fast:
  store, function`` (the arm behind an SQL function, which describes alike too: ADR 0023), ``fast: era
  3`` (an era-3 run's rows as stored, through a gated view of the runs stamped era 3; ``, wrapped`` as the store's
  arm is), ``fast: both`` (their
  union), ``fast: function`` (one PL/pgSQL function that asks which arm holds the run's page and returns its
  rows), each fast arm ``+ miss row`` (one row naming the run's class where the arm's gate is false) and ``whole:
  … + fallback`` (the arm, and the seat's statement through a PL/pgSQL function where the arm's gate is false: a
  statement right for every run, which a hint could choose).

The figure is the backend's CPU time (``/proc/<pid>/schedstat`` of the session's backend, Linux) per page, the
median over ``--rounds`` interleaved rounds: PostgreSQL's own cost of each form, not skewed by what else runs on
the machine, and what a page through the seat adds to the database beside the seat's own CPU (``make bench``
prints that). Nothing here asserts a figure; docs/performance.md quotes a run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys

import psycopg

from proxy.config import HostConfig
from proxy.readpath.classify import Classifier

from . import seed, stack
from .args import positive

CLASSES = {"era 3": seed.ERA3_RUNS, "clean era 2": seed.PAGE_RUNS, "projection": seed.PROJECTION_RUNS,
           "host mix": seed.HOST_MIX_RUNS}


# --sketches (ADR 0021, finding 3): a "fast page" the seat does not send, made in this probe's throwaway cluster
# only. An arm of the store's rows of a run marked with no row above its mark (the check through the gated views
# events_v2_marked and events_keys), and an arm of an era-3 run's rows as stored (a gated view of the rows of
# runs stamped era 3): neither holds the live translation, so neither pays its initialization; a page that both
# leave empty would be read again with the seat's statement.
SKETCH_ERA3 = """
CREATE SCHEMA IF NOT EXISTS sketch;
CREATE OR REPLACE VIEW sketch.events_era3 AS
SELECT e.* FROM public.events e
WHERE EXISTS (SELECT FROM openwop_seat.run_era x WHERE x.run_id OPERATOR(pg_catalog.=) e.run_id)
  AND (SELECT pg_catalog.has_table_privilege('"public"."events"'::regclass, 'SELECT'))
  AND (SELECT CASE WHEN EXISTS (SELECT FROM openwop_seat.claims n WHERE n.pid OPERATOR(pg_catalog.=)
       pg_catalog.pg_backend_pid() AND n.major OPERATOR(pg_catalog.=) 1::pg_catalog.int2)
       THEN openwop_seat.net_view(2::pg_catalog.int2) ELSE true END);
"""
# The fast page inside PostgreSQL (not built): one statement, a PL/pgSQL function that asks which arm holds the run's
# page (era 3, filled, else both) and returns that arm's rows; STABLE, so its queries see the statement's snapshot.
# No round trip and no change to the protocol, but a PL/pgSQL call, its RETURN QUERY's tuplestore and the decision's
# two queries a page.
SKETCH_PAGE_FUNCTION = """
CREATE OR REPLACE VIEW sketch.era3_runs AS
SELECT x.run_id FROM openwop_seat.run_era x
WHERE (SELECT pg_catalog.has_table_privilege('"public"."events"'::regclass, 'SELECT'))
  AND (SELECT CASE WHEN EXISTS (SELECT FROM openwop_seat.claims n WHERE n.pid OPERATOR(pg_catalog.=)
       pg_catalog.pg_backend_pid() AND n.major OPERATOR(pg_catalog.=) 1::pg_catalog.int2)
       THEN openwop_seat.net_view(2::pg_catalog.int2) ELSE true END);
CREATE OR REPLACE FUNCTION sketch.page_m2(run text, after int4, n int8) RETURNS SETOF openwop_seat.events_m2
LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF EXISTS (SELECT FROM sketch.era3_runs r WHERE r.run_id = run) THEN
    RETURN QUERY SELECT e.* FROM sketch.events_era3 e WHERE e.run_id = run AND e.sequence > after
      ORDER BY e.sequence LIMIT n;
  ELSIF EXISTS (SELECT FROM openwop_seat.events_v2_marked m WHERE m.run_id = run AND NOT EXISTS
                (SELECT FROM openwop_seat.events_keys k WHERE k.run_id = run AND k.sequence > m.upto)) THEN
    RETURN QUERY SELECT e.* FROM openwop_seat.events_v2_filled e WHERE e.run_id = run AND e.sequence > after
      ORDER BY e.sequence LIMIT n;
  ELSE
    RETURN QUERY SELECT * FROM ((SELECT * FROM openwop_seat.events_v2_filled e WHERE e.run_id = run
        AND e.sequence > after ORDER BY e.sequence LIMIT n) UNION ALL (SELECT * FROM
        openwop_seat.events_m2_run_live(run) e WHERE e.run_id = run AND e.sequence > after
        ORDER BY e.sequence LIMIT n)) u ORDER BY sequence LIMIT n;
  END IF;
END $$;
"""
# The fallback of a hinted fast page (ADR 0021's addendum): the seat's own statement as a PL/pgSQL function, so that
# a statement naming it under a one-time filter initializes one FunctionScan node, not the statement's arms, and
# calls it only where the fast arm's gate is false.
SKETCH_FALLBACK = """
CREATE OR REPLACE FUNCTION sketch.page_fallback(run text, after int4, n int8) RETURNS SETOF openwop_seat.events_m2
LANGUAGE plpgsql STABLE AS $$
BEGIN
  RETURN QUERY SELECT * FROM ((SELECT * FROM openwop_seat.events_v2_filled e WHERE e.run_id = run
      AND e.sequence > after ORDER BY e.sequence LIMIT n) UNION ALL (SELECT * FROM
      openwop_seat.events_m2_run_live(run) e WHERE e.run_id = run AND e.sequence > after
      ORDER BY e.sequence LIMIT n)) u ORDER BY sequence LIMIT n;
END $$;
"""
_COVERED = ("(SELECT EXISTS (SELECT FROM openwop_seat.events_v2_marked m WHERE m.run_id = $1 AND NOT EXISTS "
            "(SELECT FROM openwop_seat.events_keys k WHERE k.run_id = $1 AND k.sequence > m.upto)))")
_STORE_ARM = ("SELECT * FROM openwop_seat.events_v2_filled AS events WHERE run_id = $1 AND sequence > $2 AND "
              f"{_COVERED} ORDER BY sequence LIMIT 100")
_ERA3_ARM = "SELECT * FROM sketch.events_era3 AS events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT 100"
# A fast arm that says when it does not hold the run's page (a sketch for ADR 0021's fast page with its fallback):
# one row of NULLs but for ``type``, which names the run's class, where the arm's own gate is false. A run's row has
# a run_id, so the seat could tell that row from a page at its first DataRow, send the page again with the seat's
# statement (or the arm the class names), and keep the class as the run's hint. An empty page of a run of the arm's
# class is then an answer, not a miss (a live run's tail, polled).
_MISS_ROW = ("SELECT NULL::text, NULL::text, NULL::int4, {cls}, NULL::text, NULL::jsonb, NULL::timestamptz, "
             "NULL::text WHERE NOT {gate}")
_ERA3_GATE = "EXISTS (SELECT FROM sketch.era3_runs r WHERE r.run_id = $1)"
_CLASS = f"CASE WHEN {_COVERED} THEN 'filled' ELSE 'live' END"


# The store's arm behind an SQL function (ADR 0023, built once and taken out): PostgreSQL marks a column's origin at
# parse analysis from relations only, and inlines the function's body after, so the arm runs as the bare arm and
# describes as the seat's statement does. Its condition is the live arm's emptiness, read through events_m2_live.
SKETCH_COVERED = """
CREATE OR REPLACE FUNCTION sketch.store_covered(run text) RETURNS SETOF openwop_seat.events_m2 LANGUAGE sql STABLE
AS $$
SELECT f.* FROM openwop_seat.events_v2_filled f WHERE f.run_id OPERATOR(pg_catalog.=) $1
  AND (SELECT EXISTS (SELECT FROM openwop_seat.events_v2_marked m WHERE m.run_id OPERATOR(pg_catalog.=) $1
       AND NOT EXISTS (SELECT FROM openwop_seat.events_m2_live l WHERE l.run_id OPERATOR(pg_catalog.=) $1
                       AND l.sequence OPERATOR(pg_catalog.>) m.upto)))
$$;
"""
# The store's arm as the seat would have to send it (ADR 0021's second addendum): its RowDescription the same bytes as
# the seat's statement's. The bare arm's names the store's table (its OID and column numbers) where the seat's names
# none; a UNION ALL with an empty arm of the same column types, and the search_path guard, make them the same.
_EMPTY_ARM = ("SELECT NULL::text, NULL::text, NULL::int4, NULL::text, NULL::text, NULL::jsonb, NULL::timestamptz, "
              "NULL::text WHERE false")


def _with_miss_row(arm: str, gate: str, cls: str) -> str:
    return (f"SELECT * FROM (({arm}) UNION ALL ({_MISS_ROW.format(cls=cls, gate=gate)})) AS events "
            "WHERE (SELECT openwop_seat.events_named('events')) ORDER BY sequence LIMIT 100")


def _with_fallback(arm: str, gate: str) -> str:
    """A fast arm whose statement is whole: where the arm's gate is false, the seat's statement's rows, through the
    fallback function (the seat would choose this statement by a hint of the run's class; a wrong hint costs time,
    never a wrong row)."""
    return (f"SELECT * FROM (({arm}) UNION ALL (SELECT * FROM sketch.page_fallback($1, $2, 100) WHERE NOT {gate})) "
            "AS events WHERE (SELECT openwop_seat.events_named('events')) ORDER BY sequence LIMIT 100")


SKETCHES = {
    "fast: store": _STORE_ARM,
    "fast: store, wrapped": f"SELECT * FROM (({_STORE_ARM}) UNION ALL ({_EMPTY_ARM})) AS events "
                            "WHERE (SELECT openwop_seat.events_named('events')) ORDER BY sequence LIMIT 100",
    "fast: store, function": "SELECT * FROM sketch.store_covered($1) AS events WHERE run_id = $1 AND sequence > $2 "
                             "AND (SELECT openwop_seat.events_named('events')) ORDER BY sequence LIMIT 100",
    "fast: era 3": _ERA3_ARM,
    "fast: era 3, wrapped": f"SELECT * FROM (({_ERA3_ARM}) UNION ALL ({_EMPTY_ARM})) AS events "
                            "WHERE (SELECT openwop_seat.events_named('events')) ORDER BY sequence LIMIT 100",
    "fast: both": f"SELECT * FROM (({_STORE_ARM}) UNION ALL ({_ERA3_ARM})) AS events "
                  "WHERE (SELECT openwop_seat.events_named('events')) ORDER BY sequence LIMIT 100",
    "fast: function": "SELECT * FROM sketch.page_m2($1, $2, 100) AS events "
                      "WHERE (SELECT openwop_seat.events_named('events')) ORDER BY sequence LIMIT 100",
    "fast: era 3 + miss row": _with_miss_row(_ERA3_ARM, _ERA3_GATE, _CLASS),
    "fast: store + miss row": _with_miss_row(_STORE_ARM, _COVERED,
                                             f"CASE WHEN {_ERA3_GATE} THEN 'era 3' ELSE 'live' END"),
    "whole: era 3 + fallback": _with_fallback(_ERA3_ARM, _ERA3_GATE),
    "whole: store + fallback": _with_fallback(_STORE_ARM, _COVERED),
}


def guard_forms() -> dict[str, str]:
    """--guard (ADR 0021 decision 1): the seat's page statement with its search_path guard as PL/pgSQL (the check it
    was before, kept as ``events_named_refuse``), and without any guard; ``seat`` is the guard as installed, inlined."""
    seat = forms()["seat"]
    guard = " WHERE (SELECT openwop_seat.events_named('events'))"
    assert guard in seat
    return {"seat, guard in PL/pgSQL": seat.replace("openwop_seat.events_named(", "openwop_seat.events_named_refuse("),
            "seat, no guard": seat.replace(guard, "")}


def forms() -> dict[str, str]:
    plan = Classifier(HostConfig(), 2, run_function=True, page_function=True, fast_page=True).classify(seed.PAGE_SQL)
    page = " WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT 100"
    return {"direct": seed.PAGE_SQL, "seat": plan.text, "twin": plan.fast,
            "store": "SELECT * FROM openwop_seat.events_v2_store" + page,
            "filled": "SELECT * FROM openwop_seat.events_v2_filled" + page,
            "live": "SELECT * FROM openwop_seat.events_m2_run_live($1) AS events" + page}


def per_page_us(dsn: str, sql: str, runs: range, pages: int) -> float:
    """Backend CPU µs per page of ``sql`` (its ``$1`` the run, ``$2`` the sequence after), prepared once."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pg = conn.pgconn
        # The generic plan for every form, as a long session runs the seat's statement (PostgreSQL's own choice
        # for it). Left to choose, PostgreSQL keeps custom plans for an arm alone (a run absent from the store is
        # cheaper planned for its key), and the figure would hold a planning per page.
        pg.exec_(b"SET plan_cache_mode = force_generic_plan")
        pg.prepare(b"page", sql.encode(), [25, 23])  # text run id, int4 sequence: as the host binds them
        keys = [str(r).encode() for r in runs]
        for i in range(20):
            pg.exec_prepared(b"page", [keys[i % len(keys)], b"0"])
        before = stack.backend_cpu_ns(pg.backend_pid)
        for i in range(pages):
            result = pg.exec_prepared(b"page", [keys[i % len(keys)], b"0"])
            if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
                raise RuntimeError(f"{sql!r}: {result.error_message.decode(errors='replace')}")
        return (stack.backend_cpu_ns(pg.backend_pid) - before) / pages / 1000


def row_description(dsn: str, sql: str) -> list[tuple]:
    """Each column of ``sql``'s RowDescription as a client reads it: name, table OID, column number, type, modifier,
    size."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pg = conn.pgconn
        pg.prepare(b"", sql.encode(), [25, 23])
        r = pg.describe_prepared(b"")
        return [(r.fname(i), r.ftable(i), r.ftablecol(i), r.ftype(i), r.fmod(i), r.fsize(i)) for i in range(r.nfields)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.page_backend_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=positive, default=1000, help="pages per figure (default 1000)")
    parser.add_argument("--rounds", type=positive, default=3, help="interleaved rounds, median kept (default 3)")
    parser.add_argument("--sketches", action="store_true", help="add the fast page's sketches (ADR 0021)")
    parser.add_argument("--guard", action="store_true", help="add the page with its guard in PL/pgSQL and with none")
    args = parser.parse_args(argv)
    shapes = {**forms(), **(guard_forms() if args.guard else {}), **(SKETCHES if args.sketches else {})}
    os.environ.setdefault("OPENWOP_SEAT_CLAIM_SECRET", os.urandom(16).hex())
    cluster = stack.start_cluster(10)
    try:
        pgbench = os.path.join(cluster.bin, "pgbench")
        seed.load(cluster, pgbench if os.path.exists(pgbench) else shutil.which("pgbench") or pgbench, 1)
        dsn = cluster.dsn()
        if args.sketches:
            cluster.psql(SKETCH_ERA3)
            cluster.psql(SKETCH_PAGE_FUNCTION)
            cluster.psql(SKETCH_FALLBACK)
            cluster.psql(SKETCH_COVERED)
        # what the seat sends in its statement's place, and the sketches that stand for it, must describe alike
        seat = row_description(dsn, shapes["seat"])
        described = ("twin", "fast: store, wrapped", "fast: store, function", "fast: era 3, wrapped")
        for name in described if args.sketches else described[:1]:
            if row_description(dsn, shapes[name]) != seat:
                raise SystemExit(f"{name!r} is not described as the seat's statement is")
        figures: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for cls, runs in CLASSES.items():
                for name, sql in shapes.items():
                    figures.setdefault((cls, name), []).append(per_page_us(dsn, sql, runs, args.pages))
    finally:
        cluster.stop()
    names = list(shapes)
    print(f"backend CPU µs per 100-row page, median of {args.rounds} rounds of {args.pages} pages (generic plans)")
    widths = [max(9, len(n) + 2) for n in names]
    print(f"{'runs':<12}" + "".join(f"{n:>{w}}" for n, w in zip(names, widths)) + f"{'seat-direct':>13}")
    for cls in CLASSES:
        row = [statistics.median(figures[cls, n]) for n in names]
        print(f"{cls:<12}" + "".join(f"{v:>{w}.1f}" for v, w in zip(row, widths)) + f"{row[1] - row[0]:>13.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
