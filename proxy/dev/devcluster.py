"""A throwaway PostgreSQL cluster (initdb + pg_ctl) for the demo, the tests and the benchmark.

Not used by `serve`. `initdb` refuses to run as root, so when we are root the
server runs as the unprivileged `postgres` account (present wherever the
Debian server package is installed), falling back to `nobody`.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time

INSTALL_HINT = "sudo apt-get install -y postgresql   # Debian/Ubuntu: the PostgreSQL server binaries"


class PostgresNotFound(RuntimeError):
    pass


def find_pg_bin() -> str:
    """The directory holding initdb/pg_ctl/postgres: from PATH, else the newest /usr/lib/postgresql/*/bin."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return os.path.dirname(os.path.realpath(on_path))
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(p.split("/")[-3]) if p.split("/")[-3].isdigit() else 0)
    if candidates:
        return os.path.dirname(candidates[-1])
    raise PostgresNotFound("PostgreSQL server binaries (initdb, pg_ctl) not found; install them with:\n  "
                           f"{INSTALL_HINT}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("running as root and no unprivileged account (postgres, nobody) to run PostgreSQL as")


class DevCluster:
    """One PostgreSQL cluster in a temporary folder, listening on 127.0.0.1 only."""

    def __init__(self, *, port: int | None = None, settings: dict[str, str] | None = None,
                 hba: list[str] | None = None, ssl_cert: tuple[str, str] | None = None,
                 superuser: str = "postgres"):
        self.bin = find_pg_bin()
        self.port = port or free_port()
        self.settings = settings or {}
        self.hba = hba
        self.ssl_cert = ssl_cert
        self.superuser = superuser
        self.base = tempfile.mkdtemp(prefix="openwop-seat-pg-")
        self.datadir = os.path.join(self.base, "data")
        self.logfile = os.path.join(self.base, "server.log")
        self.user = _run_as()
        self.started = False

    # -- helpers

    def _cmd(self, *args: str) -> list[str]:
        cmd = list(args)
        if self.user:
            cmd = ["runuser", "-u", self.user, "--"] + cmd
        return cmd

    def _chown(self, path: str) -> None:
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def dsn(self, user: str | None = None, dbname: str = "postgres", password: str | None = None,
            port: int | None = None, **params: str) -> str:
        parts = [f"host=127.0.0.1 port={port or self.port} user={user or self.superuser} dbname={dbname}"]
        if password is not None:
            parts.append(f"password={password}")
        parts += [f"{k}={v}" for k, v in params.items()]
        return " ".join(parts)

    def psql(self, sql: str, *, user: str | None = None, dbname: str = "postgres", check: bool = True) -> str:
        out = subprocess.run(
            [os.path.join(self.bin, "psql"), "-X", "-v", "ON_ERROR_STOP=1", "-At", "-d",
             self.dsn(user=user, dbname=dbname), "-c", sql],
            capture_output=True, text=True)
        if check and out.returncode != 0:
            raise RuntimeError(f"psql failed: {out.stderr.strip()}")
        return out.stdout

    # -- life cycle

    def start(self) -> "DevCluster":
        os.chmod(self.base, 0o755)
        self._chown(self.base)
        subprocess.run(self._cmd(os.path.join(self.bin, "initdb"), "-D", self.datadir, "-U", self.superuser,
                                 "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"),
                       check=True, capture_output=True)
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.base}'",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            "shared_buffers": "128MB",
            "log_min_messages": "warning",
        }
        if self.ssl_cert:
            cert, key = self.ssl_cert
            for src, name in ((cert, "server.crt"), (key, "server.key")):
                dst = os.path.join(self.datadir, name)
                shutil.copy(src, dst)
                os.chmod(dst, 0o600)
                self._chown(dst)
            conf.update({"ssl": "on", "ssl_cert_file": "'server.crt'", "ssl_key_file": "'server.key'"})
        conf.update(self.settings)
        with open(os.path.join(self.datadir, "postgresql.auto.conf"), "a") as f:
            for k, v in conf.items():
                f.write(f"{k} = {v}\n")
        if self.hba is not None:
            with open(os.path.join(self.datadir, "pg_hba.conf"), "w") as f:
                f.write("\n".join(self.hba) + "\n")
        subprocess.run(self._cmd(os.path.join(self.bin, "pg_ctl"), "-D", self.datadir, "-l", self.logfile,
                                 "-w", "-t", "60", "start"), check=True, capture_output=True)
        self.started = True
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        """Wait until the server accepts connections again (after a crash restart)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = subprocess.run([os.path.join(self.bin, "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                               capture_output=True)
            if r.returncode == 0:
                return
            time.sleep(0.1)
        raise TimeoutError("PostgreSQL did not become ready")

    def stop(self) -> None:
        if self.started:
            subprocess.run(self._cmd(os.path.join(self.bin, "pg_ctl"), "-D", self.datadir, "-m", "immediate",
                                     "-w", "stop"), capture_output=True)
            self.started = False
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> "DevCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
