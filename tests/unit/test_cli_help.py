"""`openwop-seat serve --help` names what serve reads from its environment (issue 27)."""

from __future__ import annotations

import contextlib
import io

import pytest

from proxy.cli import build_parser
from proxy.config import CONFIG_ENV
from proxy.db.layout import CLAIM_SECRET_ENV
from proxy.wire import framer


def serve_help() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    return out.getvalue()


def test_serve_help_names_its_environment_variables():
    text = serve_help()
    for name in (CONFIG_ENV, CLAIM_SECRET_ENV, framer.IMPLEMENTATION_ENV):
        assert f"\n  {name} " in text, (name, text)
    assert "c or python" in text and "ADR 0018" in text
