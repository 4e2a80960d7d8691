"""The append guard's text (ADR 0020): it skips the writer's claim only for an era-2 row every writer stores as
sent, never for a vendor-prefixed v2 name the codemap renames (a v2 writer's is stored in its v1 spelling)."""

from __future__ import annotations

import dataclasses
import re

from proxy.artifacts.load import load_artifacts
from proxy.config import HostConfig
from proxy.db.writer_sql import _MAJOR, _on_event_insert_sql, _on_event_inserted_sql, _session_major_sql

ARTIFACTS = load_artifacts()


def fast_path(sql: str) -> str:
    """The guard's text from its era-2 fast path up to where it reads the claim."""
    start = sql.index("every writer stores as sent")
    return sql[start:sql.index("v_major :=", start)]


def test_the_guard_asks_the_claim_after_the_fast_path_and_inline():
    sql = _on_event_insert_sql(ARTIFACTS, HostConfig())
    assert "session_major()" not in sql and sql.count(_MAJOR) == 1
    path = fast_path(sql)
    assert "RETURN NEW;" in path
    identity = sorted(v1 for v1, v2 in ARTIFACTS.v1_to_v2.items() if v1 == v2 and v1 in ARTIFACTS.v1_types)
    assert identity and all(f'"{t}"' in path for t in identity)
    renamed_v2 = {v2 for v1, v2 in ARTIFACTS.v1_to_v2.items() if v1 != v2}
    assert not any(f'"{t}"' in path for t in renamed_v2 - set(identity))
    # the final check reads the same claim, inline, and session_major() is that query too
    assert _MAJOR in _on_event_inserted_sql(ARTIFACTS, HostConfig()) and _MAJOR in _session_major_sql()


def test_a_renamed_vendor_name_is_not_on_the_fast_path():
    fake = dataclasses.replace(
        ARTIFACTS, v1_to_v2={**ARTIFACTS.v1_to_v2, "example.thingHappened": "example.thing-happened"},
        v1_types=ARTIFACTS.v1_types | {"example.thingHappened"}, vendor_orgs=frozenset({"example"}),
        reserved_orgs=frozenset())
    path = fast_path(_on_event_insert_sql(fake, HostConfig()))
    assert re.search(r"AND NOT \(v_type = ANY \('\{\"example\.thing-happened\"\}'::text\[\]\)\)", path), path
    # and the guard still translates it for a v2 writer
    assert "WHEN 'example.thing-happened' THEN 'example.thingHappened'" in _on_event_insert_sql(fake, HostConfig())
    plain = fast_path(_on_event_insert_sql(ARTIFACTS, HostConfig()))
    assert "AND NOT (v_type = ANY" not in plain  # the pinned codemap renames no vendor's name
