"""The classifier's caches in bytes, and a session's share freed when it ends (issue 23, item 6)."""

from __future__ import annotations

from proxy.config import HostConfig
from proxy.readpath.classify import PASSED_BYTES, PASSED_MAX_TEXT, Classifier
from proxy.readpath.read_path import ReadPath


def test_long_passthrough_texts_are_never_kept():
    c = Classifier(HostConfig(), 2)
    for i in range(40):
        c.classify(f"SELECT '{i}{'x' * (4 << 20)}'")
    assert c.passed_entries == 0 and c.passed_bytes == 0
    c.classify("SELECT 1")
    assert c.passed_entries == 1 and c.passed_bytes == len("SELECT 1")


def test_short_passthrough_texts_are_bounded_in_bytes():
    c = Classifier(HostConfig(), 2)
    text = "x" * PASSED_MAX_TEXT
    for i in range(3 * PASSED_BYTES // PASSED_MAX_TEXT):
        c.classify(f"SELECT {i} -- {text}"[:PASSED_MAX_TEXT])
        assert c.passed_bytes <= PASSED_BYTES
    assert c.passed_entries > 0


def test_a_sessions_long_plans_leave_the_cache_with_it():
    c = Classifier(HostConfig(), 2)
    short = "SELECT type FROM events"
    mine, other = ReadPath(c, 2, None), ReadPath(c, 2, None)
    other.on_client(ord("Q"), short.encode() + b"\0")
    for i in range(5):
        sql = f"SELECT type FROM events WHERE run_id <> '{i}{'y' * PASSED_MAX_TEXT}'"
        mine.on_client(ord("Q"), sql.encode() + b"\0")
    assert c.size == 6
    mine.close()
    assert c.size == 1 and c.classify(short) is not None and c.hits == 1
    assert c.bytes == sum(2 * len(s) + len(p.text) + 600 for s, p in c._cache.items())
