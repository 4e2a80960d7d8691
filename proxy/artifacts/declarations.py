"""The operator's declarations of the host's own payload names (``[host] declarations_file``, ADR 0010).

The spec leaves the projection of host-stored fields to the host ("the
projection is the host's to name") and is silent on v2-required keys a v1 host
never stored.  This file is where the operator says, per v2 event type:

* **aliases**: a key the host stores under its own name and the v2 definition
  seats under another (``run.completed``: ``output`` -> ``outputs``; the
  reference host's ``artifact.created``: ``artifactTypeId`` -> ``artifactType``);
* **legacy values**: a value for a required key that nothing in an era-2 row
  provides (``node.started``: ``typeId``).

One TOML file, versioned (``format``, the file format, and ``version``, the
operator's own), checked against the pinned artifacts at load, and pinned by
its digest: ``migrate`` records it in ``openwop_seat.meta`` beside the
artifact digest, and every ``serve``, ``audit`` and ``backfill`` refuses a
database that records another (:func:`proxy.db.migrate.verify`).  It is never
a type mapping: the codemap stays the only authority for types, so the file
names types only by their v2 name and nothing in it can name or change a type.

The file::

    format = 1                       # required: this module's file format
    version = "2026-12-04.1"         # optional: the operator's version, recorded
    description = "..."              # optional

    [types."run.completed".aliases]
    output = "outputs"               # stored key = v2 key

    [types."node.started".legacy]
    typeId = "legacy.unrecorded"     # required v2 key = the value to use when absent

Refused at load, naming the file and the line (:class:`DeclarationsError`):
an unknown top-level key or table, a ``format`` other than 1, a type that is
not a v2 type with a pinned payload definition (a v1 spelling, a vendor type,
a typo), a key of a type's table other than ``aliases`` and ``legacy``, an
alias whose target is not a declared property of the type's v2 definition,
whose source is a declared property or a hatch key (``x-``, ``openwop-``,
``vendor.``), or that shares its target with another alias; a legacy value for
a key that is not declared or not required, for ``nodeId``/``runId`` (the
projection fills them from the row's columns) or ``run.started``'s ``owner``
(the legacy Subject), or whose value the key's schema refuses (JSON type,
``enum``, ``const``, ``pattern``, lengths, bounds, nested required keys and
closed objects); and a type mapping in disguise: anything aliased to or from
``type``, a legacy value for ``type``, or a legacy value holding, at any
depth, a ``type`` key whose value is an event type of the codemap.

The digest is SHA-256 over the canonical JSON of what was declared
(``{"format", "types", "version"}``, keys sorted, no whitespace, UTF-8): two
files that say the same thing have the same digest, whatever their comments
and layout.  No file at all is :data:`EMPTY`, whose digest is that of
``{"format": 1, "types": {}, "version": null}``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

# The schema compiler's own reader (its registry, $ref resolution and allOf flattening), so that a legacy
# value is checked against exactly the schemas the shapes were compiled from.
from proxy.artifacts.payload_shapes import (
    HATCH_PATTERN,
    PAYLOADS_FILE,
    SCHEMA_DIR,
    _Compiler,
    _escape,
    _Parts,
    _Registry,
)
from proxy.errors import SeatException

FORMAT = 1
# Keys the projection fills itself from the row (docs/payload-projection.md): a legacy value would shadow them.
FILLED_BY_PROJECTION = {"*": ("nodeId", "runId"), "run.started": ("owner",)}
TYPE_KEY = "type"


class DeclarationsError(SeatException, ValueError):
    """The declarations file is unusable; the message names the file and the line."""

    prefix = "declarations: "


@dataclass(frozen=True)
class TypeDeclarations:
    """What one v2 type declares: aliases (stored key -> v2 key) and legacy values (v2 key -> JSON value)."""

    aliases: tuple[tuple[str, str], ...] = ()
    legacy: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Declarations:
    """A loaded, checked declarations file (or :data:`EMPTY`)."""

    path: str | None
    version: str | None
    description: str | None
    types: dict[str, TypeDeclarations] = field(default_factory=dict)  # v2 type -> declarations, sorted by type
    digest: str = ""

    @property
    def empty(self) -> bool:
        return not self.types

    def canonical(self) -> dict:
        return canonical(self.version, self.types)

    def listing(self) -> list[str]:
        """One line per declaration, for ``adr``, ``audit`` and the docs: ``type: alias a -> b`` / ``legacy k = v``."""
        out = []
        for t, d in self.types.items():
            out.extend(f"{t}: alias {a} -> {b}" for a, b in d.aliases)
            out.extend(f"{t}: legacy {k} = {_json(v)}" for k, v in d.legacy)
        return out

    def as_json(self) -> dict:
        """The declarations as a report holds them (``audit --json``, ``backfill --json``)."""
        return {"file": self.path, "version": self.version, "digest": self.digest,
                "types": {t: {"aliases": dict(d.aliases), "legacy": dict(d.legacy)} for t, d in self.types.items()}}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def canonical(version: str | None, types: dict[str, TypeDeclarations]) -> dict:
    return {"format": FORMAT, "version": version,
            "types": {t: {"aliases": dict(d.aliases), "legacy": dict(d.legacy)} for t, d in types.items()}}


def digest_of(version: str | None, types: dict[str, TypeDeclarations]) -> str:
    return hashlib.sha256(_json(canonical(version, types)).encode("utf-8")).hexdigest()


EMPTY = Declarations(path=None, version=None, description=None, types={}, digest=digest_of(None, {}))


# --- where things are in the file -------------------------------------------------------------------------------


class _Lines:
    """The line of each table header and each one-line ``key = value`` of a TOML file, by key path.

    tomllib keeps no positions, so the text is read again line by line: a header line (``[a."b".c]``) and a
    ``key = value`` line are each parsed by tomllib on their own; a line that does not parse alone (the inside
    of a multi-line value) is skipped, and a path with no line of its own is placed at its nearest ancestor's.
    """

    def __init__(self, text: str):
        self.at: dict[tuple[str, ...], int] = {}
        table: tuple[str, ...] = ()
        for number, line in enumerate(text.splitlines(), 1):
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            if s.startswith("[") and not s.startswith("[["):
                try:
                    doc = tomllib.loads(s)
                except tomllib.TOMLDecodeError:
                    continue
                path = []
                while isinstance(doc, dict) and len(doc) == 1:
                    (k, doc), = doc.items()
                    path.append(k)
                    self.at.setdefault(tuple(path), number)
                table = tuple(path)
                continue
            try:
                doc = tomllib.loads(s)
            except tomllib.TOMLDecodeError:
                continue
            path = list(table)
            node: Any = doc
            while isinstance(node, dict) and len(node) == 1:
                (k, node), = node.items()
                path.append(k)
                self.at.setdefault(tuple(path), number)
                if not isinstance(node, dict):
                    break

    def line(self, *path: str) -> int | None:
        p = tuple(path)
        while p:
            if p in self.at:
                return self.at[p]
            p = p[:-1]
        return None


# --- the schema of one key ------------------------------------------------------------------------------------


class _KeySchemas:
    """The schemas a top-level key of a v2 type's definition must satisfy, from the pinned files."""

    def __init__(self, directory: str):
        self.registry = _Registry(os.path.join(directory, *SCHEMA_DIR.split("/")))
        self.compiler = _Compiler(self.registry)
        self.doc_uri = self.registry.uri_of_file(PAYLOADS_FILE)
        self.index = self.registry.docs[self.doc_uri][1]["_typeIndex"]["properties"]

    def parts(self, loc, node) -> list[tuple[tuple[str, str], dict]]:
        loc, node, _ = self.compiler.follow(loc, node)
        flat = _Parts()
        self.compiler.flatten(loc, node, flat, ())
        return flat.parts

    def of_key(self, v2type: str, key: str) -> list[tuple[tuple[str, str], Any]]:
        entry = self.index[v2type]
        loc = (self.doc_uri, f"/_typeIndex/properties/{_escape(v2type)}")
        out = []
        for part_loc, part in self.parts(loc, entry):
            props = part.get("properties") or {}
            if key in props:
                out.append(((part_loc[0], f"{part_loc[1]}/properties/{_escape(key)}"), props[key]))
        return out

    def check(self, loc, node, value: Any, where: str) -> str | None:
        """Why ``value`` does not satisfy the schema ``node`` at ``loc`` (None: it does, as far as checked)."""
        if node is True or node == {}:
            return None
        if node is False:
            return f"{where}: the schema admits no value"
        for part_loc, part in self.parts(loc, node):
            why = self._check_part(part_loc, part, value, where)
            if why:
                return why
        return None

    def _check_part(self, loc, part: dict, value: Any, where: str) -> str | None:
        t = part.get("type")
        if t is not None:
            types = t if isinstance(t, list) else [t]
            if not any(_is_type(value, x) for x in types):
                return f"{where}: expected JSON type {' or '.join(types)}, got {_json_type(value)} {_json(value)}"
        if "const" in part and not _same(value, part["const"]):
            return f"{where}: expected the value {_json(part['const'])}, got {_json(value)}"
        if "enum" in part and isinstance(part["enum"], list) and not any(_same(value, v) for v in part["enum"]):
            return f"{where}: {_json(value)} is not one of {_json(part['enum'])}"
        if isinstance(value, str):
            if isinstance(part.get("pattern"), str) and not re.search(part["pattern"], value):
                return f"{where}: {_json(value)} does not match the pattern {part['pattern']}"
            if isinstance(part.get("minLength"), int) and len(value) < part["minLength"]:
                return f"{where}: {_json(value)} is shorter than minLength {part['minLength']}"
            if isinstance(part.get("maxLength"), int) and len(value) > part["maxLength"]:
                return f"{where}: {_json(value)} is longer than maxLength {part['maxLength']}"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            for kw, ok in (("minimum", lambda b: value >= b), ("maximum", lambda b: value <= b),
                           ("exclusiveMinimum", lambda b: value > b), ("exclusiveMaximum", lambda b: value < b)):
                bound = part.get(kw)
                if isinstance(bound, (int, float)) and not isinstance(bound, bool) and not ok(bound):
                    return f"{where}: {_json(value)} is outside {kw} {bound}"
        if isinstance(value, dict):
            missing = [r for r in part.get("required") or [] if r not in value]
            if missing:
                return f"{where}: the object lacks the required keys {', '.join(missing)}"
            props = part.get("properties") or {}
            for k, v in value.items():
                if k in props:
                    why = self.check((loc[0], f"{loc[1]}/properties/{_escape(k)}"), props[k], v, f"{where}.{k}")
                    if why:
                        return why
                elif part.get("additionalProperties") is False and not any(
                        re.search(p, k) for p in (part.get("patternProperties") or {})):
                    return f"{where}: the object does not admit the key {k!r}"
        if isinstance(value, list) and isinstance(part.get("items"), (dict, bool)):
            for i, item in enumerate(value):
                why = self.check((loc[0], f"{loc[1]}/items"), part["items"], item, f"{where}[{i}]")
                if why:
                    return why
        return None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__  # a TOML date or time: no JSON type


def _is_json(value: Any) -> bool:
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    if isinstance(value, dict):
        return all(_is_json(v) for v in value.values())
    if isinstance(value, list):
        return all(_is_json(v) for v in value)
    return value is None or isinstance(value, (bool, int, str))


def _is_type(value: Any, t: str) -> bool:
    actual = _json_type(value)
    return actual == t or (t == "number" and actual == "integer") or (
        t == "integer" and isinstance(value, float) and value.is_integer())


def _same(a: Any, b: Any) -> bool:
    return _json_type(a) == _json_type(b) and a == b


# --- loading ----------------------------------------------------------------------------------------------------


def load_declarations(path: str | None, artifacts) -> Declarations:
    """Read and check the declarations file at ``path`` against ``artifacts`` (None: :data:`EMPTY`)."""
    if path is None:
        return EMPTY
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise DeclarationsError(f"{path}: cannot read: {e.strerror or e}") from None
    # A running seat checks the database's digest against its file every few seconds: the file is read each
    # time (so an edit is seen), checked once per content
    key = (path, hashlib.sha256(raw).hexdigest(), getattr(artifacts, "digest", None))
    if key not in _CHECKED:
        if len(_CHECKED) >= 8:
            _CHECKED.clear()
        _CHECKED[key] = parse_declarations(raw, path, artifacts)
    return _CHECKED[key]


_CHECKED: dict[tuple, Declarations] = {}


def parse_declarations(raw: bytes, path: str, artifacts) -> Declarations:
    """Check the bytes of a declarations file (named ``path`` in messages) against ``artifacts``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DeclarationsError(f"{path}: not UTF-8 ({e})") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise DeclarationsError(f"{path}: invalid TOML: {e}") from None
    lines = _Lines(text)

    def refuse(message: str, *keypath: str) -> DeclarationsError:
        line = lines.line(*keypath)
        return DeclarationsError(f"{path}:{line if line is not None else 1}: {message}")

    for key in doc:
        if key not in ("format", "version", "description", "types"):
            hint = " (the codemap is the only authority for types)" if key == TYPE_KEY else ""
            raise refuse(f"unknown key {key!r}: expected format, version, description and [types.\"<v2 type>\"]"
                         f"{hint}", key)
    if "format" not in doc:
        raise refuse(f"format: required (format = {FORMAT})")
    if doc["format"] != FORMAT or isinstance(doc["format"], bool):
        raise refuse(f"format: this openwop-seat reads format {FORMAT}, got {doc['format']!r}", "format")
    version = doc.get("version")
    if version is not None and (not isinstance(version, str) or not version.strip()):
        raise refuse(f"version: expected a non-empty string, got {version!r}", "version")
    description = doc.get("description")
    if description is not None and not isinstance(description, str):
        raise refuse(f"description: expected a string, got {description!r}", "description")
    types_doc = doc.get("types", {})
    if not isinstance(types_doc, dict):
        raise refuse("types: expected tables [types.\"<v2 type>\".aliases] and [types.\"<v2 type>\".legacy]",
                     "types")

    shapes = getattr(artifacts, "payload_shapes", {}) or {}
    schemas = _KeySchemas(artifacts.directory) if types_doc else None
    event_types = set(artifacts.v1_types) | set(artifacts.v2_types)
    out: dict[str, TypeDeclarations] = {}
    for t in sorted(types_doc):
        entry = types_doc[t]
        where = f"types.{t!r}"
        shape = shapes.get(t)
        if shape is None:
            if t in artifacts.v1_to_v2 and artifacts.v1_to_v2[t] in shapes:
                why = f"a v1 spelling; declarations are keyed by the v2 type ({artifacts.v1_to_v2[t]!r})"
            elif artifacts.is_vendor_type(t):
                why = "a registered vendor type: it has no v2 payload definition, its payload is carried as stored"
            else:
                why = "not a v2 event type with a payload definition in the pinned schemas"
            raise refuse(f"{where}: unknown type: {why}", "types", t)
        if not isinstance(entry, dict):
            raise refuse(f"{where}: expected a table with aliases and legacy", "types", t)
        for key in entry:
            if key == TYPE_KEY or key not in ("aliases", "legacy"):
                hint = (": a type mapping in disguise (the codemap is the only authority for types)"
                        if key in (TYPE_KEY, "v2", "v1", "rename", "maps_to") else "")
                raise refuse(f"{where}: unknown key {key!r}: expected aliases and legacy{hint}", "types", t, key)
        aliases = entry.get("aliases", {})
        legacy = entry.get("legacy", {})
        for name, table in (("aliases", aliases), ("legacy", legacy)):
            if not isinstance(table, dict):
                raise refuse(f"{where}.{name}: expected a table", "types", t, name)
        seen_targets: dict[str, str] = {}
        checked_aliases = []
        for source, target in aliases.items():
            at = ("types", t, "aliases", source)
            w = f"{where}.aliases.{source!r}"
            if not isinstance(target, str):
                raise refuse(f"{w}: expected the v2 key as a string, got {target!r}", *at)
            if TYPE_KEY in (source, target):
                raise refuse(f"{w}: an alias {'to' if target == TYPE_KEY else 'from'} {TYPE_KEY!r} is a type "
                             f"mapping in disguise (the codemap is the only authority for types)", *at)
            if target not in shape.declared:
                raise refuse(f"{w}: the target {target!r} is not a declared property of {t}'s v2 definition "
                             f"({shape.ref}: {', '.join(shape.declared)})", *at)
            if source == target:
                raise refuse(f"{w}: an alias to itself", *at)
            if source in shape.declared:
                raise refuse(f"{w}: the source {source!r} is itself a declared property of {t}'s v2 definition: "
                             f"renaming it would move a v2 key", *at)
            if re.search(HATCH_PATTERN, source):
                raise refuse(f"{w}: the source {source!r} is a hatch key ({HATCH_PATTERN}): its value is opaque and "
                             f"carried as it is, never renamed", *at)
            if target in seen_targets:
                raise refuse(f"{w}: the target {target!r} is already the target of {seen_targets[target]!r}: one "
                             f"alias per v2 key", *at)
            seen_targets[target] = source
            checked_aliases.append((source, target))
        checked_legacy = []
        filled = FILLED_BY_PROJECTION["*"] + FILLED_BY_PROJECTION.get(t, ())
        for key, value in legacy.items():
            at = ("types", t, "legacy", key)
            w = f"{where}.legacy.{key!r}"
            if key == TYPE_KEY:
                raise refuse(f"{w}: a legacy value for {TYPE_KEY!r} is a type mapping in disguise (the codemap is "
                             f"the only authority for types)", *at)
            if key not in shape.declared:
                raise refuse(f"{w}: {key!r} is not a declared property of {t}'s v2 definition ({shape.ref})", *at)
            if key not in shape.required:
                raise refuse(f"{w}: {key!r} is not required by {t}'s v2 definition: a legacy value is only for a "
                             f"required key nothing in the row provides", *at)
            if key in filled:
                raise refuse(f"{w}: the projection fills {key!r} from the row itself (docs/payload-projection.md); "
                             f"a legacy value would shadow the row's own", *at)
            hidden = _hidden_type(value, event_types)
            if hidden is not None:
                raise refuse(f"{w}: holds {hidden}: a type mapping in disguise (the codemap is the only authority "
                             f"for types)", *at)
            if not _is_json(value):
                raise refuse(f"{w}: {value!r} is not a JSON value (a TOML date or time, or a nan or inf)", *at)
            for loc, node in schemas.of_key(t, key):
                why = schemas.check(loc, node, value, w)
                if why:
                    raise refuse(f"{why} (the schema of {key!r} in {t}'s v2 definition)", *at)
            checked_legacy.append((key, value))
        if checked_aliases or checked_legacy:
            out[t] = TypeDeclarations(tuple(checked_aliases), tuple(checked_legacy))
    return Declarations(path=path, version=version, description=description, types=out,
                        digest=digest_of(version, out))


def _hidden_type(value: Any, event_types: set[str], trail: str = "") -> str | None:
    """A ``type`` key at any depth of ``value`` whose value is an event type of the codemap, described."""
    if isinstance(value, dict):
        for k, v in value.items():
            here = f"{trail}.{k}" if trail else k
            if k == TYPE_KEY and isinstance(v, str) and v in event_types:
                return f"{here} = {v!r}, an event type of the codemap"
            found = _hidden_type(v, event_types, here)
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _hidden_type(v, event_types, f"{trail}[{i}]")
            if found:
                return found
    return None


def declarations_for(config, artifacts) -> Declarations:
    """The declarations ``config`` names (``[host] declarations_file``), checked against ``artifacts``."""
    return load_declarations(getattr(config.host, "declarations_file", None), artifacts)


__all__ = ["EMPTY", "FORMAT", "Declarations", "DeclarationsError", "TypeDeclarations", "declarations_for",
           "digest_of", "load_declarations", "parse_declarations"]
