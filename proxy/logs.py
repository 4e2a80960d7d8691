"""Log set-up: one line per event, as text or JSON (`[log] format`)."""

from __future__ import annotations

import logging
import sys
from datetime import datetime, timezone

import orjson

# The last second a line was stamped in, and its text up to the seconds: the lines of one second (two a connect)
# format only their milliseconds (datetime's conversion and isoformat were a tenth of a log line's time).
_second: tuple[int, str] = (-1, "")


def timestamp(record: logging.LogRecord) -> str:
    """RFC 3339 with milliseconds and the zone offset, in UTC: ``2026-12-04T09:30:01.123+00:00``. As
    ``datetime.fromtimestamp(created, timezone.utc).isoformat(timespec="milliseconds")``: rounded to the
    microsecond (half to even), then truncated to the millisecond."""
    global _second
    created = record.created
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


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{timestamp(record)} {record.levelname.lower()} {record.getMessage()}"
        fields = getattr(record, "fields", None)
        if fields:  # a list, not a generator, and _text_value's test inline: two lines a connect (issue 26)
            parts = []
            for k, v in fields.items():
                text = v if type(v) is str else "" if v is None else str(v)
                if not text or " " in text or '"' in text or "=" in text:
                    text = orjson.dumps(text).decode()
                parts.append(f"{k}={text}")
            line += " " + " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _text_value(value: object) -> str:
    text = "" if value is None else str(value)
    return text if text and " " not in text and '"' not in text and "=" not in text else orjson.dumps(text).decode()


class _JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": timestamp(record), "level": record.levelname.lower(),
                 "logger": record.name, "msg": record.getMessage()}
        entry.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def setup_logging(fmt: str = "text", level: str = "info") -> None:
    # Neither format prints where a line was logged from, nor the thread or process: the LogRecord need not find
    # them (sys._getframe and a walk up the stack for every line, two or three lines a connect; the logging HOWTO's
    # "Optimization"). The seat's process only: setup_logging is called by the CLI.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JSONFormatter() if fmt == "json" else _TextFormatter())
    root = logging.getLogger("openwop_seat")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
