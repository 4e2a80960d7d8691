"""Log set-up: one line per event, as text or JSON (`[log] format`)."""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import datetime, timezone

import orjson

# The last second a line was stamped in, and its text up to the seconds: the lines of one second (two a connect)
# format only their milliseconds (datetime's conversion and isoformat were a tenth of a log line's time).
_second: tuple[int, str] = (-1, "")


def timestamp(record: logging.LogRecord) -> str:
    """RFC 3339 with milliseconds and the zone offset, in UTC: ``2026-12-04T09:30:01.123+00:00``. As
    ``datetime.fromtimestamp(created, timezone.utc).isoformat(timespec="milliseconds")``: rounded to the
    microsecond (half to even), then truncated to the millisecond."""
    return stamp(record.created)


def stamp(created: float) -> str:
    """:func:`timestamp` of a record created at ``created`` (seconds since the epoch)."""
    global _second
    second = int(created)
    micro = round((created - second) * 1e6)
    if micro >= 1_000_000:
        second += 1
        micro -= 1_000_000
    if second != _second[0] or created < 0:
        if created < 0:  # never for a real line: datetime's own conversion
            return datetime.fromtimestamp(created, timezone.utc).isoformat(timespec="milliseconds")
        _second = (second, datetime.fromtimestamp(second, timezone.utc).isoformat()[:19])
    return f"{_second[1]}.{micro // 1000:03d}+00:00"


# Fields every line of this process ends with (a worker's id and pid: install_worker_log_fields), or None.
_process_fields: dict | None = None


def set_process_fields(fields: dict | None) -> None:
    """Fields appended to every line of this process from now on, after the line's own (a key of both: its
    value is these fields', where the line's was)."""
    global _process_fields
    _process_fields = dict(fields) if fields else None


def _text_line(ts: str, level: str, name: str, msg: str, fields: dict | None) -> str:
    line = f"{ts} {level} {msg}"
    if _process_fields is not None:
        fields = {**(fields or {}), **_process_fields}
    if fields:  # a list, not a generator, and the quoting test inline: two lines a connect (issue 26)
        parts = []
        for k, v in fields.items():
            text = v if type(v) is str else "" if v is None else str(v)
            if not text or " " in text or '"' in text or "=" in text or not text.isprintable():
                text = _quoted(text)
            parts.append(f"{k}={text}")
        line += " " + " ".join(parts)
    return line


def _json_line(ts: str, level: str, name: str, msg: str, fields: dict | None, exc: str | None = None) -> str:
    entry = {"ts": ts, "level": level, "logger": name, "msg": msg}
    if fields:
        entry.update(fields)
    if _process_fields is not None:
        entry.update(_process_fields)
    if exc is not None:
        entry["exc"] = exc
    return orjson.dumps(entry, default=str).decode()


def _quoted(text: str) -> str:
    """A field's value as a JSON string, every character outside printable ASCII escaped: a value the client chose
    (application_name, a user name) can never end the line or start a forged one (a newline, a carriage return,
    U+2028, an escape sequence for a terminal). A printable value keeps its characters, as before."""
    return orjson.dumps(text).decode() if text.isprintable() else json.dumps(text)


class _TextFormatter(logging.Formatter):
    line = staticmethod(_text_line)

    def format(self, record: logging.LogRecord) -> str:
        line = _text_line(timestamp(record), record.levelname.lower(), record.name, record.getMessage(),
                          getattr(record, "fields", None))
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _JSONFormatter(logging.Formatter):
    line = staticmethod(_json_line)

    def format(self, record: logging.LogRecord) -> str:
        return _json_line(timestamp(record), record.levelname.lower(), record.name, record.getMessage(),
                          getattr(record, "fields", None),
                          self.formatException(record.exc_info) if record.exc_info else None)


_FORMATTERS = (_TextFormatter, _JSONFormatter)

# The handler setup_logging installed on the seat's logger, and that logger (None: not set up in this process).
_handler: logging.StreamHandler | None = None
_root: logging.Logger | None = None


def event(logger: logging.Logger, level: int, msg: str, fields: dict) -> None:
    """``logger.log(level, msg, extra={"fields": fields})``, the same line, with less work per line when the seat's
    own set-up would write it (the session's lines, two a connect: issue 26): the line is formatted and written as
    the handler setup_logging installed would, without a LogRecord (its __init__, the logger's and the handler's
    walk of filters and handlers were half of a line's time). Any other set-up (a handler or a filter added, the
    logger disabled or below ``level``, setup_logging not called) gets ``logger.log``."""
    handler = _handler
    root = _root
    if (handler is None or logger.parent is not root or logger.handlers or logger.filters or not logger.propagate
            or logger.disabled or root.filters or len(root.handlers) != 1 or root.handlers[0] is not handler
            or handler.filters or type(handler.formatter) not in _FORMATTERS or level < handler.level
            or not logger.isEnabledFor(level)):
        logger.log(level, msg, extra={"fields": fields})
        return
    created = time.time()
    with handler.lock:  # as Handler.handle, then StreamHandler.emit
        try:
            line = handler.formatter.line(stamp(created), logging.getLevelName(level).lower(), logger.name, msg,
                                          fields)
            stream = handler.stream
            stream.write(line + handler.terminator)
            if hasattr(stream, "flush"):
                stream.flush()
        except RecursionError:
            raise
        except Exception:
            record = logger.makeRecord(logger.name, level, "(unknown file)", 0, msg, (), None,
                                       extra={"fields": fields})
            record.created = created
            handler.handleError(record)


def setup_logging(fmt: str = "text", level: str = "info") -> None:
    # Neither format prints where a line was logged from, nor the thread or process: the LogRecord need not find
    # them (sys._getframe and a walk up the stack for every line, two or three lines a connect; the logging HOWTO's
    # "Optimization"). The seat's process only: setup_logging is called by the CLI.
    global _handler, _root
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JSONFormatter() if fmt == "json" else _TextFormatter())
    root = logging.getLogger("openwop_seat")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    _handler, _root = handler, root
