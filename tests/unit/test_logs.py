"""proxy/logs.py: both log formats stamp each line with an RFC 3339 time: milliseconds and the zone."""

from __future__ import annotations

import io
import logging
import re
from datetime import datetime, timezone

import orjson
import pytest

from proxy import logs

RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d$")


def _line(fmt: str, created: float) -> str:
    saved = logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing
    logs.setup_logging(fmt, "info")
    # setup_logging is for the seat's process: give pytest's own log records their source back
    logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing = saved
    logger = logging.getLogger("openwop_seat.test")
    handler = logging.getLogger("openwop_seat").handlers[0]
    out = io.StringIO()
    handler.setStream(out)
    record = logger.makeRecord(logger.name, logging.INFO, __file__, 1, "session start", (), None,
                               extra={"fields": {"session": 1}})
    record.created, record.msecs = created, (created % 1) * 1000
    logger.handle(record)
    return out.getvalue().strip()


def test_text_lines_start_with_an_rfc3339_time_with_milliseconds_and_zone():
    line = _line("text", 1796376601.123456)
    stamp, level, rest = line.split(" ", 2)
    assert RFC3339_MS.match(stamp), line
    assert stamp == "2026-12-04T09:30:01.123+00:00"
    assert datetime.fromisoformat(stamp).timestamp() == 1796376601.123
    assert level == "info" and rest == "session start session=1"


def test_json_lines_carry_the_same_time_in_ts():
    entry = orjson.loads(_line("json", 1796376601.9996))
    assert RFC3339_MS.match(entry["ts"]), entry
    assert entry["ts"] == "2026-12-04T09:30:01.999+00:00"  # truncated, never rounded into the next second
    assert entry["msg"] == "session start" and entry["session"] == 1


def test_the_seat_does_not_ask_where_a_line_was_logged_from():
    """Neither format prints a line's source, thread or process: setup_logging spares the LogRecord finding them."""
    saved = logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing
    try:
        logs.setup_logging("text", "info")
        assert logging._srcfile is None and not (logging.logThreads or logging.logProcesses)
        record = logging.getLogger("openwop_seat.test").makeRecord("openwop_seat.test", logging.INFO, "(unknown file)",
                                                                   0, "session start", (), None)
        assert logging.getLogger("openwop_seat").handlers[0].format(record).endswith(" info session start")
    finally:
        logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing = saved


def test_text_fields_are_quoted_when_empty_or_holding_a_space_a_quote_or_an_equals_sign():
    saved = logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing
    try:
        logs.setup_logging("text", "info")
        record = logging.getLogger("openwop_seat.test").makeRecord("openwop_seat.test", logging.INFO, "(unknown file)",
                                                                   0, "session start", (), None)
        record.fields = {"session": 7, "client": "127.0.0.1:5432", "application_name": "", "database": "my db",
                         "user": 'a"b', "options": "-c x=1", "major": None, "tls": False, "ratio": 1.5}
        line = logging.getLogger("openwop_seat").handlers[0].format(record)
        assert line.endswith(' session start session=7 client=127.0.0.1:5432 application_name="" database="my db" '
                             'user="a\\"b" options="-c x=1" major="" tls=False ratio=1.5')
    finally:
        logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing = saved


@pytest.mark.parametrize("created", [1796376601.123456, 1796376601.9996, 1796376601.9999995, 1796376601.9999996,
                                     1796376601.0000004, 1796376601.0005, 1796376601.0015, 1796376602.0, 0.0,
                                     *(1796376601 + i / 997 for i in range(997))])
def test_a_stamp_is_datetime_s_to_the_millisecond_whatever_second_was_stamped_before(created):
    record = logging.LogRecord("openwop_seat.test", logging.INFO, "(unknown file)", 0, "m", None, None)
    for before in (created, created - 1, created + 1):  # the second kept from the line before: the same or not
        record.created = before
        logs.timestamp(record)
        record.created = created
        assert logs.timestamp(record) == datetime.fromtimestamp(created, timezone.utc).isoformat(
            timespec="milliseconds")
