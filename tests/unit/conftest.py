"""The framer-driven unit tests run once per framer implementation (ADR 0018); each test's id says which."""

from __future__ import annotations

import pytest
from framers import IMPLEMENTATIONS, framer_class, quiet_core

# Modules whose tests drive a framer, directly or through the relay: each runs against both implementations.
BOTH_FRAMERS = {"test_framer", "test_codec", "test_relay", "test_relay_bounds", "test_read_path_sansio",
                "test_idle_memory", "test_fifo", "test_repeated_parse"}


@pytest.fixture(params=IMPLEMENTATIONS)
def framer_impl(request) -> str:
    return request.param


@pytest.fixture
def each_framer(request, framer_impl, monkeypatch):
    """``Framer`` (the test module's own name and the relay's) is the implementation of the test's ``framer_impl``
    parameter. A module whose tests drive a framer, directly or through the relay, says
    ``pytestmark = pytest.mark.usefixtures("each_framer")``: each of its tests runs (and is named) once per framer."""
    assert request.module.__name__ in BOTH_FRAMERS, "list the module in BOTH_FRAMERS"
    cls = framer_class(framer_impl)
    import proxy.serve.relay

    monkeypatch.setattr(proxy.serve.relay, "Framer", cls)
    # the relay's quiet bookkeeping follows the framer, as OPENWOP_SEAT_FRAMER chooses both in the seat
    quiet_run, join_parts, server_quiet_run = quiet_core(framer_impl)
    monkeypatch.setattr(proxy.serve.relay, "QUIET_RUN", quiet_run)
    monkeypatch.setattr(proxy.serve.relay, "JOIN_PARTS", join_parts)
    monkeypatch.setattr(proxy.serve.relay, "SERVER_QUIET_RUN", server_quiet_run)
    if hasattr(request.module, "Framer"):
        monkeypatch.setattr(request.module, "Framer", cls)
    yield cls
