"""The v2 store's background fill (ADR 0015): era-2 runs written into ``openwop_seat.events_v2_store``.

Every ``[host] store_fill_interval`` seconds a seat process asks the database for up to :data:`BATCH` runs to
fill (``store_pending``: era-2 runs not filled yet, then filled runs with rows appended above their mark, least
recently filled first) and fills them one by one (``store_fill``: one short READ COMMITTED transaction per run,
on the process's catalog connection, so the seat's own catalog checks run between two runs): a run not filled
is filled whole ("filled"), a filled run gets only its rows above the mark ("extended", ADR 0015 addendum). A
run whose lock an append holds is skipped this time ("busy"). The
store only makes reads cheaper: a run not filled is read through the translation computed at read time, so a
fill that fails or falls behind never changes what a reader gets.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.serve.context import CatalogConnection
    from proxy.stats import Stats

log = logging.getLogger("openwop_seat.store")

BATCH = 200  # runs asked for per pass


async def _fill(conn, run: str) -> str:
    # store_fill runs in READ COMMITTED only (its reads must see every write committed before it took the run's
    # lock): said explicitly, whatever default_transaction_isolation the role or database sets
    async with conn.transaction(isolation="read_committed"):
        return await conn.fetchval("SELECT openwop_seat.store_fill($1)", run)


async def fill_pass(catalog: CatalogConnection, stats: Stats, batch: int = BATCH) -> int:
    """One pass: the runs pending now, each filled in its own transaction; the number filled whole (a backlog of
    runs not filled yet is what makes the next pass follow at once; tails wait for the next interval)."""
    runs = await catalog.run(lambda conn: conn.fetch("SELECT openwop_seat.store_pending($1) AS run", batch))
    filled = 0
    for row in runs:
        run = row["run"]
        outcome = await catalog.run(lambda conn: _fill(conn, run))
        if outcome == "filled":
            filled += 1
            stats.store_runs_filled += 1
        elif outcome == "extended":
            stats.store_runs_extended += 1
        elif outcome == "busy":
            stats.store_runs_busy += 1
    return filled


async def fill_forever(catalog: CatalogConnection, stats: Stats, interval) -> None:
    """Passes every ``interval()`` seconds; a failure is logged once until a pass succeeds again."""
    failing = ""
    while True:
        await asyncio.sleep(interval())
        if interval() <= 0:
            continue
        try:
            while await fill_pass(catalog, stats) >= BATCH:  # a backlog: the next batch at once
                pass
            if failing:
                log.info("the v2 store fill works again")
            failing = ""
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the database refused or went away: reads are unaffected, try again later
            stats.store_fill_errors += 1
            message = f"{type(e).__name__}: {e}"
            if message != failing:
                log.warning("the v2 store fill failed (reads are translated at read time meanwhile): %s", message)
            failing = message
