"""What the tests and the bench share: the reference host's tables, the test cluster's roles, the seat
process handle, config rendering and a port wait. Pure Python: importing it starts nothing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "s3cret-pw"
# The seats' claim secret, for every migrate and seat of this test run (only its hash reaches the database).
CLAIM_SECRET = os.environ.setdefault("OPENWOP_SEAT_CLAIM_SECRET", os.urandom(16).hex())

# The reference host's tables (docs: host-traffic.md), in the seats' host database.
HOST_SCHEMA = """
CREATE TABLE runs (
    run_id text PRIMARY KEY, tenant_id text NOT NULL, status text, inputs jsonb, metadata jsonb,
    configurable jsonb, parent_run_id text, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE events (
    event_id text PRIMARY KEY, run_id text NOT NULL, sequence integer NOT NULL, type text NOT NULL,
    node_id text, payload jsonb, timestamp timestamptz NOT NULL, causation_id text,
    UNIQUE (run_id, sequence));
"""

# Roles of the test cluster, each reached by a different authentication method.
HBA = [
    "local all all trust",
    "hostssl all tls_only 127.0.0.1/32 trust",
    "hostnossl all tls_only 127.0.0.1/32 reject",
    "host all md5_user 127.0.0.1/32 md5",
    "host all scram_user 127.0.0.1/32 scram-sha-256",
    "host all all 127.0.0.1/32 trust",
]


class Seat:
    """A running `openwop-seat serve` process."""

    def __init__(self, proc: subprocess.Popen, port: int, metrics_port: int, log_path: Path, config_path: Path):
        self.proc = proc
        self.port = port
        self.metrics_port = metrics_port
        self.log_path = log_path
        self.config_path = config_path

    def dsn(self, user: str = "postgres", dbname: str = "postgres", **params) -> str:
        parts = [f"host=127.0.0.1 port={self.port} user={user} dbname={dbname}"]
        parts += [f"{k}={v}" for k, v in params.items()]
        return " ".join(parts)

    def url(self, user: str = "postgres", dbname: str = "postgres", password: str | None = None) -> str:
        auth = f"{user}:{password}" if password else user
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}"

    def log(self) -> str:
        return self.log_path.read_text()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGINT, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        return self.proc.returncode


def wait_listening(port: int, proc: subprocess.Popen | None = None, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on port {port}")


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_config(sections: dict) -> str:
    """Render {section: {key: value}} (with `clients` as a list of tables) as TOML."""
    lines = []
    for section, values in sections.items():
        rules = values.pop("clients", []) if section == "proxy" else []
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
        for rule in rules:
            lines.append("[[proxy.clients]]")
            lines += [f"{k} = {toml_value(v)}" for k, v in rule.items()]
    return "\n".join(lines) + "\n"


def seat_cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python -m proxy <args>` from the project root, its output captured as text."""
    return subprocess.run([sys.executable, "-m", "proxy", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=timeout)
