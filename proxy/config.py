"""The seat's configuration: a TOML file, validated strictly (unknown keys are errors)."""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from typing import Any

from proxy.errors import SeatException

CONFIG_ENV = "OPENWOP_SEAT_CONFIG"

MAJORS = (1, 2, "raw")
SSLMODES = ("disable", "prefer", "require", "verify-full")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
SHUTDOWN_MODES = ("idle", "drain")
MAX_RESET_DELAY = 10.0  # pool.server_reset_delay's bound, in seconds


class ConfigError(SeatException):
    """The configuration is invalid; the message names the offending key."""


@dataclass(frozen=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def missing_claim_secret(config: "Config") -> ConfigError | None:
    """The error of a configuration that gives sessions major 2 without a claim secret (docs/operations.md)."""
    why = config.gives_major_2
    if why is None:
        return None
    return ConfigError(f"claim secret: none configured (host.claim_secret_file, else $OPENWOP_SEAT_CLAIM_SECRET), "
                       f"but {why} gives sessions major 2, and a session writes as a v2 writer only once it is "
                       f"claimed with the secret migrate installed: set one of them (see docs/writer-rule.md"
                       f"#the-claim-secret), or give no session major 2")


def parse_hostport(text: Any, key: str) -> HostPort:
    if not isinstance(text, str) or not text:
        raise ConfigError(f"{key}: expected \"HOST:PORT\", got {text!r}")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{key}: expected \"HOST:PORT\", got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return HostPort(host, int(port))


@dataclass(frozen=True)
class ClientRule:
    """A `[[proxy.clients]]` entry: startup parameters to match and the major they get."""

    major: int | str
    user: str | None = None
    database: str | None = None
    application_name: str | None = None

    def matches(self, params: dict[str, str]) -> bool:
        for name in ("user", "database", "application_name"):
            want = getattr(self, name)
            if want is None:
                continue
            # PostgreSQL defaults the database to the user name.
            have = params.get(name, params.get("user") if name == "database" else None)
            if have != want:
                return False
        return True


@dataclass(frozen=True)
class TLSConfig:
    cert_file: str | None = None
    key_file: str | None = None
    upstream_sslmode: str = "disable"
    upstream_ca_file: str | None = None


@dataclass(frozen=True)
class PoolConfig:
    """Pooled server connections (`[pool]`, ADR 0016): off by default, because a handed-over backend needs the
    client's authentication to happen at the seat, against verifiers the operator gives it."""

    enabled: bool = False
    auth_file: str | None = None  # PgBouncer's userlist.txt format: the SCRAM-SHA-256 verifiers of pooled users
    # …and/or a query with $1 (the user name) run on the seat's own connection (host.dsn), returning the verifier
    auth_query: str | None = None
    pool_size: int = 20  # server connections per pool (database, user, major, startup parameters)
    max_db_connections: int = 0  # server connections per database over all its pools; 0: no limit
    server_idle_timeout: float = 600.0  # an idle pooled server connection is closed after this long; 0: never
    server_lifetime: float = 3600.0  # …and once it is this old, when its client leaves; 0: never
    query_wait_timeout: float = 120.0  # how long a client waits for a server connection of a full pool; 0: forever
    # a backend reset (and its claim checked) less than this long ago is handed over without checking its claim
    # again (PgBouncer's server_check_delay); 0: checked before every hand-over
    server_check_delay: float = 30.0
    # how long a backend whose client left waits for the next client, who has it reset during its login, before it
    # is reset on its own; 0: reset as its client leaves (at most 10 s: the last client's locks last until the reset)
    server_reset_delay: float = 0.005


@dataclass(frozen=True)
class HostConfig:
    """Where the host keeps its runs and events (`[host]`)."""

    events_table: str = "events"
    runs_table: str = "runs"
    run_id_column: str = "run_id"
    type_column: str = "type"
    payload_column: str = "payload"  # jsonb: projected for major-2 readers of era-2 rows
    # Optional columns the projection reads (None: the table has none): eventId in refusals, the fill of a
    # required nodeId, and the run's tenant for run.started's legacy Subject (a column of runs_table).
    event_id_column: str | None = "event_id"
    node_id_column: str | None = "node_id"
    tenant_column: str | None = "tenant_id"
    era_column: str | None = None  # a nullable column of runs_table to use as the era store instead of run_era
    dsn: str | None = None  # how the seat itself reaches the host database (schema checks); its dbname is translated
    claim_secret_file: str | None = None  # the secret of openwop_seat.claim (else $OPENWOP_SEAT_CLAIM_SECRET)
    maintenance_role: str | None = None  # the one role that may UPDATE events.type/run_id (None: nobody)
    # The host's own per-run append lock, as an SQL expression over `run_id` (the run's id as text), e.g.
    # "pg_advisory_xact_lock(hashtext(run_id), 1)". The cutover tools take it before they write to a run, so
    # they serialise with the host's appends as the host's appends do with each other (None: the host has none).
    append_lock: str | None = None
    # The key under which a closed, hatched payload definition carries the stored keys it has no seat for
    # (docs/payload-projection.md, ADR 0007): a key the hatch admits; a vendor.<org> carrier needs <org>
    # registered in the pinned declaration.json (checked where the artifacts are loaded).
    payload_carrier: str = "x-v1"
    # The operator's declarations of the host's own payload names (docs/payload-projection.md, ADR 0010): a TOML
    # file of per-v2-type key aliases and legacy values, checked against the pinned artifacts where they are
    # loaded; its digest is recorded by migrate and every replica must run the same (None: no declarations).
    declarations_file: str | None = None
    # How often a running seat checks that the writer rule is in force (triggers, functions, digest); 0: only at
    # start, on /readyz and on SIGHUP.
    check_interval: float = 10.0
    # The v2 store (ADR 0015): era-2 rows kept already translated beside the host's, so that a major-2 read of
    # a filled run costs about a direct read; installed by migrate (false: not installed, every major-2 read
    # of an era-2 row is translated at read time), filled by serve every store_fill_interval seconds (0: never).
    store: bool = True
    store_fill_interval: float = 5.0
    # The era-3 page (ADR 0024): a run's page read first as an era-3 run's rows as stored, where migrate made
    # events_m2_run_era3 (false: every page goes as the page statement).
    fast_page: bool = True


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask, not the whole machine)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


_OPTIONAL_COLUMNS = ("event_id_column", "node_id_column", "tenant_column")


def _identifier(value: Any, key: str, qualified: bool) -> str:
    text = _string(value, key)
    parts = text.split(".")
    if len(parts) > (2 if qualified else 1) or not all(p and p.replace("_", "a").replace("$", "a").isalnum()
                                                       and not p[0].isdigit() for p in parts):
        what = "a table name, optionally schema-qualified" if qualified else "a column name"
        raise ConfigError(f"{key}: expected {what} (letters, digits, _ and $), got {text!r}")
    return text


@dataclass(frozen=True)
class Config:
    listen: HostPort = HostPort("127.0.0.1", 6543)
    upstream: HostPort = HostPort("127.0.0.1", 5432)
    default_major: int | str = 2
    clients: tuple[ClientRule, ...] = ()
    shutdown_timeout: float = 30.0
    # What a drain (SIGTERM) waits for: "idle" ends each session once it is idle outside a transaction; "drain"
    # waits for each session to end on its own. Both end the rest after shutdown_timeout.
    shutdown_mode: str = "idle"
    # SO_REUSEPORT on the listen socket even with one worker: another seat may bind the same port (rolling restart)
    so_reuseport: bool = False
    connect_timeout: float = 10.0
    startup_timeout: float = 60.0
    buffer_limit: int = 1 << 20
    claim_buffer_limit: int = 1 << 20  # bytes held from a client while its claim is in flight; more: FATAL 54000
    # processes sharing the listen port (SO_REUSEPORT) under a supervisor when > 1; default one per CPU
    workers: int = field(default_factory=lambda: cpu_count())
    max_client_conn: int = 1000  # sessions past their startup packet; more are refused with 53300
    client_idle_timeout: float = 0.0  # seconds; 0: off. Closes idle sessions (not in a transaction) with 57P05
    # The statement plans each worker keeps per major (texts and rewrites), in bytes; and the largest statement
    # naming the events table it analyses (a larger one is refused: parsing runs on the event loop).
    plan_cache_bytes: int = 32 << 20
    max_statement_bytes: int = 1 << 20
    # Also accept clients on <dir>/.s.PGSQL.<listen port>, as PostgreSQL names its socket (None: TCP only).
    unix_socket_dir: str | None = None
    metrics_listen: HostPort | None = None
    admin_listen: HostPort | None = None  # the admin console ([admin]); off by default
    admin_unix_socket: str | None = None
    # Who may log in to the admin console, and how (ADR 0014): names listed here, each with a secret in the
    # auth file (PgBouncer's userlist.txt format); "trust" only for a console on a Unix socket alone.
    admin_users: tuple[str, ...] = ()
    admin_auth_file: str | None = None
    admin_auth: str = "scram-sha-256"
    database_user_labels: int = 100  # (database, user) label pairs per process; later pairs count as "(other)"
    tls: TLSConfig = field(default_factory=TLSConfig)
    pool: PoolConfig = field(default_factory=PoolConfig)
    host: HostConfig = field(default_factory=HostConfig)
    log_format: str = "text"
    log_level: str = "info"
    # PgBouncer's log_connections and log_disconnections: the "session start" and "session end" lines
    log_connections: bool = True
    log_disconnections: bool = True
    source: str | None = None  # the file it was read from
    overrides: tuple[tuple[str, str], ...] = ()  # command-line overrides, re-applied by a reload

    @property
    def translates(self) -> bool:
        """Whether any session can get a translated major (1 or 2)."""
        return self.default_major != "raw" or any(rule.major != "raw" for rule in self.clients)

    @property
    def gives_major_2(self) -> str | None:
        """The key that gives some session major 2 (``proxy.default_major`` or a ``proxy.clients[i]``), or None.

        A major-2 session writes as a v2 writer only once it is claimed, which needs the claim secret: without one
        its runs would be stored era 2 and its appends to era-3 runs refused, so ``serve`` refuses to start."""
        if self.default_major == 2:
            return "proxy.default_major = 2"
        for i, rule in enumerate(self.clients):
            if rule.major == 2:
                return f"proxy.clients[{i}] (major = 2)"
        return None

    def major_for(self, params: dict[str, str]) -> int | str:
        """The major of a session: the first matching client rule, else the default."""
        for rule in self.clients:
            if rule.matches(params):
                return rule.major
        return self.default_major

    def with_overrides(self, listen: str | None = None, upstream: str | None = None,
                       metrics_listen: str | None = None) -> "Config":
        changes: dict[str, Any] = {}
        given = {"listen": listen, "upstream": upstream, "metrics_listen": metrics_listen}
        changes["overrides"] = tuple((k, v) for k, v in given.items() if v)
        if listen:
            changes["listen"] = parse_hostport(listen, "--listen")
        if upstream:
            changes["upstream"] = _upstream(upstream, "--upstream")
        if metrics_listen:
            changes["metrics_listen"] = parse_hostport(metrics_listen, "--metrics-listen")
        return replace(self, **changes)


def _major(value: Any, key: str) -> int | str:
    if isinstance(value, bool) or value not in MAJORS:
        raise ConfigError(f"{key}: expected 1, 2 or \"raw\", got {value!r}")
    return value


def _number(value: Any, key: str, minimum: float) -> float:
    # TOML has nan and inf: neither is a duration or a size (nan passes every comparison's "not less")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < minimum:
        raise ConfigError(f"{key}: expected a finite number >= {minimum}, got {value!r}")
    return float(value)


def _at_most(value: Any, key: str, minimum: float, maximum: float) -> float:
    number = _number(value, key, minimum)
    if number > maximum:
        raise ConfigError(f"{key}: expected a number of seconds <= {maximum:g}, got {value!r}")
    return number


def _integer(value: Any, key: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    return value


def _string(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: expected a non-empty string, got {value!r}")
    return value


def _choice(value: Any, key: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{key}: expected one of {', '.join(choices)}, got {value!r}")
    return value


def _existing_file(path: str, key: str, base: str | None) -> str:
    if base and not os.path.isabs(path):
        path = os.path.join(os.path.dirname(base), path)
    if not os.path.isfile(path):
        raise ConfigError(f"{key}: no such file {path!r}")
    return path


_BAD = object()  # a value that failed its check: its error is collected, the key is left at its default


class _Errors:
    """Collects every configuration error, so that one run names them all (not only the first)."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def check(self, fn, *args) -> Any:
        try:
            return fn(*args)
        except ConfigError as e:
            self.messages.append(str(e))
            return _BAD

    def add(self, message: str) -> None:
        self.messages.append(message)

    def set(self, out: dict[str, Any], key: str, fn, *args) -> None:
        value = self.check(fn, *args)
        if value is not _BAD:
            out[key] = value

    def raise_any(self) -> None:
        if len(self.messages) == 1:
            raise ConfigError(self.messages[0])
        if self.messages:
            raise ConfigError(f"{len(self.messages)} errors:\n" + "\n".join(f"  {m}" for m in self.messages))


def _section(errors: _Errors, table: Any, section: str, allowed: set[str]) -> dict[str, Any]:
    """``table`` with its unknown keys reported (each one), or {} when it is not a table."""
    if not isinstance(table, dict):
        errors.add(f"[{section}] must be a table" if section else "the configuration must be a table")
        return {}
    for key in table:
        if key not in allowed:
            errors.add(f"unknown key {section}.{key}" if section else f"unknown key {key}")
    return table


def _upstream(text: Any, key: str) -> HostPort:
    """``proxy.upstream``: a TCP address. A Unix socket directory (libpq's host=/run/postgresql) is refused with
    what to write instead: the seat reaches PostgreSQL over TCP only."""
    if isinstance(text, str) and text.startswith(("/", "@")):
        raise ConfigError(f"{key}: {text!r} looks like a Unix socket directory; the seat reaches PostgreSQL over "
                          f"TCP only: give \"HOST:PORT\" (for a local server \"127.0.0.1:5432\", with a host line "
                          f"for 127.0.0.1 in pg_hba.conf)")
    hp = parse_hostport(text, key)
    if hp.host.startswith(("/", "@")):
        raise ConfigError(f"{key}: {hp.host!r} looks like a Unix socket directory; the seat reaches PostgreSQL "
                          f"over TCP only: give \"HOST:PORT\"")
    if hp.port == 0:
        raise ConfigError(f"{key}: port 0 is not a port to connect to, got {text!r}")
    return hp


def parse_config(data: dict[str, Any], source: str | None = None) -> Config:
    """The configuration of ``data`` (a parsed TOML file); a ConfigError naming every invalid key at once."""
    errors = _Errors()
    _section(errors, data, "", {"proxy", "metrics", "tls", "log", "host", "admin", "pool"})
    proxy = _section(errors, data.get("proxy", {}), "proxy",
                     {"listen", "upstream", "default_major", "clients", "shutdown_timeout", "shutdown_mode",
                      "so_reuseport", "connect_timeout", "startup_timeout", "buffer_limit", "claim_buffer_limit",
                      "max_client_conn", "client_idle_timeout", "workers", "plan_cache_bytes",
                      "max_statement_bytes", "unix_socket_dir"})
    kwargs: dict[str, Any] = {"source": source}
    put = errors.set
    if "listen" in proxy:
        put(kwargs, "listen", parse_hostport, proxy["listen"], "proxy.listen")
    if "upstream" in proxy:
        put(kwargs, "upstream", _upstream, proxy["upstream"], "proxy.upstream")
    if "default_major" in proxy:
        put(kwargs, "default_major", _major, proxy["default_major"], "proxy.default_major")
    if "shutdown_timeout" in proxy:
        put(kwargs, "shutdown_timeout", _number, proxy["shutdown_timeout"], "proxy.shutdown_timeout", 0)
    if "shutdown_mode" in proxy:
        put(kwargs, "shutdown_mode", _choice, proxy["shutdown_mode"], "proxy.shutdown_mode", SHUTDOWN_MODES)
    if "so_reuseport" in proxy:
        put(kwargs, "so_reuseport", _bool, proxy["so_reuseport"], "proxy.so_reuseport")
    if "connect_timeout" in proxy:
        put(kwargs, "connect_timeout", _number, proxy["connect_timeout"], "proxy.connect_timeout", 0.001)
    if "startup_timeout" in proxy:
        put(kwargs, "startup_timeout", _number, proxy["startup_timeout"], "proxy.startup_timeout", 0.001)
    if "buffer_limit" in proxy:
        put(kwargs, "buffer_limit", lambda v: int(_number(v, "proxy.buffer_limit", 1024)), proxy["buffer_limit"])
    if "claim_buffer_limit" in proxy:
        put(kwargs, "claim_buffer_limit", _integer, proxy["claim_buffer_limit"], "proxy.claim_buffer_limit", 1024)
    if "workers" in proxy:  # an integer >= 1, or "auto": one per CPU
        put(kwargs, "workers", lambda v: cpu_count() if v == "auto" else _integer(v, "proxy.workers", 1),
            proxy["workers"])
    if "max_client_conn" in proxy:
        put(kwargs, "max_client_conn", _integer, proxy["max_client_conn"], "proxy.max_client_conn", 1)
    if "client_idle_timeout" in proxy:
        put(kwargs, "client_idle_timeout", _number, proxy["client_idle_timeout"], "proxy.client_idle_timeout", 0)
    for key, low in (("plan_cache_bytes", 0), ("max_statement_bytes", 1024)):
        if key in proxy:
            put(kwargs, key, _integer, proxy[key], f"proxy.{key}", low)
    if "unix_socket_dir" in proxy:
        put(kwargs, "unix_socket_dir", _unix_socket_dir, proxy["unix_socket_dir"], source)
    rules = proxy.get("clients", [])
    if not isinstance(rules, list):
        errors.add("proxy.clients: expected an array of tables ([[proxy.clients]])")
        rules = []
    parsed_rules = []
    for i, rule in enumerate(rules):
        where = f"proxy.clients[{i}]"
        before = len(errors.messages)
        rule = _section(errors, rule, where, {"user", "database", "application_name", "major"})
        if "major" not in rule:
            errors.add(f"{where}.major: required")
        match = {k: errors.check(_string, rule[k], f"{where}.{k}")
                 for k in ("user", "database", "application_name") if k in rule}
        if not match:
            errors.add(f"{where}: name at least one of user, database, application_name")
        major = errors.check(_major, rule["major"], f"{where}.major") if "major" in rule else _BAD
        if len(errors.messages) == before:
            parsed_rules.append(ClientRule(major=major, **match))
    kwargs["clients"] = tuple(parsed_rules)

    metrics = _section(errors, data.get("metrics", {}), "metrics", {"listen", "database_user_labels"})
    if "listen" in metrics:
        put(kwargs, "metrics_listen", parse_hostport, metrics["listen"], "metrics.listen")
    if "database_user_labels" in metrics:
        put(kwargs, "database_user_labels", _integer, metrics["database_user_labels"],
            "metrics.database_user_labels", 0)

    kwargs.update(_admin_keys(errors, data.get("admin", {}), source))
    kwargs["pool"] = _pool_keys(errors, data.get("pool", {}), source)

    tls = _section(errors, data.get("tls", {}), "tls",
                   {"cert_file", "key_file", "upstream_sslmode", "upstream_ca_file"})
    tls_kwargs: dict[str, Any] = {}
    for key in ("cert_file", "key_file", "upstream_ca_file"):
        if key in tls:
            put(tls_kwargs, key, lambda v, k=key: _existing_file(_string(v, f"tls.{k}"), f"tls.{k}", source),
                tls[key])
    if "upstream_sslmode" in tls:
        put(tls_kwargs, "upstream_sslmode", _choice, tls["upstream_sslmode"], "tls.upstream_sslmode", SSLMODES)
    if ("cert_file" in tls) != ("key_file" in tls):
        errors.add("tls.cert_file and tls.key_file: set both or neither")
    if tls.get("upstream_sslmode") == "verify-full" and "upstream_ca_file" not in tls:
        errors.add("tls.upstream_ca_file: required when tls.upstream_sslmode is verify-full")
    if ("cert_file" in tls_kwargs) == ("key_file" in tls_kwargs) and not (
            tls_kwargs.get("upstream_sslmode") == "verify-full" and "upstream_ca_file" not in tls_kwargs):
        kwargs["tls"] = TLSConfig(**tls_kwargs)

    host = _section(errors, data.get("host", {}), "host",
                    {"events_table", "runs_table", "run_id_column", "type_column", "era_column", "dsn",
                     "claim_secret_file", "maintenance_role", "payload_column", "append_lock", "payload_carrier",
                     "check_interval", "declarations_file", "store", "store_fill_interval", "fast_page",
                     *_OPTIONAL_COLUMNS})
    host_kwargs: dict[str, Any] = {}
    for k in ("events_table", "runs_table", "run_id_column", "type_column", "era_column", "payload_column"):
        if k in host:
            put(host_kwargs, k, _identifier, host[k], f"host.{k}", k.endswith("_table"))
    for k in _OPTIONAL_COLUMNS:  # "" says the table has no such column
        if k in host:
            put(host_kwargs, k, lambda v, k=k: None if v == "" else _identifier(v, f"host.{k}", False), host[k])
    if "dsn" in host:
        put(host_kwargs, "dsn", _string, host["dsn"], "host.dsn")
    if "claim_secret_file" in host:  # read (and checked) by schema.load_claim_secret, relative to the config file
        put(host_kwargs, "claim_secret_file",
            lambda v: os.path.join(os.path.dirname(source), _string(v, "host.claim_secret_file")) if source
            else _string(v, "host.claim_secret_file"), host["claim_secret_file"])
    if "declarations_file" in host:  # read and checked against the artifacts by proxy.artifacts.declarations
        put(host_kwargs, "declarations_file",
            lambda v: _existing_file(_string(v, "host.declarations_file"), "host.declarations_file", source),
            host["declarations_file"])
    if "check_interval" in host:
        put(host_kwargs, "check_interval", _number, host["check_interval"], "host.check_interval", 0)
    if "store" in host:
        put(host_kwargs, "store", _bool, host["store"], "host.store")
    if "store_fill_interval" in host:
        put(host_kwargs, "store_fill_interval", _number, host["store_fill_interval"], "host.store_fill_interval", 0)
    if "fast_page" in host:
        put(host_kwargs, "fast_page", _bool, host["fast_page"], "host.fast_page")
    if "maintenance_role" in host:
        put(host_kwargs, "maintenance_role", _string, host["maintenance_role"], "host.maintenance_role")
    if "append_lock" in host:
        put(host_kwargs, "append_lock", _append_lock, host["append_lock"])
    if "payload_carrier" in host:
        put(host_kwargs, "payload_carrier", _payload_carrier, host["payload_carrier"])
    kwargs["host"] = HostConfig(**host_kwargs)
    workers = kwargs.get("workers", cpu_count())
    if kwargs.get("unix_socket_dir") and workers > 1:
        errors.add("proxy.unix_socket_dir: needs proxy.workers = 1 (one process owns the socket file)")

    log = _section(errors, data.get("log", {}), "log", {"format", "level", "connections", "disconnections"})
    if "format" in log:
        put(kwargs, "log_format", _choice, log["format"], "log.format", LOG_FORMATS)
    if "level" in log:
        put(kwargs, "log_level", _choice, log["level"], "log.level", LOG_LEVELS)
    if "connections" in log:
        put(kwargs, "log_connections", _bool, log["connections"], "log.connections")
    if "disconnections" in log:
        put(kwargs, "log_disconnections", _bool, log["disconnections"], "log.disconnections")
    errors.raise_any()
    return Config(**kwargs)


def _admin_unix_socket(value: Any, source: str | None) -> str:
    path = _string(value, "admin.unix_socket")
    path = os.path.join(os.path.dirname(source), path) if source and not os.path.isabs(path) else path
    if len(path.encode()) > 107:
        raise ConfigError(f"admin.unix_socket: {path!r} is too long for a socket path (at most 107 bytes)")
    if not os.path.isdir(os.path.dirname(path) or "."):
        raise ConfigError(f"admin.unix_socket: no such directory {os.path.dirname(path)!r}")
    return path


def _payload_carrier(value: Any) -> str:
    from proxy.artifacts.payload_shapes import CarrierError, check_carrier

    try:
        return check_carrier(value)
    except CarrierError as e:
        raise ConfigError(f"host.{e}".replace("host.payload carrier", "host.payload_carrier")) from None


ADMIN_AUTH = ("scram-sha-256", "md5", "trust")


def _admin_users(users: Any) -> tuple[str, ...]:
    if not isinstance(users, list) or not all(isinstance(u, str) and u for u in users):
        raise ConfigError(f"admin.users: expected a list of user names, got {users!r}")
    return tuple(users)


def _admin_keys(errors: _Errors, section: Any, source: str | None) -> dict[str, Any]:
    """[admin]: the console's listeners and who may log in (docs/operations.md#admin-console, ADR 0014).

    Never open by default: a console needs admin.users and admin.auth_file, or admin.auth = "trust" with a Unix
    socket alone (mode 0700: the seat's own user)."""
    admin = _section(errors, section, "admin", {"listen", "unix_socket", "users", "auth_file", "auth"})
    out: dict[str, Any] = {}
    put = errors.set
    if "listen" in admin:
        put(out, "admin_listen", parse_hostport, admin["listen"], "admin.listen")
    if "unix_socket" in admin:
        put(out, "admin_unix_socket", _admin_unix_socket, admin["unix_socket"], source)
    if "users" in admin:
        put(out, "admin_users", _admin_users, admin["users"])
    if "auth_file" in admin:
        put(out, "admin_auth_file",
            lambda v: _existing_file(_string(v, "admin.auth_file"), "admin.auth_file", source), admin["auth_file"])
    if "auth" in admin:
        put(out, "admin_auth", _choice, admin["auth"], "admin.auth", ADMIN_AUTH)
    if "listen" in admin or "unix_socket" in admin:
        if admin.get("auth") == "trust":
            if "listen" in admin:
                errors.add("admin.auth: \"trust\" only for a console on admin.unix_socket alone (mode 0700, the "
                           "seat's own user); with admin.listen set, list admin.users and their secrets in "
                           "admin.auth_file")
        elif not admin.get("users") or "auth_file" not in admin:
            errors.add("admin.users and admin.auth_file: required with admin.listen or admin.unix_socket (the "
                       "console is never open by default: list the admin users and give each a secret in the auth "
                       "file, or set admin.auth = \"trust\" for a Unix socket alone)")
    return out


def _pool_keys(errors: _Errors, section: Any, source: str | None) -> PoolConfig:
    """[pool]: pooled server connections (docs/configuration.md#pool, ADR 0016)."""
    pool = _section(errors, section, "pool", {f.name for f in fields(PoolConfig)})
    out: dict[str, Any] = {}
    put = errors.set
    if "enabled" in pool:
        put(out, "enabled", _bool, pool["enabled"], "pool.enabled")
    if "auth_file" in pool:
        put(out, "auth_file",
            lambda v: _existing_file(_string(v, "pool.auth_file"), "pool.auth_file", source), pool["auth_file"])
    if "auth_query" in pool:
        put(out, "auth_query", _auth_query, pool["auth_query"])
    for key, low in (("pool_size", 1), ("max_db_connections", 0)):
        if key in pool:
            put(out, key, _integer, pool[key], f"pool.{key}", low)
    for key in ("server_idle_timeout", "server_lifetime", "query_wait_timeout", "server_check_delay"):
        if key in pool:
            put(out, key, _number, pool[key], f"pool.{key}", 0)
    if "server_reset_delay" in pool:
        put(out, "server_reset_delay", _at_most, pool["server_reset_delay"], "pool.server_reset_delay", 0,
            MAX_RESET_DELAY)
    if pool.get("enabled") is True and "auth_file" not in pool and "auth_query" not in pool:
        errors.add("pool.auth_file or pool.auth_query: one is required with pool.enabled = true (a pooled server "
                   "connection is handed to a client that proves its password to the seat, against its user's "
                   "SCRAM-SHA-256 verifier from the file or the query; see docs/configuration.md#pool)")
    return PoolConfig(**out)


def _auth_query(value: Any) -> str:
    """One SQL statement with $1 (the user name), e.g. "SELECT rolpassword FROM pg_authid WHERE rolname = $1"."""
    text = _string(value, "pool.auth_query").strip().rstrip(";")
    if ";" in text or not re.search(r"\$1\b", text) or re.search(r"\$[2-9]", text):
        raise ConfigError("pool.auth_query: expected one SQL statement with $1 for the user name, such as "
                          f"\"SELECT passwd FROM pg_shadow WHERE usename = $1\", got {value!r}")
    return text


def unix_socket_path(directory: str, port: int) -> str:
    """PostgreSQL's name for the socket of a port: <dir>/.s.PGSQL.<port> (libpq's host=<dir> port=<port>)."""
    return os.path.join(directory, f".s.PGSQL.{port}")


def _unix_socket_dir(value: Any, source: str | None) -> str:
    path = _string(value, "proxy.unix_socket_dir")
    if source and not os.path.isabs(path):
        path = os.path.join(os.path.dirname(source), path)
    if len(unix_socket_path(path, 65535).encode()) > 107:  # sun_path holds 108 bytes with its NUL
        raise ConfigError(f"proxy.unix_socket_dir: {path!r} is too long for a socket path (at most 92 bytes)")
    if not os.path.isdir(path):
        raise ConfigError(f"proxy.unix_socket_dir: no such directory {path!r}")
    return path


def _append_lock(value: Any) -> str:
    """An SQL expression naming `run_id`; checked to be one expression, not a statement list."""
    text = _string(value, "host.append_lock").strip()
    if not text or ";" in text or not re.search(r"\brun_id\b", text):
        raise ConfigError("host.append_lock: expected one SQL expression over run_id, such as "
                          f"\"pg_advisory_xact_lock(hashtext(run_id), 1)\", got {text!r}")
    return text


def load_config(path: str | None) -> Config:
    """Read the config file named by ``path`` or $OPENWOP_SEAT_CONFIG; defaults when neither is set."""
    path = path or os.environ.get(CONFIG_ENV)
    if not path:
        return Config()
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    return parse_config(data, source=path)


# Keys a reload cannot apply to a running seat: they are logged as needing a restart and kept.
RESTART_KEYS = {"listen": "proxy.listen", "metrics_listen": "metrics.listen", "log_format": "log.format",
                "workers": "proxy.workers", "unix_socket_dir": "proxy.unix_socket_dir",
                "admin_listen": "admin.listen", "admin_unix_socket": "admin.unix_socket",
                "so_reuseport": "proxy.so_reuseport"}


_SECTIONED = {"tls": "tls", "host": "host", "pool": "pool"}


_TOP = {"metrics_listen": "metrics.listen", "database_user_labels": "metrics.database_user_labels",
        "admin_listen": "admin.listen", "admin_unix_socket": "admin.unix_socket",
        "admin_users": "admin.users", "admin_auth_file": "admin.auth_file", "admin_auth": "admin.auth",
        "log_format": "log.format", "log_level": "log.level", "log_connections": "log.connections",
        "log_disconnections": "log.disconnections"}


def config_keys(config: Config) -> dict[str, object]:
    """The configuration as {"section.key": value}, the names of the TOML file."""
    out: dict[str, object] = {}
    for f in fields(config):
        if f.name in ("source", "overrides"):
            continue
        value = getattr(config, f.name)
        if f.name in _SECTIONED:
            out.update((f"{_SECTIONED[f.name]}.{g.name}", getattr(value, g.name)) for g in fields(value))
        else:
            out[_TOP.get(f.name, f"proxy.{f.name}")] = value
    return out


def changed_keys(old: Config, new: Config) -> list[str]:
    a, b = config_keys(old), config_keys(new)
    return [k for k in a if a[k] != b[k]]


# --- `openwop-seat config`: the resolved configuration as TOML or JSON, secrets redacted -----------------------

REDACTED = "<redacted>"


def redact_dsn(dsn: str) -> str:
    """``dsn`` with its password replaced by <redacted>: a ``password=`` keyword (also in a URL's query) and the
    password of a URL's user info."""
    dsn = re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)", rf"\1{REDACTED}", dsn, flags=re.I)
    return re.sub(r"^([a-z][a-z0-9+.-]*://[^:/@]*):[^@/]*@", rf"\1:{REDACTED}@", dsn, flags=re.I)


def _plain(value: object) -> object:
    if isinstance(value, HostPort):
        return str(value)
    if isinstance(value, ClientRule):
        return {k: v for k, v in (("user", value.user), ("database", value.database),
                                  ("application_name", value.application_name), ("major", value.major))
                if v is not None}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def config_document(config: Config) -> dict[str, dict[str, object]]:
    """The configuration as nested sections of the TOML file's names ({"proxy": {"listen": …}, …}); None for a key
    that is not set; the password of ``host.dsn`` redacted."""
    out: dict[str, dict[str, object]] = {}
    for name, value in config_keys(config).items():
        section, key = name.split(".", 1)
        if name == "host.dsn" and isinstance(value, str):
            value = redact_dsn(value)
        out.setdefault(section, {})[key] = _plain(value)
    return out


def claim_secret_source(config: Config, environ: dict[str, str] | None = None) -> str | None:
    """Where the claim secret comes from, never the secret: the file, the environment variable, or None."""
    environ = os.environ if environ is None else environ
    if config.host.claim_secret_file is not None:
        return f"host.claim_secret_file ({config.host.claim_secret_file})"
    if environ.get("OPENWOP_SEAT_CLAIM_SECRET"):
        return "$OPENWOP_SEAT_CLAIM_SECRET"
    return None


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")  # pragma: no cover - config_document holds no other type


def render_toml(config: Config) -> str:
    """The resolved configuration as a TOML file ``serve`` reads back to the same configuration (a key that is not
    set is a comment; the password of ``host.dsn`` is <redacted>, the claim secret only named by its source)."""
    doc = config_document(config)
    source = claim_secret_source(config)
    lines = [f"# openwop-seat configuration, resolved from {config.source or 'the built-in defaults'}",
             f"# claim secret: {REDACTED} from {source}" if source else "# claim secret: none"]
    for section, keys in doc.items():
        rules = keys.pop("clients", None)
        lines += ["", f"[{section}]"]
        for key, value in keys.items():
            if value is None and section == "host" and key in _OPTIONAL_COLUMNS:
                value = ""  # the table has no such column: "" in the file
            lines.append(f"# {key}: not set" if value is None else f"{key} = {_toml_value(value)}")
        for rule in rules or ():
            lines += ["", f"[[{section}.clients]]"] + [f"{k} = {_toml_value(v)}" for k, v in rule.items()]
    return "\n".join(lines) + "\n"


def render_json(config: Config) -> str:
    """The resolved configuration as JSON: the sections of :func:`config_document` and ``claim_secret``, where the
    secret comes from (never the secret) or null."""
    import json

    source = claim_secret_source(config)
    doc: dict[str, object] = dict(config_document(config))
    doc["claim_secret"] = f"{REDACTED} from {source}" if source else None
    return json.dumps(doc, indent=2) + "\n"
