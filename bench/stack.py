"""The processes the bench measures, all on loopback: PostgreSQL, PgBouncer and the seat.

* PostgreSQL: a :class:`proxy.devcluster.DevCluster` with benchmark settings (no fsync, no
  synchronous commit, no full-page writes, no checkpoint during a run, shared buffers that hold
  the whole data set, and connections for the idle-connection test).
* PgBouncer: :class:`proxy.dev.pgbouncer.PgBouncer` in session mode (the Debian package's binary,
  installed with apt-get when missing and we are root; as root it runs as the cluster's account).
* The seat: ``python -m proxy serve`` with ``workers = 1``, so one process, like single-threaded
  PgBouncer; its sessions are major 2, except those whose application_name is
  :data:`bench.seed.V1_APPLICATION`, which are major 1 (a ``[[proxy.clients]]`` rule).
* The floor: ``python -m bench.bare_relay``, a bare uvloop relay with no framing (issue 27), and beside it a
  second seat whose sessions are raw (``default_major = "raw"``: the relay without the read path).

Each class stops what it started; :func:`machine` describes where the figures were taken.
"""

from __future__ import annotations

import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import asyncpg

from proxy import __version__
from proxy.dev.devcluster import DevCluster, free_port
from proxy.dev.pgbouncer import PgBouncer as DevPgBouncer
from proxy.dev.pgbouncer import PgBouncerError, find_pgbouncer  # noqa: F401  (used by __main__)

from .seed import V1_APPLICATION

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from harness import render_config, wait_listening  # noqa: E402  (the suite's seat config and port wait)


class StackError(RuntimeError):
    """A process the bench needs is missing or did not start; the message says what to do."""


def cluster_settings(idle_connections: int) -> dict[str, str]:
    """PostgreSQL settings for a benchmark on a throwaway cluster (durability off: nothing here is kept)."""
    return {
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "shared_buffers": "256MB",  # pgbench's tables at the bench's scale and every event fit
        "max_wal_size": "8GB",  # no checkpoint in the middle of a measurement
        "checkpoint_timeout": "1h",
        # every idle seat connection holds one server connection, plus the workloads' and PgBouncer's
        "max_connections": str(idle_connections + 100),
    }


def raise_nofile(needed: int) -> None:
    """Raise this process's open-file limit to ``needed`` (its children, seat and PgBouncer, inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard < needed:
        if os.geteuid() != 0:
            raise StackError(f"the bench needs {needed} open files and the hard limit is {hard}: raise it "
                             f"(ulimit -Hn) or pass a smaller --idle-connections")
        hard = needed
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def start_cluster(idle_connections: int) -> DevCluster:
    return DevCluster(settings=cluster_settings(idle_connections)).start()


def version_of(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True)
    return (out.stdout or out.stderr).splitlines()[0].strip() if out.returncode == 0 else "unknown"


class _Process:
    """A long-running child with a log file in its own temporary folder."""

    name = "process"

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"openwop-seat-bench-{self.name}-"))
        self.port = free_port()
        self.log_path = self.dir / f"{self.name}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _wait_started(self) -> None:
        try:
            wait_listening(self.port, self.proc)
        except (RuntimeError, TimeoutError) as e:
            raise StackError(f"{self.name} did not start ({e}); its log:\n{self.log()}") from None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class PgBouncer(DevPgBouncer):
    """PgBouncer in session mode in front of the cluster, as the cluster's account when we are root."""

    def __init__(self, binary: str, cluster: DevCluster, max_clients: int, scram_verifier: str | None = None) -> None:
        # every client gets a server connection of its own, as through the seat; with a verifier, clients log in
        # with SCRAM-SHA-256 at PgBouncer (as at the seat with reuse: the connect workloads' fair comparison)
        super().__init__(binary, cluster.port, pool_mode="session", max_clients=max_clients,
                         users=(cluster.superuser,), run_as=cluster.user,
                         auth_type="trust" if scram_verifier is None else "scram-sha-256",
                         secrets=None if scram_verifier is None else {cluster.superuser: scram_verifier})


# The superuser's password for the seat with reuse (bench/__main__.py): hand-overs authenticate at the seat.
POOL_PASSWORD = "bench-pool-pw"


class Seat(_Process):
    """``python -m proxy serve`` in front of the cluster: one worker, the cluster's database as the host's."""

    name = "seat"

    def __init__(self, cluster: DevCluster, max_clients: int, pool_verifier: str | None = None,
                 default_major: int | str = 2, root: Path = ROOT, profile: Path | None = None) -> None:
        # root: the checkout whose code runs (bench/pool_cost.py's A/B against another commit); profile: run it
        # under cProfile, stats written there when it stops (python -m bench.pool_cost serve-profiled)
        super().__init__()
        config = self.dir / "openwop-seat.toml"
        sections = {
            "proxy": {"listen": f"127.0.0.1:{self.port}", "upstream": f"127.0.0.1:{cluster.port}",
                      "workers": 1, "max_client_conn": max_clients, "shutdown_timeout": 5,
                      # "raw" for the floor's comparison: the seat's relay without its read path (issue 27)
                      "default_major": default_major,
                      # the major-1 reader of the era2_page_major1_text workload (pgbench's PGAPPNAME)
                      "clients": [{"application_name": V1_APPLICATION, "major": 1}]},
            "host": {"dsn": cluster.dsn()},
        }
        if pool_verifier is not None:  # the seat with reuse ([pool], ADR 0016): the superuser's SCRAM verifier
            users = self.dir / "pool-users.txt"
            users.write_text(f'"{cluster.superuser}" "{pool_verifier}"\n')
            sections["pool"] = {"enabled": True, "auth_file": str(users)}
        config.write_text(render_config(sections))
        command = [sys.executable, "-m", "proxy", "serve", "--config", str(config)]
        if profile is not None:
            command = [sys.executable, "-m", "bench.pool_cost", "serve-profiled", str(profile), str(config)]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=root)
        self._wait_started()

    def stop(self, sig: signal.Signals = signal.SIGINT) -> None:
        if sig != signal.SIGINT and self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        super().stop()


class BareRelay(_Process):
    """The floor (issue 27): ``python -m bench.bare_relay``, a bare uvloop relay with no framing, in front of the
    cluster, in a process of its own so that its CPU is measured as the seat's is."""

    name = "floor"

    def __init__(self, cluster: DevCluster) -> None:
        super().__init__()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "bench.bare_relay", "--listen", str(self.port),
                                          "--upstream", f"127.0.0.1:{cluster.port}"],
                                         stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        self._wait_started()


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far, from /proc/PID/stat (fields 14 and 15)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": field 3 is fields[0]
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def backend_cpu_ns(pid: int) -> int:
    """Nanoseconds a process of this machine (a backend of the throwaway cluster) has run on a CPU, from
    /proc/PID/schedstat: CPU time, not wall time, so other load on a shared machine does not count."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def rss_kib(pid: int) -> int:
    """Resident set size of a process, from /proc/PID/status (VmRSS, in KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise StackError(f"no VmRSS in /proc/{pid}/status")


def git_commit() -> tuple[str, bool]:
    """The checkout's short commit ("unknown" outside git) and whether tracked files differ from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    if head.returncode != 0:
        return "unknown", False
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, cwd=ROOT).stdout.strip() != ""
    return head.stdout.strip(), dirty


def machine(server_version: str, pgbouncer: str, pgbench: str) -> dict:
    """Where the figures were taken: CPU, cores, memory, kernel, and the versions of everything measured."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    return {
        "cpu_model": cpu,
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "memory_mib": mem_kib // 1024 if mem_kib else None,
        "kernel": platform.release(),
        "os": platform.platform(),
        "postgresql": server_version,
        "pgbouncer": version_of(pgbouncer),
        "pgbench": version_of(pgbench),
        "python": platform.python_version(),
        "asyncpg": asyncpg.__version__,
        "openwop_seat": __version__,
    }
