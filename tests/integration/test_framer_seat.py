"""The serving seat says which framer relays its sessions (ADR 0018), and whether the quiet read path's bookkeeping is
the compiled one too (its second addendum): the compiled core unless OPENWOP_SEAT_FRAMER chose the pure-Python one,
which it then warns about. The rest of the integration suite runs on that core."""

from __future__ import annotations

import os


def test_the_seat_names_its_framer_in_its_listening_line(seat):
    want = os.environ.get("OPENWOP_SEAT_FRAMER", "").strip().lower() or "c"
    log = seat.log()
    (line,) = [line for line in log.splitlines() if " info listening " in line][:1]
    assert f" framer={want}" in line and f" quiet_read_path={want}" in line, line
    warned = "the pure-Python framer relays this seat's sessions" in log
    assert warned == (want == "python")
