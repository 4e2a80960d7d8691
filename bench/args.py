"""Argument types shared by ``python -m bench`` and the probes: a count that must be a whole number of at least
``1`` (or ``0``), refused by argparse with exit code 2 before anything is started."""

from __future__ import annotations

import argparse


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
