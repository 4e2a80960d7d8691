"""proxy.unix_socket_dir: clients reach the seat on <dir>/.s.PGSQL.<port>, as libpq names PostgreSQL's socket."""

from __future__ import annotations

import signal
import socket
import stat

from test_psql import psql


def test_psql_through_the_unix_socket(start_seat, tmp_path):
    directory = tmp_path / "sock"
    directory.mkdir()
    seat = start_seat(proxy={"unix_socket_dir": str(directory)})
    path = directory / f".s.PGSQL.{seat.port}"
    assert stat.S_ISSOCK(path.stat().st_mode) and stat.S_IMODE(path.stat().st_mode) == 0o777
    out = psql(f"host={directory} port={seat.port} user=postgres dbname=postgres",
               "-c", "SELECT current_user, inet_client_addr() IS NOT NULL")
    assert out.stdout == "postgres|t\n"  # the upstream leg is TCP: the server sees the seat's address
    # a translated session too: the reader rule applies over the socket as over TCP
    out = psql(f"host={directory} port={seat.port} user=postgres dbname=postgres",
               "-c", "SELECT count(*) FROM events WHERE false")
    assert out.stdout == "0\n"
    assert "client=[local]" in seat.log()
    assert seat.stop(signal.SIGTERM) == 0
    assert not path.exists(), "the socket file is removed at stop"


def test_a_stale_socket_file_is_replaced_and_a_live_one_refused(tmp_path):
    """In process (a relay-only seat, no database): a socket file nobody answers on is replaced; one a process
    still listens on is an error, never taken over."""
    import asyncio

    import pytest

    from proxy.config import parse_config
    from proxy.dev.devcluster import free_port
    from proxy.serve.listener import SeatServer

    def config(port: int):
        return parse_config({"proxy": {"listen": f"127.0.0.1:{port}", "default_major": "raw", "workers": 1,
                                       "unix_socket_dir": str(tmp_path)}})

    async def run() -> None:
        port = free_port()
        path = tmp_path / f".s.PGSQL.{port}"
        with socket.socket(socket.AF_UNIX) as dead:  # bound, then closed: the file stays, nobody answers
            dead.bind(str(path))
        server = SeatServer(config(port))
        await server.start()
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(path))
        server.stop_now()
        await server.serve_forever()
        assert not path.exists()

        port = free_port()
        path = tmp_path / f".s.PGSQL.{port}"
        with socket.socket(socket.AF_UNIX) as live:
            live.bind(str(path))
            live.listen()
            server = SeatServer(config(port))
            with pytest.raises(OSError, match="in use by another process"):
                await server.start()
            server.stop_now()
            await server.serve_forever()
            assert stat.S_ISSOCK(path.stat().st_mode)  # left alone

    asyncio.run(run())
