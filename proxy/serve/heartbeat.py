"""A seat process's heartbeat: every HEARTBEAT_SECONDS (and at start) it tells the host database that it is
serving and which majors connected, per database user, since the last beat (``openwop_seat.seen``, layout
step 9). ``status`` and ``retire`` read it (docs/lifecycle.md).

The sessions only count (``Stats.majors_seen[(major, user)] += 1`` once a session's major is known): the write
is one statement on the process's catalog connection, off the sessions' path. Sessions still open at a beat
count as seen at that beat, so a v1 host's long-lived pool keeps its major's ``last_seen`` current.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections import Counter
from datetime import datetime, timezone

from proxy import __version__
from proxy.db.cutover import HEARTBEAT_SECONDS, HEARTBEAT_SQL

log = logging.getLogger("openwop_seat.server")


def seat_identity(config) -> str:
    """This process: host name, pid and listen address."""
    return f"{socket.gethostname()}/{os.getpid()}/{config.listen}"


def tally(server) -> list[list]:
    """[[major, user, new sessions]] since the last beat (taken from the counter), the open sessions at 0."""
    seen, server.stats.majors_seen = server.stats.majors_seen, Counter()
    out = {(str(m), u): n for (m, u), n in seen.items()}
    for s in list(server.sessions):
        if s.major is not None and not s.closed and server.on_host_database(s.params):
            out.setdefault((str(s.major), s.params.get("user", "")), 0)
    return [[m, u, n] for (m, u), n in sorted(out.items())]


async def beat_periodically(server) -> None:
    """Until cancelled: a beat now and every HEARTBEAT_SECONDS while the seat's rules are in force; when
    cancelled (the seat stops), a last beat that says so, within a second."""
    me = seat_identity(server.config)
    started = datetime.now(timezone.utc).isoformat()
    failing = False
    beaten = False

    async def beat(stopping: bool) -> None:
        rows = tally(server)
        try:
            await server.catalog.run(lambda conn: conn.execute(HEARTBEAT_SQL, me, started, __version__,
                                                               json.dumps(rows), stopping),
                                     timeout=1.0 if stopping else None)
        except BaseException:
            for m, u, n in rows:  # counted again at the next beat
                server.stats.majors_seen[(int(m) if m.isdigit() else m, u)] += n
            raise

    try:
        while True:
            ctx = server.read_context
            if ctx is not None and not ctx.first_boot:
                try:
                    await beat(False)
                    beaten, failing = True, False
                except Exception as e:
                    if not failing:
                        log.warning("could not write the seat's heartbeat (openwop_seat.seen): %s", e)
                    failing = True
            await asyncio.sleep(HEARTBEAT_SECONDS)
    except asyncio.CancelledError:
        if beaten:
            try:
                await beat(True)
            except BaseException as e:  # the database is gone or slow: the beat ages out instead
                log.warning("could not write the seat's last heartbeat: %s", e)
        raise
