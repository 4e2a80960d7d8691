"""psycopg 3 through the seat: auth, both protocols, prepared statements, pipelines, COPY, notify, cancel."""

from __future__ import annotations

import hashlib
import threading
import time

import psycopg
import pytest
from psycopg import errors

from harness import PASSWORD


@pytest.mark.parametrize("user, password", [("host_user", None), ("md5_user", PASSWORD), ("scram_user", PASSWORD)])
def test_auth_methods(seat, user, password):
    kwargs = {"password": password} if password else {}
    with psycopg.connect(seat.dsn(user=user), **kwargs) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (user,)


def test_wrong_password_is_relayed_as_the_servers_error(seat):
    with pytest.raises(psycopg.OperationalError) as e:
        psycopg.connect(seat.dsn(user="scram_user"), password="wrong")
    assert "password authentication failed" in str(e.value)


def test_simple_and_extended_queries_match_direct(seat, pg):
    sql = "SELECT g, g * 2.5, md5(g::text), now() IS NOT NULL FROM generate_series(1, 500) g WHERE g > %s"
    with psycopg.connect(seat.dsn()) as via, psycopg.connect(pg.dsn()) as direct:
        for binary in (False, True):
            a = via.cursor(binary=binary).execute(sql, (10,)).fetchall()
            b = direct.cursor(binary=binary).execute(sql, (10,)).fetchall()
            assert a == b and len(a) == 490
        # Simple protocol: a multi-statement string, the last result is returned.
        cur = via.cursor()
        cur.execute("SELECT 1; SELECT 2 AS two; SELECT 'three'", prepare=False)
        results = [cur.fetchall()]
        while cur.nextset():
            results.append(cur.fetchall())
        assert results == [[(1,)], [(2,)], [("three",)]]


def test_named_prepared_statement_reused_many_times(seat):
    with psycopg.connect(seat.dsn(), prepare_threshold=0) as conn:
        for i in range(300):
            assert conn.execute("SELECT %s::int * 3", (i,)).fetchone() == (i * 3,)
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0]
        assert prepared >= 1


def test_pipeline_of_100_statements_before_one_sync(seat, fresh_table):
    table = fresh_table("id int primary key, v text")
    with psycopg.connect(seat.dsn()) as conn:
        with conn.pipeline() as p:
            cursors = [conn.execute(f"INSERT INTO {table} VALUES (%s, %s) RETURNING id", (i, f"v{i}"))
                       for i in range(100)]
            p.sync()
            assert [c.fetchone()[0] for c in cursors] == list(range(100))
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (100,)


def test_error_in_the_middle_of_a_pipeline(seat, pg, fresh_table):
    def run(dsn, table):
        with psycopg.connect(dsn, autocommit=True) as conn:
            with pytest.raises(errors.UniqueViolation):
                with conn.pipeline() as p:
                    conn.execute(f"INSERT INTO {table} VALUES (1)")
                    p.sync()  # committed on its own
                    conn.execute(f"INSERT INTO {table} VALUES (2)")
                    conn.execute(f"INSERT INTO {table} VALUES (2)")  # fails: the batch up to Sync is undone
                    conn.execute(f"INSERT INTO {table} VALUES (3)")  # skipped until Sync
            after = conn.execute(f"SELECT array_agg(id ORDER BY id) FROM {table}").fetchone()
            assert conn.execute("SELECT 'usable'").fetchone() == ("usable",)
            return after

    via = run(seat.dsn(), fresh_table("id int primary key"))
    assert via == ([1],)
    assert via == run(pg.dsn(), fresh_table("id int primary key"))


def test_copy_to_stdout_100k_rows_is_byte_identical(seat, pg):
    sql = "COPY (SELECT g, md5(g::text), g % 7 = 0 FROM generate_series(1, 100000) g) TO STDOUT"

    def digest(dsn):
        h, n = hashlib.sha256(), 0
        with psycopg.connect(dsn) as conn, conn.cursor().copy(sql) as copy:
            for block in copy:
                h.update(block)
                n += len(block)
        return h.hexdigest(), n

    via, direct = digest(seat.dsn()), digest(pg.dsn())
    assert via == direct and via[1] > 4_000_000


def test_copy_from_stdin_100k_rows(seat, pg, fresh_table):
    table = fresh_table("id int, label text")
    payload = "".join(f"{i}\tlabel-{i}\n" for i in range(100_000)).encode()
    with psycopg.connect(seat.dsn()) as conn:
        with conn.cursor().copy(f"COPY {table} FROM STDIN") as copy:
            for i in range(0, len(payload), 50_000):
                copy.write(payload[i:i + 50_000])
    with psycopg.connect(pg.dsn()) as direct:
        with direct.cursor().copy(f"COPY (SELECT * FROM {table} ORDER BY id) TO STDOUT") as copy:
            out = b"".join(bytes(block) for block in copy)
    assert out == payload


def test_copy_fail_from_client_keeps_session(seat, fresh_table):
    table = fresh_table("id int")
    with psycopg.connect(seat.dsn(), autocommit=True) as conn:
        with pytest.raises(RuntimeError):  # psycopg sends CopyFail and re-raises
            with conn.cursor().copy(f"COPY {table} FROM STDIN") as copy:
                copy.write(b"1\n")
                raise RuntimeError("client aborts the copy")
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


def test_notice_and_parameter_status(seat):
    notices = []
    with psycopg.connect(seat.dsn(), autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        conn.execute("DO $$ BEGIN RAISE NOTICE 'hello from %', 'plpgsql'; END $$")
        conn.execute("SET application_name = 'renamed-app'")
        assert conn.info.parameter_status("application_name") == "renamed-app"
    assert notices == ["hello from plpgsql"]


def test_listen_notify_between_two_clients(seat):
    with psycopg.connect(seat.dsn(), autocommit=True) as listener, \
            psycopg.connect(seat.dsn(), autocommit=True) as sender:
        listener.execute("LISTEN seat_channel")
        sender.execute("SELECT pg_notify('seat_channel', 'payload-1')")
        sender.execute("NOTIFY seat_channel, 'payload-2'")
        got = []
        for n in listener.notifies(timeout=5, stop_after=2):
            got.append((n.channel, n.payload))
        assert got == [("seat_channel", "payload-1"), ("seat_channel", "payload-2")]


def test_large_parameter_and_wide_bind_and_long_parse(seat):
    with psycopg.connect(seat.dsn()) as conn:
        big = "x" * (1 << 20)
        assert conn.execute("SELECT length(%s::text), md5(%s::text)", (big, big)).fetchone() == (
            1 << 20, hashlib.md5(big.encode()).hexdigest())
        placeholders = ",".join(["%s"] * 25_000)
        total = conn.execute(f"SELECT cardinality(ARRAY[{placeholders}]::int[])", list(range(25_000))).fetchone()
        assert total == (25_000,)
        long_sql = "SELECT length('" + "y" * 165_000 + "'), %s::int"  # a 165 KB Parse
        assert conn.execute(long_sql, (7,)).fetchone() == (165_000, 7)


def test_cancel_ends_pg_sleep_and_the_session_goes_on(seat, pg):
    """psycopg's cancel_safe, sent once the statement runs (a cancel before it would cancel nothing): the
    statement ends with QueryCanceled, not after its 30 s, and the session serves the next one."""
    sleep = "SELECT pg_sleep(30.25)"  # its text, unique to this test, tells its backend in pg_stat_activity
    with psycopg.connect(seat.dsn()) as conn:

        def cancel_once_sleeping():
            deadline = time.monotonic() + 20
            with psycopg.connect(pg.dsn(), autocommit=True) as watcher:
                while watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE query = %s "
                                      "AND wait_event = 'PgSleep'", (sleep,)).fetchone() != (1,):
                    if time.monotonic() > deadline:
                        return
                    time.sleep(0.02)
            conn.cancel_safe()

        canceller = threading.Thread(target=cancel_once_sleeping)
        canceller.start()
        try:
            with pytest.raises(errors.QueryCanceled):
                conn.execute(sleep)
        finally:
            canceller.join()
        conn.rollback()
        assert conn.execute("SELECT 'after cancel'").fetchone() == ("after cancel",)


def test_advisory_lock_held_across_statements(seat, pg):
    with psycopg.connect(seat.dsn(), autocommit=True) as holder, psycopg.connect(pg.dsn(), autocommit=True) as other:
        holder.execute("SELECT pg_advisory_lock(424242)")
        holder.execute("SELECT 1")  # more statements on the same session
        assert other.execute("SELECT pg_try_advisory_lock(424242)").fetchone() == (False,)
        holder.execute("SELECT pg_advisory_unlock(424242)")
        assert other.execute("SELECT pg_try_advisory_lock(424242)").fetchone() == (True,)
        other.execute("SELECT pg_advisory_unlock(424242)")


def test_transaction_state_is_relayed(seat, fresh_table):
    table = fresh_table("id int")
    with psycopg.connect(seat.dsn()) as conn:
        conn.execute(f"INSERT INTO {table} VALUES (1)")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.rollback()
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
