"""Both implementations of the relay's core (ADR 0018), for the tests that run against each: the pure-Python
definition and the compiled one (the framer, and the quiet read path's bookkeeping). The compiled one is built by
``make setup``; when it is missing its tests fail, they never skip."""

from __future__ import annotations

import pytest

from proxy.readpath import read_path
from proxy.wire import framer

IMPLEMENTATIONS = ("python", "c")


def framer_class(name: str) -> type:
    """The framer class called ``name``; a test of the compiled one fails when it is not built."""
    if name == "python":
        return framer.PyFramer
    if framer.CFramer is None:
        pytest.fail(f"the compiled framer was not built by make setup: {framer.IMPLEMENTATION_NOTE}")
    return framer.CFramer


def quiet_core(name: str) -> tuple:
    """The relay's (QUIET_RUN, JOIN_PARTS, SERVER_QUIET_RUN) for implementation ``name``: (None, None, None) is the
    pure-Python definition (on_client and on_server_quiet for every message); a test of the compiled one fails when
    it is not built."""
    if name == "python":
        return None, None, None
    if read_path._cquiet is None:
        pytest.fail(f"the compiled quiet read path was not built by make setup: {read_path.QUIET_MISSING}")
    cquiet = read_path._cquiet
    return cquiet.quiet_run, cquiet.join_parts, cquiet.server_quiet_run
