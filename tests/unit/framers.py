"""Both framer implementations (ADR 0018), for the tests that run against each: the pure-Python definition and the
compiled core. The compiled one is built by ``make setup``; when it is missing its tests fail, they never skip."""

from __future__ import annotations

import pytest

from proxy.wire import framer

IMPLEMENTATIONS = ("python", "c")


def framer_class(name: str) -> type:
    """The framer class called ``name``; a test of the compiled one fails when it is not built."""
    if name == "python":
        return framer.PyFramer
    if framer.CFramer is None:
        pytest.fail(f"the compiled framer was not built by make setup: {framer.IMPLEMENTATION_NOTE}")
    return framer.CFramer
