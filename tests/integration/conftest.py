"""Fixtures of the integration tests: a real PostgreSQL cluster, TLS material, and seat processes.

Everything here is real: initdb/pg_ctl for the server, `python -m proxy serve`
as a subprocess for the seat (so signals, exit codes and logs are the real
ones), and the real client drivers in the tests.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest

from harness import HBA, HOST_SCHEMA, PASSWORD, ROOT, Seat, render_config, wait_listening
from proxy.dev.devcluster import DevCluster, free_port

REQUIRED_TOOLS = {
    "psql": "sudo apt-get install -y postgresql-client",
    "pg_dump": "sudo apt-get install -y postgresql-client",
    "pg_restore": "sudo apt-get install -y postgresql-client",
    "promtool": "sudo apt-get install -y prometheus",
    "pgbench": "sudo apt-get install -y postgresql",
    "openssl": "sudo apt-get install -y openssl",
    "node": "sudo apt-get install -y nodejs npm",
    # the driver tests (test_drivers_*.py); .ci/run installs these packages when they are missing
    "java": "sudo apt-get install -y default-jdk-headless",
    "javac": "sudo apt-get install -y default-jdk-headless",
    "go": "sudo apt-get install -y golang-go",
}
# Files of the driver tests' Debian packages (pgjdbc; pgx v4 and lib/pq for GOPATH builds).
REQUIRED_FILES = {
    "/usr/share/java/postgresql.jar": "sudo apt-get install -y libpostgresql-jdbc-java",
    "/usr/share/gocode/src/github.com/jackc/pgx/v4": "sudo apt-get install -y golang-github-jackc-pgx-v4-dev",
    "/usr/share/gocode/src/github.com/lib/pq": "sudo apt-get install -y golang-github-lib-pq-dev",
}
# Python drivers of the driver tests, from the `test` extra (make setup installs them).
REQUIRED_MODULES = ("psycopg2", "sqlalchemy", "django", "greenlet")


@pytest.fixture(scope="session", autouse=True)
def required_tools():
    """Every client the suite drives is required: a missing one fails the run with its install command."""
    import shutil

    missing = [f"{tool} ({hint})" for tool, hint in REQUIRED_TOOLS.items() if shutil.which(tool) is None]
    for module in ("pg", "postgres"):
        if not (ROOT / "tests" / "node" / "node_modules" / module).is_dir():
            missing.append(f"npm {module} (make test runs `npm ci --prefix tests/node`)")
    missing += [f"{path} ({hint})" for path, hint in REQUIRED_FILES.items() if not os.path.exists(path)]
    missing += [f"python module {m} (pip install -e '.[test]')" for m in REQUIRED_MODULES
                if importlib.util.find_spec(m) is None]
    if shutil.which("pgbouncer") is None and not os.path.exists("/usr/sbin/pgbouncer"):
        missing.append("pgbouncer (sudo apt-get install -y pgbouncer)")
    assert not missing, "missing: " + ", ".join(missing)


@pytest.fixture(scope="session")
def certs(tmp_path_factory) -> dict[str, str]:
    """A self-signed certificate for localhost / 127.0.0.1, and a second, unrelated one."""
    d = tmp_path_factory.mktemp("certs")
    out = {}
    for name in ("server", "other"):
        crt, key = d / f"{name}.crt", d / f"{name}.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(crt)],
            check=True, capture_output=True)
        os.chmod(d, 0o755)
        os.chmod(crt, 0o644)
        os.chmod(key, 0o644)
        out[f"{name}_crt"], out[f"{name}_key"] = str(crt), str(key)
    return out


@pytest.fixture(scope="session")
def pg(certs) -> DevCluster:
    cluster = DevCluster(hba=HBA, ssl_cert=(certs["server_crt"], certs["server_key"]))
    cluster.start()
    cluster.psql(f"""
        SET password_encryption = 'md5';
        CREATE ROLE md5_user LOGIN PASSWORD '{PASSWORD}';
        SET password_encryption = 'scram-sha-256';
        CREATE ROLE scram_user LOGIN PASSWORD '{PASSWORD}';
        CREATE ROLE tls_only LOGIN;
        CREATE ROLE host_user LOGIN;
        GRANT ALL ON SCHEMA public TO md5_user, scram_user, tls_only, host_user;
    """)
    cluster.psql("CREATE DATABASE app OWNER host_user")
    # The host database of the seats below is `postgres`: host-shaped tables and the seat's schema.
    cluster.psql(HOST_SCHEMA + "GRANT ALL ON runs, events TO PUBLIC;")
    migrate = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", cluster.dsn()],
                             capture_output=True, text=True, cwd=ROOT)
    assert migrate.returncode == 0, migrate.stderr
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def start_seat(pg, tmp_path_factory):
    """Factory: start a seat with extra config; every seat started is stopped at the end."""
    started: list[Seat] = []

    def start(proxy: dict | None = None, tls: dict | None = None, log: dict | None = None,
              upstream_port: int | None = None, wait: bool = True, host: dict | None = None,
              metrics: dict | None = None, extra: dict | None = None) -> Seat:
        # A free port can be taken by another process before the seat binds it: try again with
        # new ports then (and only then); any other early exit is the test's business.
        for attempt in range(3):
            seat = _start_once(proxy, tls, log, upstream_port, host, metrics, extra)
            started.append(seat)
            if not wait:
                return seat
            try:
                wait_listening(seat.port, seat.proc)
                return seat
            except RuntimeError:
                if "in use" not in seat.log().lower() or attempt == 2:
                    raise RuntimeError(f"the seat did not start; its log:\n{seat.log()}") from None
        raise AssertionError("unreachable")

    def _start_once(proxy, tls, log, upstream_port, host, metrics=None, extra=None) -> Seat:
        d = tmp_path_factory.mktemp("seat")
        # A test may name the listen address (two seats on one port: a rolling restart).
        port = int(proxy["listen"].rpartition(":")[2]) if proxy and "listen" in proxy else free_port()
        metrics_port = free_port()
        sections = {
            "proxy": {"listen": f"127.0.0.1:{port}", "upstream": f"127.0.0.1:{upstream_port or pg.port}",
                      "shutdown_timeout": 5, "workers": 1, **(proxy or {})},  # one process unless a test asks
            "metrics": {"listen": f"127.0.0.1:{metrics_port}", **(metrics or {})},
        }
        sections["host"] = {"dsn": pg.dsn(), **(host or {})} if upstream_port is None else (host or {})
        if not sections["host"]:
            sections["proxy"].setdefault("default_major", "raw")  # another upstream: relay only
            del sections["host"]
        if tls:
            sections["tls"] = tls
        if log:
            sections["log"] = log
        sections.update(extra or {})  # further sections, e.g. {"admin": {...}}
        config_path = d / "openwop-seat.toml"
        config_path.write_text(render_config(sections))
        log_path = d / "seat.log"
        proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(config_path)],
                                stdout=subprocess.DEVNULL, stderr=open(log_path, "wb"), cwd=ROOT)
        return Seat(proc, port, metrics_port, log_path, config_path)

    yield start
    for seat in started:
        if seat.alive():
            seat.stop(signal.SIGINT)


@pytest.fixture(scope="session")
def seat(start_seat) -> Seat:
    """The shared seat with default settings in front of the test cluster."""
    return start_seat()


@pytest.fixture
def fresh_table(pg):
    """Create a uniquely named table and drop it afterwards; yields its name."""
    names = []

    def make(ddl_columns: str, owner: str = "postgres") -> str:
        name = f"t_{os.getpid()}_{len(names)}_{int(time.monotonic_ns() % 1_000_000)}"
        pg.psql(f"CREATE TABLE {name} ({ddl_columns}); GRANT ALL ON {name} TO PUBLIC;")
        names.append(name)
        return name

    yield make
    for name in names:
        pg.psql(f"DROP TABLE IF EXISTS {name}", check=False)
