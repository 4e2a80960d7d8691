"""The `openwop-seat` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from . import __version__
from .config import CONFIG_ENV, ConfigError, load_config

log = logging.getLogger("openwop_seat")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="openwop-seat",
        description="A transparent PostgreSQL wire-protocol proxy that serves OpenWOP event logs by era.")
    parser.add_argument("--version", action="version", version=f"openwop-seat {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    serve = commands.add_parser(
        "serve", help="run the proxy",
        description="Accept PostgreSQL clients and relay each to its own upstream connection.")
    serve.add_argument("--config", metavar="FILE",
                       help=f"TOML configuration file (default: ${CONFIG_ENV}, else built-in defaults)")
    serve.add_argument("--listen", metavar="HOST:PORT", help="override [proxy] listen")
    serve.add_argument("--upstream", metavar="HOST:PORT", help="override [proxy] upstream")
    serve.add_argument("--metrics-listen", metavar="HOST:PORT", help="override [metrics] listen")
    serve.set_defaults(run=cmd_serve)

    config = commands.add_parser(
        "config", help="validate a configuration file and print what it resolves to",
        description="Load the configuration exactly as `serve` would and print the result; exit 2 if invalid.")
    config.add_argument("--config", metavar="FILE", help=f"TOML configuration file (default: ${CONFIG_ENV})")
    config.set_defaults(run=cmd_config)
    return parser


def cmd_config(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    print(config)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .logs import setup_logging
    from .server import SeatServer

    config = load_config(args.config).with_overrides(args.listen, args.upstream, args.metrics_listen)
    setup_logging(config.log_format, config.log_level)

    async def run() -> None:
        server = SeatServer(config)
        await server.start()
        server.install_signal_handlers()
        await server.serve_forever()

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a declared dependency
        asyncio.run(run())
    else:
        uvloop.run(run())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as e:
        print(f"openwop-seat: configuration error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"openwop-seat: {e}", file=sys.stderr)
        return 1
