"""A throwaway PgBouncer for the bench and the tests (not used by serve).

The Debian package's binary, installed with apt-get when missing and we are root, run as its own process
with its own ini in a temporary folder: trust authentication, a free port, no Unix socket. Debian's
pgbouncer refuses to run as root, so as root it runs as ``run_as`` (the account the cluster runs as).
The system service is not used.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from proxy.dev.devcluster import free_port
from proxy.errors import SeatException

INSTALL = "sudo apt-get update && sudo apt-get install -y pgbouncer"


class PgBouncerError(SeatException):
    """PgBouncer could not be found, installed or started."""


def find_pgbouncer() -> str:
    """The pgbouncer binary; installs the Debian package first when it is missing and we are root."""
    found = _which()
    if found:
        return found
    if os.geteuid() != 0:
        raise PgBouncerError(f"pgbouncer not found; install it with:\n  {INSTALL}")
    print("pgbouncer not found: installing the Debian package (apt-get install -y pgbouncer)", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "pgbouncer"]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise PgBouncerError(f"{' '.join(cmd)} failed with exit code {done.returncode}:\n{done.stderr[-2000:]}")
    found = _which()
    if not found:
        raise PgBouncerError("apt-get installed pgbouncer, but no pgbouncer binary is on PATH or in /usr/sbin")
    return found


def _which() -> str | None:
    # /usr/sbin is not on an ordinary user's PATH, and that is where Debian puts it.
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/local/sbin")


class PgBouncer:
    """PgBouncer in front of ``upstream_port`` on loopback, every database of the upstream reachable."""

    def __init__(self, binary: str, upstream_port: int, *, pool_mode: str = "session", max_clients: int = 100,
                 pool_size: int | None = None, users: tuple[str, ...] = ("postgres",), run_as: str | None = None,
                 extra: str = "", auth_type: str = "trust", secrets: dict[str, str] | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="openwop-seat-pgbouncer-"))
        self.port = free_port()
        self.log_path = self.dir / "pgbouncer.log"
        ini = self.dir / "pgbouncer.ini"
        (self.dir / "userlist.txt").write_text("".join(f'"{u}" "{(secrets or {}).get(u, "")}"\n' for u in users))
        ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={upstream_port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = {auth_type}\nauth_file = {self.dir / 'userlist.txt'}\n"
            f"pool_mode = {pool_mode}\n"
            f"max_client_conn = {max_clients}\ndefault_pool_size = {pool_size or max_clients}\n"
            "ignore_startup_parameters = extra_float_digits\n" + extra)
        ids = {}
        if run_as:
            entry = pwd.getpwnam(run_as)
            os.chmod(self.dir, 0o755)
            for path in (self.dir, ini, self.dir / "userlist.txt"):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            ids = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([binary, str(ini)], stdout=log, stderr=subprocess.STDOUT, **ids)
        self._wait_started()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _wait_started(self, timeout: float = 20) -> None:
        import socket

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise PgBouncerError(f"pgbouncer did not start; its log:\n{self.log()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
