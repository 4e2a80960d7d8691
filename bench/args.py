"""Argument types shared by ``python -m bench`` and the probes, refused by argparse with exit code 2 before anything
is started: a count that must be a whole number of at least ``1`` (or ``0``), and another checkout to run a seat
from (``--baseline``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def _at_least(least: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}: {value}")
        return value

    parse.__name__ = "positive" if least == 1 else "count"  # argparse names the type in its message
    return parse


positive = _at_least(1)  # rounds, seconds, pages, connects, …
count = _at_least(0)  # a number of rows that may be none (store_page_plan --tail)


def checkout(text: str) -> Path:
    """``--baseline DIR``: a directory holding the seat's code (``proxy/__main__.py``), resolved."""
    path = Path(text).resolve()
    if not (path / "proxy" / "__main__.py").is_file():
        raise argparse.ArgumentTypeError(f"not a checkout of the seat (no proxy/__main__.py): {text!r}")
    return path


checkout.__name__ = "checkout"
