"""pgjdbc (Debian's libpostgresql-jdbc-java) through the seat: tests/drivers/java/SeatJdbc.java, compiled once.

Each connection setting is run twice, directly against PostgreSQL reading the seat's translated view and
through the seat reading ``events``, on its defaults (prepareThreshold 5: the page statement becomes a named
server statement at its fifth execution, in the middle of the read) and with ``prepareThreshold=1`` and
``binaryTransfer=true`` (named from the first execution, binary results from the second). ApplicationName
given to the driver picks the session's major like any other client's application_name when pgjdbc sends
it in the startup packet (see test_application_name_in_the_startup_packet_picks_the_major).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import drivers
import pytest
from drivers import PAGE_SIZE, TRANSLATED_VIEW

SOURCE = drivers.DRIVERS_DIR / "java" / "SeatJdbc.java"
JAR = Path("/usr/share/java/postgresql.jar")  # Debian's libpostgresql-jdbc-java
SETTINGS = {"defaults": {}, "prepareThreshold1-binary": {"prepareThreshold": "1", "binaryTransfer": "true"}}


@pytest.fixture(scope="module")
def classes(tmp_path_factory) -> Path:
    assert JAR.is_file(), f"{JAR} missing: apt-get install libpostgresql-jdbc-java"
    out = tmp_path_factory.mktemp("jdbc")
    subprocess.run([shutil.which("javac"), "-cp", str(JAR), "-d", str(out), str(SOURCE)], check=True,
                   capture_output=True, timeout=120)
    return out


def jdbc_url(port: int, **params: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"user": "postgres", **params}.items())
    return f"jdbc:postgresql://127.0.0.1:{port}/postgres?{query}"


def run_java(classes: Path, *args: str, stdin: str = "") -> dict:
    proc = subprocess.run([shutil.which("java"), "-cp", f"{classes}{os.pathsep}{JAR}", "SeatJdbc", *args],
                          input=stdin, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"SeatJdbc {args[0]} {args[1]} exited {proc.returncode}:\n{proc.stderr}"
    return json.loads(proc.stdout)


def events_tsv(events: list[dict]) -> str:
    fields = ("eventId", "type", "nodeId", "payload", "timestamp", "causationId")
    return "".join("\t".join("\\N" if e[f] is None else e[f] for f in fields) + "\n" for e in events)


@pytest.fixture(scope="module")
def era2_run(pg):
    return drivers.seed_read_run(pg, "drv-jdbc")


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_major2_read(pg, seat, classes, era2_run, setting):
    run_id, events = era2_run
    params = SETTINGS[setting]
    direct = run_java(classes, "read", jdbc_url(pg.port, **params), TRANSLATED_VIEW, run_id, str(PAGE_SIZE))
    via = run_java(classes, "read", jdbc_url(seat.port, **params), "events", run_id, str(PAGE_SIZE))
    drivers.check_read(pg, run_id, events, via["rows"], direct["rows"], f"pgjdbc {setting}")


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_host_append(pg, seat, classes, setting):
    run_id = drivers.new_append_run(pg, "drv-jdbc-append")
    sent = drivers.append_events(run_id)
    out = run_java(classes, "append", jdbc_url(seat.port, **SETTINGS[setting]), run_id, stdin=events_tsv(sent))
    drivers.check_append(pg, run_id, sent, out["rows"], f"pgjdbc append {setting}")


@pytest.fixture(scope="module")
def v1_seat(start_seat):
    return start_seat(proxy={"clients": [{"application_name": "v1-host", "major": 1}]})


def test_application_name_in_the_startup_packet_picks_the_major(pg, v1_seat, classes, era2_run):
    """ApplicationName=v1-host is major 1 by the seat's rule: the era-2 run reads as stored (v1 names).

    pgjdbc (42.5) puts application_name into the startup packet only when it may assume a server of 9.0 or
    newer (``assumeMinServerVersion=9.0``); on its defaults the startup packet has no application_name (and
    extra_float_digits 2) and the driver sends ``SET application_name`` after connecting (see the next test)."""
    run_id, events = era2_run
    params = {"ApplicationName": "v1-host", "assumeMinServerVersion": "9.0"}
    via = run_java(classes, "read", jdbc_url(v1_seat.port, **params), "events", run_id, str(PAGE_SIZE))
    assert via["applicationName"] == "v1-host"
    want = drivers.oracle(pg, run_id, "openwop_seat.events_m1")
    assert [r["type"] for r in want] == [e["type"] for e in events]  # major 1 reads an era-2 run as stored
    got = [drivers.canonical(r) for r in via["rows"]]
    assert [r["type"] for r in got] == [r["type"] for r in want], "pgjdbc ApplicationName=v1-host read as major 2"
    assert got == want


def test_application_name_set_after_connecting_ends_the_session_instead_of_reading_with_the_wrong_major(
        pg, v1_seat, classes, era2_run):
    """pgjdbc on its defaults: no application_name in the startup packet (the session gets major 2), then
    `SET application_name = 'v1-host'` as its first statement. The seat follows the server's ParameterStatus
    and ends the session (FATAL 0A000) before the v1 host can read a single row in v2 names."""
    run_id, _ = era2_run
    proc = subprocess.run([shutil.which("java"), "-cp", f"{classes}{os.pathsep}{JAR}", "SeatJdbc", "read",
                           jdbc_url(v1_seat.port, ApplicationName="v1-host"), "events", run_id, str(PAGE_SIZE)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, proc.stdout
    assert "selects major 1" in proc.stderr and "0A000" in proc.stderr, proc.stderr
    assert '"rows"' not in proc.stdout
