"""Strict JSON for the artifact files, and the error every artifact loader raises (shared by load and
payload_shapes, which therefore do not import each other both ways)."""

from __future__ import annotations

import json
from typing import Any

from proxy.errors import SeatException


class ArtifactError(SeatException):
    """The artifact set is unusable; the message names the offending file and row."""

    prefix = "spec artifacts: "


def parse_json(name: str, content: bytes) -> Any:
    """Strict JSON: UTF-8, no duplicate object keys, no NaN/Infinity."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise ArtifactError(f"{name}: invalid JSON: duplicate object key {key!r}")
            out[key] = value
        return out

    def constant(word: str) -> Any:
        raise ArtifactError(f"{name}: invalid JSON: {word} is not JSON")

    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ArtifactError(f"{name}: invalid JSON: not UTF-8 ({e})") from None
    try:
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{name}: invalid JSON: {e}") from None
