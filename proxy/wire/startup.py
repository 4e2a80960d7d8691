"""Startup parameters read exactly as PostgreSQL reads them, and the seat's allowlist of them (ADR 0006).

PostgreSQL (``ProcessStartupPacket``, ``process_startup_options``) takes ``user``,
``database``, ``replication`` and ``options`` from the startup packet, ignores
protocol options named ``_pq_.*`` (it answers them with NegotiateProtocolVersion),
and sets every other parameter as a setting of that name.  ``options`` is split
into words by ``pg_split_opts`` (white space separates words, a backslash makes the
next character part of the word) and read by ``process_postgres_switches``
(``getopt`` over the server's switches): ``-c name=value``, ``-cname=value`` and
``--name=value`` set a setting, and in the name every ``-`` becomes ``_``.
An empty or absent ``database`` means the database named like the user.  Names
are truncated to NAMEDATALEN - 1 bytes.

The seat allows only the settings in :data:`ALLOWED_SETTINGS`, however they are
spelled (a startup parameter, ``-c``, ``--``), and none of ``openwop_seat.*``;
every other switch of ``options`` is refused.  Pure code: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.errors import SeatException

NAMEDATALEN = 64

# The settings a client may give at startup (names as PostgreSQL compares them: lower case).  They are what
# drivers send (libpq, JDBC, node-postgres, asyncpg, psycopg) and what a host needs to pick its session's
# behaviour.  None of them is a logging, debugging or planner setting: nothing in this list can make the
# server write a statement's text or parameters anywhere, nor change how the seat's claim is resolved (it is
# fully qualified and its functions pin their search_path).
ALLOWED_SETTINGS = frozenset({
    "application_name",
    "client_encoding",
    "datestyle",
    "timezone",
    "intervalstyle",
    "extra_float_digits",
    "search_path",
    "statement_timeout",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "idle_session_timeout",
    "standard_conforming_strings",
    "bytea_output",
    "default_transaction_isolation",
    "default_transaction_deferrable",
    "geqo",
})

# Startup packet fields that are not settings (PostgreSQL's own); ``replication`` is refused below.
_PACKET_FIELDS = frozenset({"user", "database", "options"})

# The switches of process_postgres_switches() (its getopt string), so that a clustered or separate argument
# is read as PostgreSQL reads it: a letter followed by ':' takes an argument.
_GETOPT = "B:bC:c:D:d:EeFf:h:ijk:lN:nOPp:r:S:sTt:v:W:-:"
_WITH_ARG = frozenset(_GETOPT[i] for i in range(len(_GETOPT) - 1) if _GETOPT[i + 1] == ":" and _GETOPT[i] != ":")
_SWITCHES = frozenset(c for c in _GETOPT if c != ":")

_SPACE = " \t\n\v\f\r"  # isspace() in the C locale, as pg_split_opts uses it


class StartupRefused(SeatException):
    """A startup packet the seat does not relay; ``str(e)`` is the FATAL's message, ``sqlstate`` its SQLSTATE."""

    def __init__(self, message: str, sqlstate: str = "42501"):
        super().__init__(message)
        self.sqlstate = sqlstate


@dataclass
class Startup:
    """What a startup packet means to PostgreSQL."""

    user: str
    database: str  # the effective database: the user name when empty or absent
    settings: list[tuple[str, str]] = field(default_factory=list)  # in the order PostgreSQL applies them


def split_options(options: str) -> list[str]:
    """``pg_split_opts``: white space separates words; a backslash makes the next character literal."""
    words: list[str] = []
    i, n = 0, len(options)
    while i < n:
        while i < n and options[i] in _SPACE:
            i += 1
        if i >= n:
            break
        word: list[str] = []
        escape = False
        while i < n:
            c = options[i]
            if c in _SPACE and not escape:
                break
            if not escape and c == "\\":
                escape = True
            else:
                escape = False
                word.append(c)
            i += 1
        words.append("".join(word))
    return words


def _long_option(arg: str, flag: str) -> tuple[str, str]:
    """``ParseLongOption``: ``name=value``, every ``-`` in the name read as ``_``; a value is required."""
    name, eq, value = arg.partition("=")
    name = name.replace("-", "_")
    if not eq:
        raise StartupRefused(f"startup options: {'--' if flag == '-' else '-c '}{name} requires a value", "42601")
    return name, value


def option_settings(options: str) -> list[tuple[str, str]]:
    """The settings ``options`` makes, read like ``process_postgres_switches``; StartupRefused for anything else."""
    argv = split_options(options)
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            raise StartupRefused(f"startup options: invalid command-line argument {arg!r}", "42601")
        j = 1
        while j < len(arg):
            flag = arg[j]
            if flag not in _SWITCHES:
                raise StartupRefused(f"startup options: invalid switch -{flag}", "42601")
            if flag in _WITH_ARG:
                if j + 1 < len(arg):
                    optarg = arg[j + 1:]
                elif i + 1 < len(argv):
                    i += 1
                    optarg = argv[i]
                else:
                    raise StartupRefused(f"startup options: -{flag} requires an argument", "42601")
                if flag not in "c-":
                    raise StartupRefused(f"startup options: the switch -{flag} is not allowed through openwop-seat "
                                         f"(only -c name=value and --name=value)")
                out.append(_long_option(optarg, flag))
                break
            raise StartupRefused(f"startup options: the switch -{flag} is not allowed through openwop-seat "
                                 f"(only -c name=value and --name=value)")
        i += 1
    return out


def _truncate(name: str) -> str:
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) < NAMEDATALEN:
        return name
    return raw[:NAMEDATALEN - 1].decode("utf-8", "surrogateescape")


def refusal(name: str) -> str | None:
    """Why the setting ``name`` may not be set by a client at startup, or None when it may."""
    lowered = name.lower()
    if lowered.startswith("openwop_seat."):
        return f"{name}: openwop_seat.* settings belong to the seat and cannot be set by a client"
    if lowered not in ALLOWED_SETTINGS:
        return (f"{name}: this setting may not be given at startup through openwop-seat (allowed: "
                f"{', '.join(sorted(ALLOWED_SETTINGS))}); set it with SET after connecting")
    return None


def parse_startup(params: dict[str, str]) -> Startup:
    """Read a startup packet's parameters as PostgreSQL does; StartupRefused for what the seat does not allow.

    ``options`` are applied first, then the other parameters in packet order (as PostgreSQL does).
    """
    user = params.get("user", "")
    if not user:
        raise StartupRefused("no PostgreSQL user name specified in startup packet", "28000")
    database = params.get("database") or user
    settings: list[tuple[str, str]] = []
    for name, value in params.items():
        if name == "replication":
            raise StartupRefused("replication connections are not relayed by openwop-seat", "08P01")
        if name.startswith("_pq_."):
            continue  # a protocol option: PostgreSQL answers it with NegotiateProtocolVersion, sets nothing
    if "options" in params:
        settings.extend(option_settings(params["options"]))
    settings.extend((n, v) for n, v in params.items()
                    if n not in _PACKET_FIELDS and not n.startswith("_pq_."))
    for name, _ in settings:
        why = refusal(name)
        if why is not None:
            where = "startup parameter" if name in params else "startup options"
            raise StartupRefused(f"{where} {why}")
    return Startup(_truncate(user), _truncate(database), settings)
