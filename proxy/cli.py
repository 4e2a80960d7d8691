"""The `openwop-seat` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from proxy import __version__
from proxy.config import CONFIG_ENV, ConfigError, load_config
from proxy.errors import describe

log = logging.getLogger("openwop_seat")


# What serve reads from its environment besides the configuration file (names as proxy.db.layout.CLAIM_SECRET_ENV
# and proxy.wire.framer.IMPLEMENTATION_ENV spell them; tests/unit/test_cli_help.py holds them to it).
SERVE_ENVIRONMENT = f"""environment:
  {CONFIG_ENV:<26} the configuration file, when --config is not given
  OPENWOP_SEAT_CLAIM_SECRET  the claim secret, when [host] claim_secret_file is not set
  OPENWOP_SEAT_FRAMER        c or python: the compiled core, the framer and the quiet read path (the
                             default where it is built), or the pure-Python one (ADR 0018); the
                             "listening" log line names the one in use"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="openwop-seat",
        description="A transparent PostgreSQL wire-protocol proxy that serves OpenWOP event logs by era.")
    parser.add_argument("--version", action="version", version=f"openwop-seat {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    serve = commands.add_parser(
        "serve", help="run the proxy",
        description="Accept PostgreSQL clients and relay each to its own upstream connection.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=SERVE_ENVIRONMENT)
    serve.add_argument("--config", metavar="FILE",
                       help=f"TOML configuration file (default: ${CONFIG_ENV}, else built-in defaults)")
    serve.add_argument("--listen", metavar="HOST:PORT", help="override [proxy] listen")
    serve.add_argument("--upstream", metavar="HOST:PORT", help="override [proxy] upstream")
    serve.add_argument("--metrics-listen", metavar="HOST:PORT", help="override [metrics] listen")
    # Set by the supervisor ([proxy] workers > 1) on the processes it starts; not for people.
    serve.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--worker-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--worker-start", type=int, default=0, help=argparse.SUPPRESS)
    serve.set_defaults(run=cmd_serve)

    config = commands.add_parser(
        "config", help="validate a configuration file and print what it resolves to",
        description="Load the configuration exactly as `serve` would and print every key as it resolves, as TOML "
                    "(or JSON with --json), the password of host.dsn and the claim secret redacted; exit 2 naming "
                    "every invalid key if invalid.")
    config.add_argument("--config", metavar="FILE", help=f"TOML configuration file (default: ${CONFIG_ENV})")
    config.add_argument("--json", action="store_true", help="print JSON instead of TOML")
    config.set_defaults(run=cmd_config)

    check = commands.add_parser(
        "check", help="validate the pinned spec artifacts and print their tag, digest and counts",
        description="Load the vendored spec artifacts as `serve` would; exit non-zero naming the first violation.")
    check.add_argument("--config", metavar="FILE", help=f"TOML configuration file (default: ${CONFIG_ENV})")
    check.set_defaults(run=lambda args: cmd_check(args.config))

    migrate = commands.add_parser(
        "migrate", help="install or upgrade the seat's schema (openwop_seat) in the host database",
        description="Apply the seat's schema steps, one transaction per step, under an advisory lock; "
                    "then record the artifact digest. Safe to run concurrently and repeatedly.")
    migrate.add_argument("--config", metavar="FILE", help=f"TOML configuration file (default: ${CONFIG_ENV})")
    migrate.add_argument("--dsn", required=True, metavar="DSN",
                         help="libpq-style connection string or URL of the host database, as the schema owner")
    migrate.set_defaults(run=lambda args: _lazy("db.migrate", "cmd_migrate")(load_config(args.config), args.dsn))

    pinned = commands.add_parser(
        "pinned-runs", help="list runs pinned to v1 change ids; continue or cancel them",
        description="List the non-terminal runs holding version.pinned events and their change ids. With "
                    "--implemented, say whether each continues (every pinned change id implemented) or must be "
                    "cancelled; with --cancel, append one run.cancelled {reason: v1_pin_unsupported, cancelledBy: "
                    "v2-cutover} to each, one run per transaction under its append locks. Exit 0, 1 (a run not "
                    "handled, a database error), 2 (bad input).")
    pinned.add_argument("--config", metavar="FILE", help=f"TOML configuration file (default: ${CONFIG_ENV})")
    pinned.add_argument("--dsn", required=True, metavar="DSN", help="connection string of the host database")
    pinned.add_argument("--implemented", metavar="FILE",
                        help="the change ids the host still implements: one per line; blank lines and lines "
                             "starting with # are skipped; an empty file is refused")
    pinned.add_argument("--cancel", action="store_true",
                        help="cancel the runs to cancel (needs --implemented and the claim secret)")
    pinned.set_defaults(run=lambda args: _lazy("tools.pinned", "cmd_pinned_runs")(
        load_config(args.config), args.dsn, args.implemented, args.cancel))

    adr = commands.add_parser(
        "adr", help="draft the ADR naming the seat and every host table's disposition",
        description="Write a Markdown ADR naming openwop-seat as the storage boundary (version, artifact tag and "
                    "digest) and the per-store disposition table of every table in the host database, prefilled "
                    "from the spec's template; read-only.")
    adr.add_argument("--config", metavar="FILE", help=f"TOML configuration file (default: ${CONFIG_ENV})")
    adr.add_argument("--dsn", required=True, metavar="DSN", help="connection string of the host database")
    adr.add_argument("--out", metavar="FILE", help="write the ADR to FILE (a new file) instead of stdout")
    adr.set_defaults(run=lambda args: _lazy("tools.adr", "cmd_adr")(load_config(args.config), args.dsn, args.out))

    explain = commands.add_parser(
        "explain", help="show how the seat classifies and rewrites one SQL string",
        description="Classify SQL as serve would, without a database: passthrough, translated (with the text "
                    "sent instead) or refused (with the reason). Exit 0 (sent), 1 (refused), 2 (bad input).")
    explain.add_argument("--config", metavar="FILE", help=f"TOML configuration file (default: ${CONFIG_ENV})")
    explain.add_argument("--major", type=lambda text: _lazy("tools.explain", "parse_major")(text), metavar="1|2|raw",
                         help="the session's major (default: proxy.default_major)")
    explain.add_argument("sql", metavar="SQL", help="the statement(s), as one Query string")
    explain.set_defaults(run=lambda args: _lazy("tools.explain", "cmd_explain")(load_config(args.config), args.sql,
                                                                        args.major))
    _add_audit(commands)
    _add_backfill(commands)
    _add_lifecycle(commands)
    return parser


def _add_audit(commands) -> None:
    audit = commands.add_parser(
        "audit", help="pre-flight: read every era-2 run through the reader rule, offline, and report what would fail",
        description="Read every era-2 run's events with the functions migrate installed (the reader rule and the "
                    "payload projection), in batches of runs, each a REPEATABLE READ READ ONLY transaction streamed "
                    "through a server-side cursor; report what would fail and why, and what would read but not "
                    "validate (schema-invalid). Exit 0: nothing would fail and nothing is schema-invalid; "
                    "1: some events would fail or are schema-invalid; 2: bad flags or configuration; "
                    "3: the database is unreachable or "
                    "not migrated with these artifacts.")
    audit.add_argument("--config", metavar="FILE", help=f"TOML configuration file (default: ${CONFIG_ENV})")
    audit.add_argument("--dsn", required=True, metavar="DSN", help="libpq-style connection string or URL of the "
                       "host database (read only: any role that can read the host's tables)")
    audit.add_argument("--json", metavar="PATH", help="also write the full report as JSON to PATH")
    audit.add_argument("--batch", type=int, default=500, metavar="N", help="runs per transaction (default 500)")
    audit.add_argument("--samples", type=int, default=5, metavar="N",
                       help="sample run ids and sequences kept per kind of failure (default 5)")
    audit.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    audit.set_defaults(run=lambda args: _lazy("tools.audit", "cmd_audit")(
        load_config(args.config), args.dsn, args.json, args.batch, args.samples, not args.no_progress))


def _add_backfill(commands) -> None:
    backfill = commands.add_parser(
        "backfill", help="convert era-2 runs to era 3 in place, one run per transaction (or --restore one)",
        description="Convert era-2 runs to era 3, one run per transaction under the run's append locks: preserve "
                    "the rows in openwop_seat.events_v1_original, rewrite type and payload to what the reader rule "
                    "returns, stamp era 3 (source backfill). A run that would fail the reader rule, or with a payload "
                    "that would be written schema-invalid (a required key nothing provides), is skipped and "
                    "reported. Resumable and idempotent. Connect as the owner of openwop_seat. Exit 0: every run "
                    "asked for is era 3 (or --restore done); 1: some run skipped or the restore refused; 2: bad "
                    "flags, configuration or run ids; 3: the database is unreachable, not migrated with these "
                    "artifacts, or the role is not the owner of openwop_seat.")
    backfill.add_argument("--config", metavar="FILE", help=f"TOML configuration file (default: ${CONFIG_ENV})")
    backfill.add_argument("--dsn", required=True, metavar="DSN", help="libpq-style connection string or URL of "
                          "the host database, as the owner of openwop_seat (the role that runs migrate)")
    which = backfill.add_mutually_exclusive_group(required=True)
    which.add_argument("--runs", nargs="+", metavar="ID", help="convert these runs")
    which.add_argument("--all", action="store_true", help="convert every era-2 run that has events")
    which.add_argument("--restore", metavar="RUN_ID",
                       help="put RUN_ID back as it was before its backfill: its preserved rows and era 2")
    backfill.add_argument("--dry-run", action="store_true",
                          help="report what would be converted or skipped; change nothing (read only)")
    backfill.add_argument("--repair", metavar="FILE",
                          help="a JSON object naming stored type spellings the codemap lacks and the codemap type "
                               "each stands for, e.g. {\"node.interrupt.resolved\": \"interrupt.resolved\"}: "
                               "the runs converted read those rows as that type; originals preserved, runs "
                               "stamped with source backfill-repair, every repair listed in the summary")
    backfill.add_argument("--allow-schema-invalid", action="store_true",
                          help="write payloads that would not validate against their v2 definition (a required "
                               "key nothing in the row provides) as they read, instead of skipping their runs; "
                               "the summary counts them")
    backfill.add_argument("--json", metavar="PATH", help="also write the summary as JSON to PATH")
    backfill.add_argument("--batch", type=int, default=100, metavar="N",
                          help="run ids listed per step of --all and per progress update (default 100)")
    backfill.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    backfill.set_defaults(run=lambda args: _lazy("tools.backfill", "cmd_backfill")(load_config(args.config), args))


def _add_lifecycle(commands) -> None:
    """status, retire and uninstall: where the cutover stands, and the two ways out (docs/lifecycle.md)."""
    quiet_help = ("seconds without a v1 writer (major 1 or raw) connecting through a seat before retire is possible "
                  "(default 604800: 7 days)")
    status = commands.add_parser(
        "status", help="where the cutover stands: runs by era, majors seen, seats serving, what blocks retire",
        description="Read the seat's schema and the host's tables (read only): the artifacts and declarations in "
                    "force, runs by era and how they became era 3, open era-2 runs, audit's last verdict, the majors "
                    "that connected through a seat per database user and when last, the seats serving, and whether "
                    "retire and uninstall are possible now and what blocks them. Exit 0: reported; 2: bad flags or "
                    "configuration; 3: the database is unreachable or has no openwop_seat schema (or a newer one).")
    status.add_argument("--config", metavar="FILE", help=f"TOML configuration file (default: ${CONFIG_ENV})")
    status.add_argument("--dsn", required=True, metavar="DSN", help="connection string of the host database (any "
                        "role that can read the host's tables)")
    status.add_argument("--json", action="store_true", help="print the report as JSON")
    status.add_argument("--quiet", type=float, default=604800.0, metavar="SECONDS", help=quiet_help)
    status.set_defaults(run=lambda args: _lazy("tools.lifecycle", "cmd_status")(load_config(args.config), args))

    retire = commands.add_parser(
        "retire", help="the way forward: remove the seat's machinery once every run is era 3 and no v1 host is left",
        description="Refuse, naming every blocker, while an era-2 run remains (unless --allow-era2), while a v1 "
                    "writer (major 1 or raw) connected through a seat within the quiet period, or while a seat is "
                    "serving. Then, in one transaction: drop the writer rule's triggers and the net on the host's "
                    "tables, the translated views, every function, the claims and counters; keep the era records "
                    "and the preserved originals as evidence (unless --drop-evidence); print the ADR addendum. "
                    "Connect as the owner of openwop_seat, a member of the host tables' owner. Exit 0: retired (or "
                    "already); 1: refused; 2: bad flags; 3: cannot run (unreachable, no schema, missing grants).")
    retire.add_argument("--config", metavar="FILE", help=f"TOML configuration file (default: ${CONFIG_ENV})")
    retire.add_argument("--dsn", required=True, metavar="DSN", help="connection string of the host database, as "
                        "the owner of openwop_seat")
    retire.add_argument("--quiet", type=float, default=604800.0, metavar="SECONDS", help=quiet_help)
    retire.add_argument("--allow-era2", action="store_true",
                        help="retire although era-2 runs remain: they stay v1-only (listed in the record)")
    retire.add_argument("--drop-evidence", action="store_true",
                        help="also drop the era records and the preserved originals (the whole openwop_seat schema)")
    retire.add_argument("--adr", metavar="FILE", help="also write the ADR addendum to FILE (a new file)")
    retire.set_defaults(run=lambda args: _lazy("tools.lifecycle", "cmd_retire")(load_config(args.config), args))

    uninstall = commands.add_parser(
        "uninstall", help="the way back: the database as it was before the first migrate",
        description="Restore every backfilled run (backfill --restore, one run per transaction under the same "
                    "locks), then drop everything migrate created, the triggers, policies and grants included, and "
                    "the schema. Refuse, listing them, while an era-3 run has no v1 original (a v2 host created it), "
                    "unless --keep-era3 leaves those runs' rows as they are; and while a seat is serving. Resumable. "
                    "Connect as the owner of openwop_seat, a member of the host tables' owner. Exit 0: done (or "
                    "nothing to do); 1: refused; 2: bad flags; 3: cannot run (unreachable, missing grants).")
    uninstall.add_argument("--config", metavar="FILE", help=f"TOML configuration file (default: ${CONFIG_ENV})")
    uninstall.add_argument("--dsn", required=True, metavar="DSN", help="connection string of the host database, "
                           "as the owner of openwop_seat")
    uninstall.add_argument("--keep-era3", action="store_true",
                           help="leave the era-3 runs that have no v1 original as they are (listed)")
    uninstall.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    uninstall.set_defaults(run=lambda args: _lazy("tools.lifecycle", "cmd_uninstall")(load_config(args.config),
                                                                                       args))


def _lazy(module: str, name: str):
    """Import a command's module only when it runs, so `--help` stays fast."""
    import importlib

    return getattr(importlib.import_module(f"proxy.{module}"), name)


def cmd_check(config_path: str | None) -> int:
    """``openwop-seat check [--config FILE]``: load the packaged set and print its report.

    A config file, when given, is loaded (and so validated) but not otherwise
    used yet; a ConfigError propagates to the CLI, which reports it.
    """
    from proxy.artifacts.load import ArtifactError, check_report, load_artifacts

    if config_path is not None:
        load_config(config_path)
    try:
        artifacts = load_artifacts()
    except ArtifactError as e:
        print(f"openwop-seat check: {e}", file=sys.stderr)
        return 1
    print(check_report(artifacts))
    return 0


# --- reading -----------------------------------------------------------------


def cmd_config(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if config.host.declarations_file is not None:  # checked against the pinned artifacts, as serve checks it
        from proxy.artifacts.declarations import DeclarationsError, load_declarations
        from proxy.artifacts.load import load_artifacts

        try:
            load_declarations(config.host.declarations_file, load_artifacts())
        except DeclarationsError as e:
            raise ConfigError(f"host.declarations_file: {e}") from None
    from proxy.config import render_json, render_toml

    sys.stdout.write(render_json(config) if args.json else render_toml(config))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from proxy.logs import setup_logging
    from proxy.serve.listener import SeatServer

    config = load_config(args.config).with_overrides(args.listen, args.upstream, args.metrics_listen)
    setup_logging(config.log_format, config.log_level)
    if config.workers > 1 and args.worker is None:
        from proxy.serve.supervisor import run_supervisor

        if config.translates:  # the workers' start checks, once here: a seat that cannot start says why once
            from proxy.serve.listener import start_checks

            if not _serve_step(lambda: asyncio.run(start_checks(config))):
                return 1

        passed = [a for opt, v in (("--config", args.config), ("--upstream", args.upstream)) if v for a in (opt, v)]
        return run_supervisor(config, passed)
    if args.worker is not None:
        from proxy.serve.session import number_sessions
        from proxy.serve.supervisor import install_worker_log_fields

        install_worker_log_fields(args.worker)
        # ids unique across the workers and their restarts (the admin console's KILL, the log lines)
        number_sessions(args.worker, config.workers, args.worker_start)

    async def run() -> None:
        server = SeatServer(config)
        server.install_signal_handlers()  # first: no signal may kill the seat while it checks the database
        await server.start()
        if args.worker_fd is not None and server.listening:
            from proxy.serve.supervisor import attach_worker

            supervisor_link = attach_worker(server, args.worker_fd)  # noqa: F841 - kept open while serving
        await server.serve_forever()

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a declared dependency
        runner = asyncio.run
    else:
        runner = uvloop.run
    return 0 if _serve_step(lambda: runner(run())) else 1


def _serve_step(step) -> bool:
    """Run a step of ``serve``; False (after saying why on stderr) when the host database or the operating
    system refused it. A configuration error goes on to main() (exit status 2); anything else is a bug."""
    try:
        step()
    except ConfigError:
        raise
    except Exception as e:
        if (why := describe(e, database="the host database (host.dsn)")) is None:
            raise
        print(f"openwop-seat serve: {why}", file=sys.stderr)
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as e:
        print(f"openwop-seat: configuration error: {e}", file=sys.stderr)  # several: "N errors:" and one a line
        return 2
    except OSError as e:
        print(f"openwop-seat: {e}", file=sys.stderr)
        return 1
