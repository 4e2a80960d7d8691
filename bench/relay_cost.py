"""The relay's own CPU per transaction, sans-IO: µs of Python (and of the compiled framer) per pgbench-like
transaction and per 100-row page, with no socket, no server and no other process (ADR 0018).

    .venv/bin/python -m bench.relay_cost                          # the framer the seat would use
    OPENWOP_SEAT_FRAMER=python .venv/bin/python -m bench.relay_cost

A major-2 session with its read path, after its login (unclaimed), as in ``make bench``: the client's messages of
``pgbench -S`` in each ``-M`` mode and the server's answers, and a page of 100 event rows (about 40 KB, read in
64 KiB chunks as the event loop would). The figure is the fastest of 7 runs of ``N`` transactions (the least disturbed
by other processes on a shared machine): what the bench's CPU per 1,000 transactions holds beyond the kernel's sends
and receives and the event loop. Last, the Python memory one idle session's relay and read path hold (tracemalloc).
"""

from __future__ import annotations

import struct
import sys
import time

from proxy.config import HostConfig
from proxy.readpath import read_path
from proxy.readpath.classify import Classifier
from proxy.readpath.read_path import EventColumns, ReadPath
from proxy.serve.relay import Relay
from proxy.stats import Stats
from proxy.wire import framer


def msg(t: bytes, body: bytes = b"") -> bytes:
    return t + struct.pack("!I", len(body) + 4) + body


def row(*values: bytes) -> bytes:
    return msg(b"D", struct.pack("!h", len(values)) + b"".join(struct.pack("!i", len(v)) + v for v in values))


def column(name: bytes) -> bytes:
    return name + b"\x00" + bytes(18)


LOGIN = (msg(b"R", struct.pack("!I", 0)) + msg(b"S", b"client_encoding\x00UTF8\x00")
         + msg(b"K", struct.pack("!I", 4242) + b"key!") + msg(b"Z", b"I"))
SELECT = b"SELECT abalance FROM pgbench_accounts WHERE aid = $1;"
ANSWER = (msg(b"T", b"\x00\x01" + column(b"abalance")) + row(b"0") + msg(b"C", b"SELECT 1\x00") + msg(b"Z", b"I"))
BIND = msg(b"B", b"\x00\x00\x00\x00\x00\x01\x00\x00\x00\x0512345\x00\x00")
BIND_NAMED = msg(b"B", b"\x00P0_1\x00\x00\x00\x00\x01\x00\x00\x00\x0512345\x00\x00")
EXECUTE = msg(b"E", b"\x00\x00\x00\x00\x00")
PAGE_SQL = b"SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT 100"
PAYLOAD = b'{"toolCallId": "call-1", "name": "search", "arguments": {"q": "a query of some length"}}' * 3
PAGE_ROWS = b"".join(row(b"%d" % i, b"run-000001", b"%d" % i, b"agent.toolCalled", PAYLOAD, b"2026-12-05 05:00:00+00",
                         b"3", b"f") for i in range(100))
PAGE_ANSWER = (msg(b"1") + msg(b"2") + msg(b"T", b"\x00\x08" + b"".join(column(c) for c in (
    b"id", b"run_id", b"sequence", b"type", b"payload", b"created_at", b"era", b"x"))) + PAGE_ROWS
               + msg(b"C", b"SELECT 100\x00") + msg(b"Z", b"I"))

WORKLOADS = {
    # name: (client chunk, server chunks)
    "simple": (msg(b"Q", SELECT.replace(b"$1", b"12345") + b"\x00"), [ANSWER]),
    "extended": (msg(b"P", b"\x00" + SELECT + b"\x00\x00\x00") + BIND + msg(b"D", b"P\x00") + EXECUTE + msg(b"S"),
                 [msg(b"1") + msg(b"2") + ANSWER]),
    "prepared": (BIND_NAMED + EXECUTE + msg(b"S"),
                 [msg(b"2") + ANSWER[ANSWER.index(b"D"):]]),
    "page": (msg(b"P", b"\x00" + PAGE_SQL + b"\x00\x00\x00") + msg(b"B", b"\x00\x00\x00\x00\x00\x02\x00\x00\x00\x0a"
                                                                   b"run-000001\x00\x00\x00\x010\x00\x00")
             + msg(b"D", b"P\x00") + EXECUTE + msg(b"S"),
             [PAGE_ANSWER[i:i + 65536] for i in range(0, len(PAGE_ANSWER), 65536)]),
}


def relay() -> Relay:
    reader = ReadPath(Classifier(HostConfig(), 2), 2, EventColumns(0x61626364, 4, payload_attnum=5))
    r = Relay(Stats(), reader=reader, count_answered=True)
    r.from_server(LOGIN)
    return r


def per_transaction(name: str, n: int = 20_000, runs: int = 7) -> float:
    chunk, answers = WORKLOADS[name]
    r = relay()
    from_client, from_server = r.from_client, r.from_server
    # pgbench -S -M simple sends a new text each time (a random aid): as many different texts as transactions, so
    # that no statement is found in the classifier's tables of texts already seen
    chunks = [msg(b"Q", SELECT.replace(b"$1", b"%d" % (100_000 + i)) + b"\x00") for i in range(n)] \
        if name == "simple" else [chunk] * n
    times = []
    for run in range(runs):
        if name == "simple":  # the texts of the run before are known now: new ones
            chunks = [c.replace(b"= 1", b"= %d" % (run + 2), 1) for c in chunks]
        start = time.perf_counter()
        for chunk in chunks:
            from_client(chunk)
            for a in answers:
                from_server(a)
        times.append((time.perf_counter() - start) / n * 1e6)
    assert r.ending is None, r.ending
    return min(times)


def session_bytes(n: int = 1_000) -> float:
    """Python memory (tracemalloc) one major-2 session's relay and read path hold after one extended transaction,
    with the classifier and the counters shared as in the seat: the Python share of the idle-connection figure
    (sockets, transports and the session's own object not included)."""
    import gc
    import tracemalloc

    classifier, stats = Classifier(HostConfig(), 2), Stats()
    chunk, answers = WORKLOADS["extended"]

    def session() -> Relay:
        reader = ReadPath(classifier, 2, EventColumns(0x61626364, 4, payload_attnum=5))
        r = Relay(stats, reader=reader, count_answered=True)
        r.from_server(LOGIN)
        r.from_client(chunk)
        for a in answers:
            r.from_server(a)
        return r

    warm = [session() for _ in range(10)]  # the shared caches filled before the count
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = [session() for _ in range(n)]
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del warm, kept
    return (after - before) / n


def main() -> None:
    which = getattr(framer, "IMPLEMENTATION", "python (before ADR 0018)")
    quiet = "c" if getattr(read_path, "QUIET_RUN", None) is not None else "python"  # ADR 0018, second addendum
    print(f"framer: {which}; quiet read path: {quiet}; Python {sys.version.split()[0]}")
    for name in WORKLOADS:
        n = 2_000 if name == "page" else 20_000
        print(f"{name:10} {per_transaction(name, n):7.2f} µs per transaction")
    print(f"memory     {session_bytes():7.0f} bytes of Python objects per session (relay and read path, idle)")


if __name__ == "__main__":
    main()
