"""`make bench`: the seat side by side with direct PostgreSQL and PgBouncer (issues #6, #15).

``python -m bench`` starts a throwaway PostgreSQL tuned for a benchmark, a PgBouncer
of its own in session mode and the seat (one worker), all on loopback, and measures
the workloads in :mod:`bench.workloads` against the three targets in alternating
rounds.  :mod:`bench.report` holds the goals, prints the table and writes the JSON.

Modules:

* ``__main__``  the command line and the order of the rounds;
* ``stack``     the processes: cluster, PgBouncer (installed if missing), seat; the
                floor (``bare_relay``, a bare uvloop relay) and a seat of raw sessions
                beside it; the machine's description;
* ``seed``      the host's tables and the benchmark's data: pgbench tables, event
                pages of era-2 runs (payloads-clean, renamed types), of era-3 runs
                and of era-2 runs needing payload projection, runs to append into;
                the checks that the seat reads each of them as the workloads assume;
* ``workloads`` one measurement each: pgbench, the asyncpg page loop, latency
                percentiles from pgbench's per-transaction logs, idle-connection RSS;
* ``report``    goals, medians and ratios, the printed table, the results file.

``bench/probe.py`` and ``bench/projection.py`` are quick developer probes, not part
of ``make bench``.
"""
