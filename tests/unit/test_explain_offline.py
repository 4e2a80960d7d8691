"""`openwop-seat explain` offline: what it says of statements, without running what it would send (the
integration tests run that on a real database).

The command runs as a subprocess and needs no database.
"""

from __future__ import annotations

import subprocess

import pytest

from harness import render_config, seat_cli

RUN_READ = "SELECT * FROM runs WHERE run_id = $1"
GROUPED = "SELECT * FROM events TABLESAMPLE SYSTEM (1)"  # refused: not substitutable


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("explain") / "openwop-seat.toml"
    path.write_text(render_config({"proxy": {"default_major": 2}}))
    return path


def explain(config, *args: str) -> subprocess.CompletedProcess:
    return seat_cli("explain", "--config", str(config), *args)


def test_a_statement_without_event_columns_passes(config):
    out = explain(config, RUN_READ)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "major: 2 (proxy.default_major)",
        "passthrough: sent as written (it reads nothing of the events table)"]


def test_several_statements_and_a_raw_session(config):
    out = explain(config, f"SELECT 1; {GROUPED}")
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert lines[1] == "statement 1: passthrough: sent as written (it reads nothing of the events table)"
    assert lines[2].startswith("statement 2: refused (TABLESAMPLE on the events table)")
    assert lines[-1].startswith("sent together in one Query message, they fail as if the refused statement")
    raw = explain(config, "--major", "raw", GROUPED)
    assert raw.returncode == 0
    assert "passthrough: a raw session is relayed as is" in raw.stdout


@pytest.mark.parametrize("args,code,message", [
    (["--major", "3", "SELECT 1"], 2, "argument --major: expected 1, 2 or raw, got '3'"),
    (["--major", "two", "SELECT 1"], 2, "argument --major: expected 1, 2 or raw, got 'two'"),
    (["   "], 2, "openwop-seat explain: the SQL is empty"),
    ([], 2, "the following arguments are required: SQL"),
])
def test_bad_input(config, args, code, message):
    out = explain(config, *args)
    assert out.returncode == code
    assert message in out.stderr
    assert out.stdout == ""


def test_a_missing_config_file_is_a_configuration_error(tmp_path):
    out = explain(tmp_path / "nope.toml", "SELECT 1")
    assert out.returncode == 2
    assert "configuration error: cannot read config file" in out.stderr


def test_the_relation_named_is_the_one_of_the_major():
    from proxy.config import Config
    from proxy.tools.explain import explain as explain_in_process

    lines: list[str] = []
    status = explain_in_process(Config(), "SELECT e.type AS kind, e.run_id FROM events e WHERE e.run_id = $1", 1,
                                out=lines.append)
    assert status == 0
    assert lines[1] == "translated: the events table is read as openwop_seat.events_m1"


def test_a_row_lock_and_an_oversized_statement_say_what_the_seat_does(config, tmp_path):
    """ADR 0017: a row lock reads the lockable translation; an oversized statement is sent unanalysed."""
    out = explain(config, "SELECT * FROM events WHERE run_id = $1 FOR UPDATE SKIP LOCKED")
    assert out.returncode == 0, out.stderr
    assert "  row lock: the locked rows are read through openwop_seat.events_m2_lock, the same" in out.stdout
    small = tmp_path / "small.toml"
    small.write_text(render_config({"proxy": {"default_major": 2, "max_statement_bytes": 2048}}))
    config = small
    big = "INSERT INTO events VALUES " + ",".join(["('x', 'r', 1, 't', NULL, NULL, now(), NULL)"] * 100)
    out = explain(config, big)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1].startswith("passthrough: larger than proxy.max_statement_bytes, sent as written")
    out = explain(config, big + " RETURNING type")
    assert out.returncode == 1 and "refused (statement too large)" in out.stdout and "holds RETURNING" in out.stdout


def test_dynamic_sql_is_refused_offline_and_said_to_be_sent_under_the_net(config):
    # ADR 0019: serve sends a DO block with EXECUTE for a role the net holds, while the database holds no code
    # past the net; offline, explain cannot know either, so it refuses (exit 1) and says when the net would hold it
    out = explain(config, "DO $$ BEGIN EXECUTE 'SELECT 1'; END $$")
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert lines[1].startswith("refused (DO block)")
    assert lines[3].startswith("  with the net (ADR 0019): a session of a role the net holds sends it")
    # a refusal the net does not lift gets no such line
    grouped = explain(config, GROUPED)
    assert grouped.returncode == 1 and "with the net" not in grouped.stdout
    # dblink opens a session of its own, past the net: refused either way
    linked = explain(config, "SELECT * FROM dblink('dbname=x', 'SELECT type FROM events') AS t(type text)")
    assert linked.returncode == 1 and "with the net" not in linked.stdout
