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


@pytest.mark.parametrize("value, shown", [
    ("evil\n2026-12-05T00:00:00.000+00:00 info session start session=1", '"evil\\n2026-12-05T00:00:00.000+00:00'),
    ("a\rb", '"a\\rb"'), ("a\tb", '"a\\tb"'), ("x\u2028y", '"x\\u2028y"'), ("bell\x07", '"bell\\u0007"'),
    ("\x1b[2J", '"\\u001b[2J"'), ("caf\u00e9", "caf\u00e9"), ("caf\u00e9 au lait", '"caf\u00e9 au lait"'),
])
@pytest.mark.parametrize("via", ["format", "event"])
def test_a_text_field_the_client_chose_can_never_break_or_forge_a_line(seat_logging, value, shown, via):
    """application_name and the user name come from the client's startup packet: a value with a line break (or any
    character that is not printable) is quoted with it escaped, so the line stays one line; printable values are
    written as before."""
    logger = logging.getLogger("openwop_seat.test")
    out = seat_logging("text")
    if via == "event":
        logs.event(logger, logging.INFO, "session start", {"session": 1, "application_name": value})
    else:
        logger.info("session start", extra={"fields": {"session": 1, "application_name": value}})
    written = out.getvalue()
    assert written.count("\n") == 1 and "\r" not in written and "\u2028" not in written, written
    assert f" application_name={shown}" in written, written


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


# --- logs.event: the session's lines (two a connect, issue 26) without a LogRecord, the same text ----------------

FIELDS = [
    {"session": 12345, "client": "127.0.0.1:54321", "user": "postgres", "database": "postgres",
     "application_name": "pgbench", "major": 2, "tls": False, "protocol": "3.0", "pooled_backend": 4567},
    {"session": 7, "client": "[local]", "user": 'a"b', "database": "my db", "application_name": "", "major": None,
     "tls": True, "reason": "client closed", "duration_s": 0.003, "bytes_in": 0, "bytes_out": 1 << 40},
    {"session": 8, "client": "::1:5", "user": "é ü", "database": "a=b", "application_name": "x\ny\t\\",
     "major": "raw", "tls": False, "code": "OW001", "sqlstate": "0A000", "kind": "write", "ratio": 1.5e-07,
     "nan": float("nan"), "path": __import__("pathlib").PurePosixPath("/x y")},
    {},
]


@pytest.fixture
def seat_logging(monkeypatch):
    """The seat's set-up (setup_logging) writing to a StringIO; the LogRecord's source, thread and process put back
    afterwards for pytest's own records."""
    saved = logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing
    out = io.StringIO()

    def setup(fmt: str, level: str = "info") -> io.StringIO:
        logs.setup_logging(fmt, level)
        logging.getLogger("openwop_seat").handlers[0].setStream(out)
        return out

    yield setup
    logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing = saved
    logs.set_process_fields(None)
    root = logging.getLogger("openwop_seat")
    root.handlers[:] = []
    root.propagate = True
    logs._handler = logs._root = None


def _both(out: io.StringIO, monkeypatch, created: float, logger: logging.Logger, level: int, msg: str,
          fields: dict) -> tuple[str, str]:
    """(the line of logger.log, the line of logs.event) for the same event at the same time."""
    monkeypatch.setattr(logs.time, "time", lambda: created)  # LogRecord's time too
    out.seek(0)
    out.truncate()
    logger.log(level, msg, extra={"fields": dict(fields)})
    by_log = out.getvalue()
    out.seek(0)
    out.truncate()
    logs.event(logger, level, msg, dict(fields))
    return by_log, out.getvalue()


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("fields", FIELDS)
@pytest.mark.parametrize("worker", [None, 3])
def test_event_writes_the_line_logger_log_writes(seat_logging, monkeypatch, fmt, fields, worker):
    out = seat_logging(fmt)
    if worker is not None:  # a worker process's lines end with its id and pid
        from proxy.serve.supervisor import install_worker_log_fields

        install_worker_log_fields(worker)
    logger = logging.getLogger("openwop_seat.session")
    for created in (1796376601.123456, 1796376601.9996, 1796376602.0):
        for level, msg in ((logging.INFO, "session start"), (logging.WARNING, "privileged role")):
            by_log, by_event = _both(out, monkeypatch, created, logger, level, msg, fields)
            assert by_event == by_log and by_log.endswith("\n")
            if worker is not None:
                assert (f" worker={worker} pid=" in by_log) if fmt == "text" else f'"worker":{worker},"pid":' in by_log


def test_event_lines_are_today_s_lines(seat_logging, monkeypatch):
    """The exact text of a pooled connect's two lines, as the seat wrote them before logs.event."""
    out = seat_logging("text")
    logger = logging.getLogger("openwop_seat.session")
    monkeypatch.setattr(logs.time, "time", lambda: 1796376601.123456)
    logs.event(logger, logging.INFO, "session start", dict(FIELDS[0]))
    logs.event(logger, logging.INFO, "session end", dict(FIELDS[1]))
    assert out.getvalue() == (
        "2026-12-04T09:30:01.123+00:00 info session start session=12345 client=127.0.0.1:54321 user=postgres "
        "database=postgres application_name=pgbench major=2 tls=False protocol=3.0 pooled_backend=4567\n"
        '2026-12-04T09:30:01.123+00:00 info session end session=7 client=[local] user="a\\"b" database="my db" '
        'application_name="" major="" tls=True reason="client closed" duration_s=0.003 bytes_in=0 '
        "bytes_out=1099511627776\n")
    out.seek(0)
    out.truncate()
    seat_logging("json")
    logs.event(logger, logging.INFO, "session start", dict(FIELDS[0]))
    assert out.getvalue() == (
        '{"ts":"2026-12-04T09:30:01.123+00:00","level":"info","logger":"openwop_seat.session","msg":"session start",'
        '"session":12345,"client":"127.0.0.1:54321","user":"postgres","database":"postgres",'
        '"application_name":"pgbench","major":2,"tls":false,"protocol":"3.0","pooled_backend":4567}\n')


def test_a_worker_s_fields_come_last_and_replace_a_line_s_own(seat_logging, monkeypatch):
    """As the handler filter they replace did: {**fields, "worker": …, "pid": …}."""
    import os

    from proxy.serve.supervisor import install_worker_log_fields

    out = seat_logging("text")
    install_worker_log_fields(2)
    logs.event(logging.getLogger("openwop_seat.session"), logging.INFO, "m", {"pid": 1, "session": 5})
    logging.getLogger("openwop_seat.listener").info("no fields")
    first, second = out.getvalue().splitlines()
    assert first.endswith(f" info m pid={os.getpid()} session=5 worker=2")
    assert second.endswith(f" info no fields worker=2 pid={os.getpid()}")


def test_event_below_the_level_writes_nothing(seat_logging):
    out = seat_logging("text", "warning")
    logs.event(logging.getLogger("openwop_seat.session"), logging.INFO, "session start", {"session": 1})
    assert out.getvalue() == ""
    logs.event(logging.getLogger("openwop_seat.session"), logging.WARNING, "pooled login refused", {"session": 1})
    assert out.getvalue().endswith(" warning pooled login refused session=1\n")


class _Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.mark.parametrize("where", ["logger handler", "root handler", "logger filter", "root filter",
                                   "handler filter", "formatter", "handler level", "disabled", "not set up"])
def test_any_other_set_up_gets_logger_log(seat_logging, where):
    """A handler or a filter added anywhere on the way (caplog's, an operator's dictConfig): the record goes through
    logging as before, fields and all."""
    out = seat_logging("text")
    logger = logging.getLogger("openwop_seat.session")
    root = logging.getLogger("openwop_seat")
    handler = root.handlers[0]
    keep = _Keep()
    seen: list[logging.LogRecord] = []

    def note(record):
        seen.append(record)
        return True

    undo = []
    if where == "logger handler":
        logger.addHandler(keep)
        undo.append(lambda: logger.removeHandler(keep))
    elif where == "root handler":
        root.addHandler(keep)
    elif where == "logger filter":
        logger.addFilter(note)
        undo.append(lambda: logger.removeFilter(note))
    elif where == "root filter":
        root.addFilter(note)
        undo.append(lambda: root.removeFilter(note))
    elif where == "handler filter":
        handler.addFilter(note)
    elif where == "formatter":
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s %(fields)s"))
    elif where == "handler level":
        handler.setLevel(logging.WARNING)
    elif where == "disabled":
        logger.disabled = True
        undo.append(lambda: setattr(logger, "disabled", False))
    elif where == "not set up":
        logs._handler = None
    try:
        logs.event(logger, logging.INFO, "session start", {"session": 9})
    finally:
        for u in undo:
            u()
    if where in ("logger handler", "root handler"):
        assert [r.fields for r in keep.records] == [{"session": 9}]
    if where in ("logger filter", "handler filter"):
        assert [r.fields for r in seen] == [{"session": 9}]
    if where == "root filter":  # logging consults only the filters of the logger a line is logged on
        assert seen == []
    if where == "formatter":
        assert out.getvalue() == "INFO session start {'session': 9}\n"
    elif where in ("handler level", "disabled"):
        assert out.getvalue() == ""
    else:
        assert out.getvalue().endswith(" info session start session=9\n")


def test_a_line_that_cannot_be_written_is_logging_s_error(seat_logging, capsys):
    """As StreamHandler.emit: handleError reports it on stderr (the record's message and fields), the seat goes on."""
    seat_logging("text")

    class Broken(io.StringIO):
        def write(self, s):
            raise OSError(28, "No space left on device")

    logging.getLogger("openwop_seat").handlers[0].setStream(Broken())
    logs.event(logging.getLogger("openwop_seat.session"), logging.INFO, "session end", {"session": 4})
    err = capsys.readouterr().err
    assert "--- Logging error ---" in err and "No space left on device" in err and "session end" in err
