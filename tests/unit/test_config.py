"""Configuration parsing (strict keys) and the command line."""

from __future__ import annotations

import pytest

from harness import ROOT
from harness import seat_cli as cli
from proxy.config import RESTART_KEYS, ClientRule, Config, ConfigError, HostPort, load_config, parse_config


def test_example_config_loads():
    config = load_config(str(ROOT / "config" / "openwop-seat.toml"))
    assert isinstance(config, Config)


def test_defaults():
    c = parse_config({})
    assert c.listen == HostPort("127.0.0.1", 6543) and c.default_major == 2 and c.shutdown_timeout == 30
    assert c.tls.upstream_sslmode == "disable" and c.metrics_listen is None


def test_client_rules_first_match_wins():
    c = parse_config({"proxy": {"default_major": "raw", "clients": [
        {"user": "legacy", "major": 1},
        {"database": "app", "application_name": "host-v2", "major": 2},
        {"database": "app", "major": 1},
    ]}})
    assert c.major_for({"user": "legacy", "database": "app", "application_name": "host-v2"}) == 1
    assert c.major_for({"user": "u", "database": "app", "application_name": "host-v2"}) == 2
    assert c.major_for({"user": "u", "database": "app"}) == 1
    assert c.major_for({"user": "app"}) == 1  # database defaults to the user name
    assert c.major_for({"user": "u", "database": "other"}) == "raw"
    assert c.clients[0] == ClientRule(major=1, user="legacy")


@pytest.mark.parametrize("data, text", [
    ({"proxy": {"listen_port": 1}}, "unknown key proxy.listen_port"),
    ({"proxies": {}}, "unknown key proxies"),
    ({"tls": {"cert": "x"}}, "unknown key tls.cert"),
    ({"proxy": {"clients": [{"user": "a", "major": 2, "role": "x"}]}}, "unknown key proxy.clients[0].role"),
    ({"proxy": {"clients": [{"user": "a"}]}}, "proxy.clients[0].major: required"),
    ({"proxy": {"clients": [{"major": 2}]}}, "name at least one of"),
    ({"proxy": {"default_major": 3}}, "proxy.default_major: expected 1, 2 or \"raw\""),
    ({"proxy": {"default_major": True}}, "proxy.default_major"),
    ({"proxy": {"listen": "6543"}}, "proxy.listen: expected \"HOST:PORT\""),
    ({"proxy": {"upstream": "db:99999"}}, "proxy.upstream"),
    ({"proxy": {"shutdown_timeout": -1}}, "proxy.shutdown_timeout"),
    ({"tls": {"upstream_sslmode": "allow"}}, "tls.upstream_sslmode: expected one of"),
    ({"tls": {"upstream_sslmode": "verify-full"}}, "tls.upstream_ca_file: required"),
    ({"tls": {"cert_file": "/nonexistent/cert.pem"}}, "tls.cert_file: no such file"),
    ({"log": {"format": "xml"}}, "log.format"),
    ({"host": {"payload_column": "pay load"}}, "host.payload_column: expected a column name"),
    ({"host": {"payload_column": ""}}, "host.payload_column"),
    ({"host": {"tenant_column": "runs.tenant"}}, "host.tenant_column: expected a column name"),
    ({"host": {"node_id_column": 7}}, "host.node_id_column"),
    ({"proxy": {"plan_cache_bytes": -1}}, "proxy.plan_cache_bytes"),
    ({"proxy": {"plan_cache_bytes": "32MB"}}, "proxy.plan_cache_bytes"),
    ({"proxy": {"max_statement_bytes": 100}}, "proxy.max_statement_bytes"),
    ({"proxy": {"max_statement_bytes": 1.5}}, "proxy.max_statement_bytes"),
    ({"proxy": {"claim_buffer_limit": -1}}, "proxy.claim_buffer_limit"),
    ({"host": {"check_interval": -1}}, "host.check_interval"),
    ({"host": {"check_interval": "often"}}, "host.check_interval"),
    ({"host": {"store": "yes"}}, "host.store"),
    ({"host": {"store": 1}}, "host.store"),
    ({"host": {"store_fill_interval": -0.5}}, "host.store_fill_interval"),
    ({"host": {"store_fill_interval": "5s"}}, "host.store_fill_interval"),
    ({"host": {"fast_page": "off"}}, "host.fast_page"),
    ({"host": {"payload_carrier": "carrier"}}, "host.payload_carrier"),
    ({"metrics": {"database_user_labels": -1}}, "metrics.database_user_labels"),
    ({"metrics": {"database_user_labels": "all"}}, "metrics.database_user_labels"),
])
def test_invalid_config_names_the_key(data, text):
    with pytest.raises(ConfigError) as e:
        parse_config(data)
    assert text in str(e.value)


# Every key read as a number of seconds or bytes (proxy.config._number): TOML's nan and inf are neither.
NUMBER_KEYS = [("proxy", "shutdown_timeout"), ("proxy", "connect_timeout"), ("proxy", "startup_timeout"),
               ("proxy", "buffer_limit"), ("proxy", "client_idle_timeout"), ("host", "check_interval"),
               ("host", "store_fill_interval"), ("pool", "server_idle_timeout"), ("pool", "server_lifetime"),
               ("pool", "query_wait_timeout"), ("pool", "server_check_delay"), ("pool", "server_reset_delay")]


@pytest.mark.parametrize("section, key", NUMBER_KEYS, ids=[f"{s}.{k}" for s, k in NUMBER_KEYS])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_number_key_refuses_nan_and_infinity(tmp_path, section, key, value):
    path = tmp_path / "seat.toml"
    path.write_text(f"[{section}]\n{key} = {value}\n")
    with pytest.raises(ConfigError, match=f"{section}.{key}: expected a finite number"):
        load_config(str(path))


def test_optional_projection_columns():
    host = parse_config({"host": {"event_id_column": "", "tenant_column": "org"}}).host
    assert (host.event_id_column, host.node_id_column, host.tenant_column) == (None, "node_id", "org")


def test_projection_columns_are_checked_against_the_tables():
    from proxy.db.layout import SchemaError
    from proxy.serve.context import resolve_columns

    host = parse_config({"host": {"payload_column": "body"}}).host
    with pytest.raises(SchemaError, match="host.payload_column 'body': no such column"):
        resolve_columns(host, {"payload": 6, "event_id": 1}, {"tenant_id": 2})
    resolved, absent = resolve_columns(parse_config({}).host, {"payload": 6, "event_id": 1}, {})
    assert absent == ["node_id_column", "tenant_column"]
    assert (resolved.event_id_column, resolved.node_id_column, resolved.tenant_column) == ("event_id", None, None)


def test_ipv6_hostport():
    assert parse_config({"proxy": {"listen": "[::1]:7000"}}).listen == HostPort("::1", 7000)


def test_version_and_help():
    out = cli("--version")
    assert out.returncode == 0 and out.stdout.startswith("openwop-seat ")
    for args in (["--help"], ["serve", "--help"], ["config", "--help"]):
        out = cli(*args)
        assert out.returncode == 0 and "usage: openwop-seat" in out.stdout
    assert "--upstream HOST:PORT" in cli("serve", "--help").stdout


def test_serve_with_bad_config_exits_2_naming_the_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[proxy]\nlisten = \"127.0.0.1:1\"\nbogus = 1\n")
    out = cli("serve", "--config", str(bad))
    assert out.returncode == 2 and "unknown key proxy.bogus" in out.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("[proxy\n")
    out = cli("config", "--config", str(broken))
    assert out.returncode == 2 and "invalid TOML" in out.stderr
    out = cli("serve", "--config", str(tmp_path / "missing.toml"))
    assert out.returncode == 2 and "cannot read config file" in out.stderr


def test_serve_needs_host_dsn_unless_every_major_is_raw(tmp_path):
    out = cli("serve", "--listen", "127.0.0.1:0")
    assert out.returncode == 2 and "host.dsn: required" in out.stderr


def test_append_lock_is_one_expression_over_run_id():
    from proxy.config import ConfigError, parse_config
    from proxy.db.writer_sql import host_append_lock_sql

    config = parse_config({"host": {"append_lock": " pg_advisory_xact_lock(hashtext(run_id), 1) "}})
    assert config.host.append_lock == "pg_advisory_xact_lock(hashtext(run_id), 1)"
    assert host_append_lock_sql(config.host) == (
        "SELECT (pg_advisory_xact_lock(hashtext(run_id), 1)) FROM (SELECT $1::text AS run_id) AS openwop_seat_run")
    assert host_append_lock_sql(parse_config({}).host) is None
    for bad in ("", "pg_advisory_xact_lock(42)", "pg_advisory_xact_lock(hashtext(run_id)); DROP TABLE events", 7):
        with pytest.raises(ConfigError, match="host.append_lock"):
            parse_config({"host": {"append_lock": bad}})


def test_unix_socket_dir(tmp_path):
    from proxy.config import unix_socket_path

    config = parse_config({"proxy": {"unix_socket_dir": str(tmp_path), "workers": 1}})
    assert config.unix_socket_dir == str(tmp_path)
    assert unix_socket_path(config.unix_socket_dir, 6543) == str(tmp_path / ".s.PGSQL.6543")
    # relative to the configuration file, as the TLS paths
    (tmp_path / "run").mkdir()
    source = str(tmp_path / "seat.toml")
    assert parse_config({"proxy": {"unix_socket_dir": "run", "workers": 1}}, source).unix_socket_dir == str(
        tmp_path / "run")
    for bad, why in (({"unix_socket_dir": str(tmp_path / "nope"), "workers": 1}, "no such directory"),
                     ({"unix_socket_dir": str(tmp_path), "workers": 2}, "needs proxy.workers = 1"),
                     ({"unix_socket_dir": "/" + "d" * 100, "workers": 1}, "too long"),
                     ({"unix_socket_dir": "", "workers": 1}, "non-empty")):
        with pytest.raises(ConfigError, match=f"proxy.unix_socket_dir: .*{why}"):
            parse_config({"proxy": bad})
    assert "proxy.unix_socket_dir" in RESTART_KEYS.values()


def test_admin_keys(tmp_path):
    users = tmp_path / "users.txt"
    users.write_text('"ops" "pw"\n')
    config = parse_config({"proxy": {"workers": 2}, "admin": {
        "listen": "127.0.0.1:6434", "unix_socket": str(tmp_path / ".s.PGSQL.6434"), "users": ["ops"],
        "auth_file": str(users)}})
    assert config.admin_listen == HostPort("127.0.0.1", 6434)  # with workers > 1 too: the supervisor answers
    assert config.admin_unix_socket == str(tmp_path / ".s.PGSQL.6434")
    assert config.admin_users == ("ops",) and config.admin_auth_file == str(users)
    assert config.admin_auth == "scram-sha-256"
    assert Config().admin_listen is None and Config().admin_unix_socket is None  # off by default
    trust = parse_config({"admin": {"unix_socket": str(tmp_path / "s"), "auth": "trust"}})
    assert trust.admin_auth == "trust" and trust.admin_users == ()
    for bad, why in (({"admin": {"unix_socket": str(tmp_path / "no" / "s"), "auth": "trust"}},
                      "admin.unix_socket: no such directory"),
                     ({"admin": {"listen": "nowhere"}}, "admin.listen: expected"),
                     ({"admin": {"password": "x"}}, "unknown key admin.password"),
                     # never open by default: no admin users, or trust on TCP, is refused
                     ({"admin": {"listen": "127.0.0.1:6434"}}, "admin.users and admin.auth_file: required"),
                     ({"admin": {"unix_socket": str(tmp_path / "s")}}, "admin.users and admin.auth_file: required"),
                     ({"admin": {"listen": "127.0.0.1:6434", "users": ["ops"]}}, "admin.users and admin.auth_file"),
                     ({"admin": {"listen": "127.0.0.1:6434", "unix_socket": str(tmp_path / "s"), "auth": "trust"}},
                      "admin.auth: \"trust\" only for a console on admin.unix_socket alone"),
                     ({"admin": {"users": "ops"}}, "admin.users: expected a list"),
                     ({"admin": {"auth_file": str(tmp_path / "none")}}, "admin.auth_file: no such file"),
                     ({"admin": {"auth": "password"}}, "admin.auth")):
        with pytest.raises(ConfigError, match=why):
            parse_config(bad)
    assert {"admin.listen", "admin.unix_socket"} <= set(RESTART_KEYS.values())
    assert not {"admin.users", "admin.auth_file", "admin.auth"} & set(RESTART_KEYS.values())  # a reload applies


def test_shutdown_mode_and_so_reuseport():
    assert Config().shutdown_mode == "idle" and Config().so_reuseport is False
    c = parse_config({"proxy": {"shutdown_mode": "drain", "so_reuseport": True}})
    assert c.shutdown_mode == "drain" and c.so_reuseport is True
    for bad in ("fast", 1, ""):
        with pytest.raises(ConfigError, match="proxy.shutdown_mode"):
            parse_config({"proxy": {"shutdown_mode": bad}})
    for bad in (1, "yes", 0):
        with pytest.raises(ConfigError, match="proxy.so_reuseport"):
            parse_config({"proxy": {"so_reuseport": bad}})


def test_listen_error_names_the_key():
    from proxy.errors import ListenError, describe

    e = ListenError("metrics.listen", HostPort("127.0.0.1", 9187), OSError(98, "Address already in use"))
    assert describe(e) == "cannot listen on 127.0.0.1:9187 (metrics.listen): Address already in use"


# --- issue 25: every error at once, upstream validated, `config` as TOML/JSON with secrets redacted -------------


def test_every_error_is_reported_at_once(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('bogus = 1\n[proxy]\nlisten = "nope"\ndefault_major = 7\nworkers = 0\n'
                   '[[proxy.clients]]\nmajor = 3\n[host]\nevents_table = "a b"\n[log]\nlevel = "loud"\n')
    out = cli("config", "--config", str(bad))
    assert out.returncode == 2, out
    assert "configuration error: 8 errors:" in out.stderr, out.stderr
    for part in ("unknown key bogus", "proxy.listen:", "proxy.default_major:", "proxy.workers:",
                 "proxy.clients[0]: name at least one of", "proxy.clients[0].major:", "host.events_table:",
                 "log.level:"):
        assert part in out.stderr, (part, out.stderr)


def test_one_error_keeps_its_one_line():
    with pytest.raises(ConfigError) as e:
        parse_config({"proxy": {"default_major": 7}})
    assert str(e.value) == 'proxy.default_major: expected 1, 2 or "raw", got 7'


@pytest.mark.parametrize("upstream", ["/var/run/postgresql", "/var/run/postgresql:5432", "@abstract:5432"])
def test_upstream_socket_directory_refused_clearly(upstream):
    with pytest.raises(ConfigError) as e:
        parse_config({"proxy": {"upstream": upstream}})
    assert "proxy.upstream:" in str(e.value) and "Unix socket directory" in str(e.value)
    assert "TCP only" in str(e.value)


def test_upstream_override_socket_directory_refused():
    with pytest.raises(ConfigError, match="--upstream: .*Unix socket directory"):
        parse_config({}).with_overrides(upstream="/run/postgresql:5432")


def test_upstream_port_zero_refused():
    with pytest.raises(ConfigError, match="proxy.upstream: port 0"):
        parse_config({"proxy": {"upstream": "db:0"}})


@pytest.mark.parametrize("dsn,shown", [
    ("host=db user=app password=s3cret dbname=x", "host=db user=app password=<redacted> dbname=x"),
    ("host=db password = 'a b\\'c' dbname=x", "host=db password = <redacted> dbname=x"),
    ("postgres://app:s3cret@db:5432/x", "postgres://app:<redacted>@db:5432/x"),
    ("postgresql://app:s3cret@db/x?password=p2&sslmode=require",
     "postgresql://app:<redacted>@db/x?password=<redacted>&sslmode=require"),
    ("host=db user=app", "host=db user=app"),
])
def test_redact_dsn(dsn, shown):
    from proxy.config import redact_dsn

    assert redact_dsn(dsn) == shown


def _full_config(tmp_path):
    secret = tmp_path / "claim-secret"
    secret.write_text("x" * 32)
    path = tmp_path / "seat.toml"
    path.write_text(
        '[proxy]\nlisten = "0.0.0.0:6543"\nupstream = "db.internal:5432"\ndefault_major = 2\nworkers = 1\n'
        'shutdown_mode = "drain"\n[[proxy.clients]]\nuser = "v1"\nmajor = 1\n'
        '[[proxy.clients]]\napplication_name = "pg_dump"\ndatabase = "openwop"\nmajor = "raw"\n'
        '[host]\ndsn = "host=db user=seat password=hunter2 dbname=openwop"\nclaim_secret_file = "claim-secret"\n'
        'node_id_column = ""\nappend_lock = "pg_advisory_xact_lock(hashtext(run_id), 1)"\n'
        '[metrics]\nlisten = "127.0.0.1:6545"\n[log]\nformat = "json"\n')
    return path


def test_config_prints_toml_that_reads_back_the_same_with_secrets_redacted(tmp_path):
    import tomllib

    path = _full_config(tmp_path)
    out = cli("config", "--config", str(path), env={"OPENWOP_SEAT_CLAIM_SECRET": "envsecret-" + "y" * 20})
    assert out.returncode == 0, out.stderr
    assert "hunter2" not in out.stdout and "x" * 32 not in out.stdout and "envsecret" not in out.stdout
    assert 'dsn = "host=db user=seat password=<redacted> dbname=openwop"' in out.stdout
    assert "# claim secret: <redacted> from host.claim_secret_file (" in out.stdout
    back = tmp_path / "back.toml"
    back.write_text(out.stdout)
    again = parse_config(tomllib.loads(out.stdout), source=str(back))
    want = load_config(str(path))
    from dataclasses import replace

    assert again == replace(want, source=str(back), host=replace(
        want.host, dsn="host=db user=seat password=<redacted> dbname=openwop"))


def test_config_json_redacted_and_names_the_secrets_source(tmp_path):
    import json

    path = tmp_path / "seat.toml"
    path.write_text('[host]\ndsn = "postgres://seat:hunter2@db/openwop"\n')
    out = cli("config", "--config", str(path), "--json",
              env={"OPENWOP_SEAT_CLAIM_SECRET": "envsecret-" + "y" * 20})
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["host"]["dsn"] == "postgres://seat:<redacted>@db/openwop"
    assert doc["claim_secret"] == "<redacted> from $OPENWOP_SEAT_CLAIM_SECRET"
    assert doc["proxy"]["clients"] == [] and doc["host"]["era_column"] is None
    assert "hunter2" not in out.stdout and "envsecret" not in out.stdout
    env = {k: v for k, v in __import__("os").environ.items() if k != "OPENWOP_SEAT_CLAIM_SECRET"}
    import subprocess
    import sys

    bare = subprocess.run([sys.executable, "-m", "proxy", "config", "--config", str(path), "--json"],
                          capture_output=True, text=True, cwd=ROOT, env=env)
    assert json.loads(bare.stdout)["claim_secret"] is None


# --- log.connections, log.disconnections (PgBouncer's log_connections, log_disconnections) -----------------------

def test_connection_lines_are_logged_by_default():
    c = parse_config({})
    assert c.log_connections is True and c.log_disconnections is True
    c = parse_config({"log": {"connections": False, "disconnections": True}})
    assert c.log_connections is False and c.log_disconnections is True
    c = parse_config({"log": {"disconnections": False}})
    assert c.log_connections is True and c.log_disconnections is False
    assert "log.connections" not in RESTART_KEYS.values() and "log.disconnections" not in RESTART_KEYS.values()


@pytest.mark.parametrize("key", ["connections", "disconnections"])
@pytest.mark.parametrize("bad", ["yes", 1, 0, "true", None])
def test_connection_log_switches_are_booleans(key, bad):
    if bad is None:
        with pytest.raises(ConfigError, match=f"unknown key log.{key}s"):
            parse_config({"log": {f"{key}s": True}})
        return
    with pytest.raises(ConfigError) as e:
        parse_config({"log": {key: bad}})
    assert str(e.value) == f"log.{key}: expected true or false, got {bad!r}"
