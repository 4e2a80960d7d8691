"""asyncpg through the seat: binary formats, named statements, COPY, listeners, cancel, locks."""

from __future__ import annotations

import asyncio
import hashlib
import io
import time

import asyncpg
import pytest

from harness import PASSWORD


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("user, password", [("host_user", None), ("md5_user", PASSWORD), ("scram_user", PASSWORD)])
def test_auth_methods(seat, user, password):
    async def go():
        conn = await asyncpg.connect(seat.url(user, password=password))
        try:
            return await conn.fetchval("SELECT current_user")
        finally:
            await conn.close()

    assert run(go()) == user


def test_binary_results_identical_to_direct(seat, pg):
    sql = """SELECT g, g::float8 / 3, md5(g::text), jsonb_build_object('g', g, 'a', ARRAY[g, g+1]),
                    now() - make_interval(secs => g), g % 2 = 0, decode(md5(g::text), 'hex')
             FROM generate_series(1, 1000) g WHERE g > $1"""

    async def fetch(url):
        conn = await asyncpg.connect(url)
        try:
            rows = await conn.fetch(sql, 5)
            return [tuple(r) for r in rows]
        finally:
            await conn.close()

    async def go():
        return await fetch(seat.url()), await fetch(f"postgresql://postgres@127.0.0.1:{pg.port}/postgres")

    via, direct = run(go())
    assert len(via) == 995
    # now() differs between the two sessions; compare every other column exactly
    strip = lambda rows: [r[:4] + r[5:] for r in rows]  # noqa: E731
    assert strip(via) == strip(direct)


def test_prepared_statement_reused_and_executemany(seat, fresh_table):
    table = fresh_table("id int primary key, v jsonb")

    async def go():
        conn = await asyncpg.connect(seat.url())
        try:
            stmt = await conn.prepare("SELECT $1::int + $2::int")
            results = [await stmt.fetchval(i, 1) for i in range(500)]
            await conn.executemany(f"INSERT INTO {table} VALUES ($1, $2)",
                                   [(i, f'{{"i": {i}}}') for i in range(1000)])
            count = await conn.fetchval(f"SELECT count(*) FROM {table}")
            return results, count
        finally:
            await conn.close()

    results, count = run(go())
    assert results == [i + 1 for i in range(500)] and count == 1000


def test_copy_out_and_in_100k_rows(seat, pg, fresh_table):
    table = fresh_table("id int, label text")
    sql = "SELECT g, md5(g::text) FROM generate_series(1, 100000) g"

    async def copy_out(url):
        conn = await asyncpg.connect(url)
        try:
            buf = io.BytesIO()
            await conn.copy_from_query(sql, output=buf)
            return buf.getvalue()
        finally:
            await conn.close()

    async def go():
        via = await copy_out(seat.url())
        direct = await copy_out(f"postgresql://postgres@127.0.0.1:{pg.port}/postgres")
        conn = await asyncpg.connect(seat.url())
        try:
            await conn.copy_to_table(table, source=io.BytesIO(via))
            back = io.BytesIO()
            await conn.copy_from_query(f"SELECT * FROM {table} ORDER BY id", output=back)
        finally:
            await conn.close()
        return via, direct, back.getvalue()

    via, direct, back = run(go())
    assert hashlib.sha256(via).digest() == hashlib.sha256(direct).digest()
    assert via.count(b"\n") == 100_000 and back == via


def test_listen_notify(seat):
    async def go():
        listener = await asyncpg.connect(seat.url())
        sender = await asyncpg.connect(seat.url())
        got: asyncio.Queue = asyncio.Queue()
        try:
            await listener.add_listener("jobs", lambda c, pid, ch, payload: got.put_nowait((ch, payload)))
            for i in range(3):
                await sender.execute(f"NOTIFY jobs, 'n{i}'")
            return [await asyncio.wait_for(got.get(), 5) for _ in range(3)]
        finally:
            await listener.close()
            await sender.close()

    assert run(go()) == [("jobs", "n0"), ("jobs", "n1"), ("jobs", "n2")]


def test_cancel_by_timeout(seat):
    async def go():
        conn = await asyncpg.connect(seat.url())
        try:
            started = time.monotonic()
            with pytest.raises(asyncio.TimeoutError):
                await conn.fetchval("SELECT pg_sleep(30)", timeout=0.3)  # asyncpg sends a CancelRequest
            elapsed = time.monotonic() - started
            return elapsed, await conn.fetchval("SELECT 'still usable'")
        finally:
            await conn.close()

    elapsed, after = run(go())
    assert after == "still usable" and elapsed < 2


def test_cancel_reaches_the_right_backend(seat, pg):
    """The CancelRequest is forwarded unchanged, so it cancels exactly the query it names."""
    async def go():
        a = await asyncpg.connect(seat.url())
        b = await asyncpg.connect(seat.url())
        try:
            slow_b = asyncio.ensure_future(b.fetchval("SELECT pg_sleep(1.5)::text || 'done'"))
            with pytest.raises(asyncio.TimeoutError):
                await a.fetchval("SELECT pg_sleep(30)", timeout=0.3)
            return await slow_b
        finally:
            await a.close()
            await b.close()

    assert run(go()) == "done"


def test_advisory_xact_lock_and_transaction(seat, fresh_table):
    table = fresh_table("id int")

    async def go():
        conn = await asyncpg.connect(seat.url())
        other = await asyncpg.connect(seat.url())
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext('run-1'), 1)")
                await conn.execute(f"INSERT INTO {table} VALUES (1)")
                locked = await other.fetchval("SELECT pg_try_advisory_xact_lock(hashtext('run-1'), 1)")
            freed = await other.fetchval("SELECT pg_try_advisory_xact_lock(hashtext('run-1'), 1)")
            return locked, freed, await other.fetchval(f"SELECT count(*) FROM {table}")
        finally:
            await conn.close()
            await other.close()

    assert run(go()) == (False, True, 1)


def test_many_concurrent_sessions(seat):
    async def one(i):
        conn = await asyncpg.connect(seat.url())
        try:
            return await conn.fetchval("SELECT $1::int * 2", i)
        finally:
            await conn.close()

    async def go():
        return await asyncio.gather(*(one(i) for i in range(60)))

    assert run(go()) == [i * 2 for i in range(60)]
