"""The pinned OpenWOP spec artifacts: the codemap, the org registry and the error registry.

Everything the seat knows about event-type vocabularies comes from the vendored
files under ``proxy/spec/`` (listed in ``proxy/spec/MANIFEST.json``); this module
holds no mapping of its own (persistence.md: "A host MUST NOT carry a private
mapping").  It only reads the files, checks them, and compiles the lookup tables
the hot path uses.  Loading is all-or-nothing: any defect raises
:class:`ArtifactError` naming the file and, where there is one, the row.

Row numbers in messages count from 1 in file order.

The set's digest is computed, never stored: SHA-256 over, for each file in the
manifest's order, ``path + b"\\0" + str(len(content)) + b"\\0" + content``, where
``path`` is the manifest's relative POSIX path in UTF-8.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Any

from proxy.artifacts._json import ArtifactError, parse_json
from proxy.artifacts.payload_shapes import PayloadSchemaError, compile_payload_schemas

MANIFEST = "MANIFEST.json"
CODEMAP = "event-codemap.json"
DECLARATION = "declaration.json"
ERRORS = "errors.json"
RUN_EVENT_SCHEMA = "schemas/v2/run-event.schema.json"

# The files this module reads itself; the manifest must list them.
REQUIRED_FILES = (CODEMAP, DECLARATION, ERRORS)

# The codes the seat raises (events.md §Era-2 logs); errors.json must register them.
REQUIRED_ERROR_CODES = ("event_type_unmapped", "payload_unprojectable")

# Which grammar a v2 name is checked against.
#
# Two patterns are in play and every codemap v2 name must match both:
#
# * V2_EVENT_TYPE_GRAMMAR, the v2 wire grammar for an event `type` (RFC 0171
#   §A.1, events.md; the pattern branch of `properties.type.oneOf` in
#   schemas/v2/run-event.schema.json): two or three kebab segments, `openwop.`
#   reserved.  This is the rule that governs, because every type the seat hands
#   a v2 reader must satisfy it (scenario v2-event-type-closed).  It is written
#   here rather than read from the schema so that a pinned set whose grammar
#   differs is refused at load (see _check_schema_grammar) instead of silently
#   changing the seat's behaviour.
# * the codemap's own `grammar` field, the generator's naming rule for protocol
#   types: exactly two kebab segments, with no `openwop.` exclusion.  Neither
#   pattern implies the other, and a row that fails the codemap's own rule
#   means the codemap contradicts itself, so it is checked too.
#
# Both are ECMA-262 patterns that use only constructs Python's `re` reads the
# same way; they are applied with fullmatch so `$` cannot match before a
# trailing newline.
V2_EVENT_TYPE_GRAMMAR = (
    r"^(?!openwop\.)[a-z][a-z0-9]*(-[a-z0-9]+)*\.[a-z][a-z0-9]*(-[a-z0-9]+)*"
    r"(\.[a-z][a-z0-9]*(-[a-z0-9]+)*)?$"
)
_V2_EVENT_TYPE = re.compile(V2_EVENT_TYPE_GRAMMAR)

# A segment that matches `[a-z][a-z0-9]*(-[a-z0-9]+)*`, used to test org keys
# against extensionsKeyPattern (see _declaration).
_PROBE_NAME = "a"


@dataclass(frozen=True)
class Artifacts:
    tag: str
    digest: str
    directory: str
    v1_to_v2: dict[str, str]
    v2_to_v1: dict[str, str] | None
    bijection_problem: str | None
    renamed: frozenset[str]
    v1_types: frozenset[str]
    v2_types: frozenset[str]
    vendor_orgs: frozenset[str]
    reserved_orgs: frozenset[str]
    errors: dict[str, dict]
    rows: int
    renamed_count: int
    type_map_v1_to_v2: dict[bytes, bytes]
    type_map_v2_to_v1: dict[bytes, bytes] | None
    # v2 type -> compiled payload shape (proxy.payloads), from schemas/v2; empty when the set has none
    payload_shapes: dict = field(default_factory=dict)

    def is_vendor_type(self, t: str) -> bool:
        """True when ``t``'s first dot-segment is an org registered in declaration.json.

        Registration only: the rest of the name is not checked against any
        grammar (spec digest §6 Q14; persistence.md "'Vendor-prefixed' means the
        first segment is an org registered in the `extensions` object").  A name
        with no dot has no prefix and is not a vendor type.
        """
        org, dot, _ = t.partition(".")
        return bool(dot) and org in self.vendor_orgs and org not in self.reserved_orgs


def default_directory() -> str:
    """The artifact folder shipped inside the package (``proxy/spec``)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "spec")


def load_artifacts(directory: str | None = None) -> Artifacts:
    """Read, check and compile the artifact set in ``directory`` (default: the packaged one)."""
    directory = os.fspath(directory) if directory is not None else default_directory()
    tag, files = _manifest(directory)
    _no_unlisted_files(directory, files)
    contents = {rel: _read(directory, rel) for rel in files}
    docs = {rel: parse_json(rel, content) for rel, content in contents.items()}

    digest = hashlib.sha256()
    for rel in files:
        content = contents[rel]
        digest.update(rel.encode("utf-8") + b"\0" + str(len(content)).encode("ascii") + b"\0" + content)

    v1_to_v2, bijection_problem = _codemap(docs[CODEMAP])
    vendor_orgs, reserved_orgs = _declaration(docs[DECLARATION])
    errors = _errors(docs[ERRORS])
    if RUN_EVENT_SCHEMA in docs:
        _check_schema_grammar(docs[RUN_EVENT_SCHEMA])

    renamed = frozenset(v1 for v1, v2 in v1_to_v2.items() if v1 != v2)
    bijective = bijection_problem is None
    return Artifacts(
        tag=tag,
        digest=digest.hexdigest(),
        directory=directory,
        v1_to_v2=v1_to_v2,
        v2_to_v1={v2: v1 for v1, v2 in v1_to_v2.items()} if bijective else None,
        bijection_problem=bijection_problem,
        renamed=renamed,
        v1_types=frozenset(v1_to_v2),
        v2_types=frozenset(v1_to_v2.values()),
        vendor_orgs=vendor_orgs,
        reserved_orgs=reserved_orgs,
        errors=errors,
        rows=len(v1_to_v2),
        renamed_count=len(renamed),
        type_map_v1_to_v2={v1.encode(): v1_to_v2[v1].encode() for v1 in renamed},
        type_map_v2_to_v1={v1_to_v2[v1].encode(): v1.encode() for v1 in renamed} if bijective else None,
        payload_shapes=_payload_shapes(directory, files),
    )


def _payload_shapes(directory: str, files: list[str]) -> dict:
    if not any(rel.startswith("schemas/v2/") for rel in files):
        return {}
    try:
        return compile_payload_schemas(directory)
    except PayloadSchemaError as e:
        raise ArtifactError(f"payload schemas: {e}") from None


def check_report(a: Artifacts) -> str:
    """Human-readable lines describing a loaded set (``openwop-seat check``)."""
    if a.bijection_problem is None:
        bijection = "holds (the v1 read path of era-3 logs maps types back through the inverted codemap)"
    else:
        bijection = f"FAILS: {a.bijection_problem} (the v1 read path of era-3 logs is refused)"
    lines = [
        f"tag: {a.tag}",
        f"digest: {a.digest} (sha256)",
        f"directory: {a.directory}",
        f"codemap rows: {a.rows}",
        f"renamed: {a.renamed_count} ({a.rows - a.renamed_count} identity rows)",
        f"vendor orgs: {len(a.vendor_orgs)} ({', '.join(sorted(a.vendor_orgs))})",
        f"reserved orgs: {', '.join(sorted(a.reserved_orgs))}",
        f"error codes: {len(a.errors)}",
        f"bijection: {bijection}",
    ]
    return "\n".join(lines)

def _read(directory: str, rel: str) -> bytes:
    try:
        with open(os.path.join(directory, *rel.split("/")), "rb") as f:
            return f.read()
    except FileNotFoundError:
        if rel == MANIFEST:
            raise ArtifactError(f"{MANIFEST}: missing from the artifact folder {directory}") from None
        raise ArtifactError(f"{rel}: listed in {MANIFEST} but missing from the artifact folder") from None
    except OSError as e:
        raise ArtifactError(f"{rel}: cannot read: {e.strerror}") from None

def _manifest(directory: str) -> tuple[str, list[str]]:
    doc = parse_json(MANIFEST, _read(directory, MANIFEST))
    if not isinstance(doc, dict) or set(doc) != {"tag", "files"}:
        raise ArtifactError(f'{MANIFEST}: expected an object with exactly the keys "tag" and "files"')
    tag, files = doc["tag"], doc["files"]
    if not isinstance(tag, str) or not tag.strip():
        raise ArtifactError(f"{MANIFEST}: tag must be a non-empty string")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise ArtifactError(f"{MANIFEST}: files must be a list of strings")
    for rel in files:
        parts = rel.split("/")
        if (not rel or rel.startswith("/") or "\\" in rel or "\0" in rel
                or any(p in ("", ".", "..") for p in parts) or rel == MANIFEST):
            raise ArtifactError(f"{MANIFEST}: {rel!r} is not a relative path inside the artifact folder")
    if files != sorted(set(files)):
        raise ArtifactError(f"{MANIFEST}: files must be sorted and unique")
    for rel in REQUIRED_FILES:
        if rel not in files:
            raise ArtifactError(f"{MANIFEST}: files does not list {rel}")
    return tag, files


def _no_unlisted_files(directory: str, files: list[str]) -> None:
    """A JSON file in the folder but not in the manifest would escape the digest: refuse it."""
    listed = set(files) | {MANIFEST}
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if not name.endswith(".json"):
                continue
            rel = os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
            if rel not in listed:
                raise ArtifactError(f"{rel}: in the artifact folder but not listed in {MANIFEST}")


# --- checking ------------------------------------------------------------------


def _compile(name: str, field: str, pattern: Any) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise ArtifactError(f"{name}: {field} must be a string")
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ArtifactError(f"{name}: {field} {pattern!r} is not a usable pattern: {e}") from None


def _count(name: str, counts: dict, key: str) -> int:
    value = counts.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ArtifactError(f"{name}: counts.{key} must be an integer")
    return value


def _codemap(doc: Any) -> tuple[dict[str, str], str | None]:
    """Return (v1 -> v2 for every row, the bijection problem or None)."""
    name = CODEMAP
    if not isinstance(doc, dict):
        raise ArtifactError(f"{name}: expected an object")
    own_grammar = _compile(name, "grammar", doc.get("grammar"))
    counts = doc.get("counts")
    if not isinstance(counts, dict):
        raise ArtifactError(f"{name}: counts must be an object")
    rows = doc.get("rows")
    if not isinstance(rows, list) or not rows:
        raise ArtifactError(f"{name}: rows must be a non-empty list")

    v1_to_v2: dict[str, str] = {}
    row_of: dict[str, int] = {}
    v1s_of: dict[str, list[str]] = {}
    for number, row in enumerate(rows, 1):
        where = f"{name} row {number}"
        if not isinstance(row, dict):
            raise ArtifactError(f"{where}: expected an object")
        v1 = row.get("v1")
        if not isinstance(v1, str) or not v1:
            raise ArtifactError(f"{where}: v1 must be a non-empty string")
        where = f"{name} row {number} (v1 {v1!r})"
        v2 = row.get("v2")
        if not isinstance(v2, str) or not v2:
            raise ArtifactError(f"{where}: v2 must be a non-empty string")
        status = row.get("status")
        if status != "decided":
            raise ArtifactError(f"{where}: status is {status!r}, expected 'decided'")
        override = row.get("v2Override")
        if override is not None and override != v2:
            raise ArtifactError(f"{where}: v2Override {override!r} disagrees with v2 {v2!r}")
        if v1 in row_of:
            raise ArtifactError(f"{where}: duplicate v1 name, already on row {row_of[v1]}")
        if not _V2_EVENT_TYPE.fullmatch(v2):
            raise ArtifactError(
                f"{where}: v2 name {v2!r} does not match the v2 event-type grammar {V2_EVENT_TYPE_GRAMMAR}")
        if not own_grammar.fullmatch(v2):
            raise ArtifactError(
                f"{where}: v2 name {v2!r} does not match the codemap's own grammar {own_grammar.pattern}")
        v1_to_v2[v1] = v2
        row_of[v1] = number
        v1s_of.setdefault(v2, []).append(v1)

    renamed = sum(1 for v1, v2 in v1_to_v2.items() if v1 != v2)
    if _count(name, counts, "rows") != len(rows):
        raise ArtifactError(f"{name}: counts.rows is {counts['rows']}, but the file has {len(rows)} rows")
    if _count(name, counts, "renamed") != renamed:
        raise ArtifactError(f"{name}: counts.renamed is {counts['renamed']}, but {renamed} rows rename their type")

    # Not a load error: persistence.md §"The v1 wire of an era-3 log" says to
    # refuse the v1 representation rather than guess a spelling.
    problems = []
    for v2, v1s in v1s_of.items():
        if len(v1s) > 1:
            how_many = "two" if len(v1s) == 2 else str(len(v1s))
            problems.append(f"v2 name {v2!r} has {how_many} v1 names: {', '.join(repr(v) for v in v1s)}")
    return v1_to_v2, "; ".join(problems) or None


def _declaration(doc: Any) -> tuple[frozenset[str], frozenset[str]]:
    """Return (registered orgs, reserved orgs)."""
    name = DECLARATION
    if not isinstance(doc, dict):
        raise ArtifactError(f"{name}: expected an object")
    key_pattern = _compile(name, "extensionsKeyPattern", doc.get("extensionsKeyPattern"))
    reserved = doc.get("reservedOrgs")
    if not isinstance(reserved, list) or not all(isinstance(r, str) and r for r in reserved):
        raise ArtifactError(f"{name}: reservedOrgs must be a list of non-empty strings")
    extensions = doc.get("extensions")
    if not isinstance(extensions, dict):
        raise ArtifactError(f"{name}: extensions must be an object")
    for org, entry in extensions.items():
        where = f"{name} extensions {org!r}"
        if org in reserved:
            raise ArtifactError(f"{where}: the org is in reservedOrgs and can never be registered")
        # extensionsKeyPattern is the shape of `<org>.<name>` (the shape a vendor
        # type must have), while the registry's keys are bare orgs (`example`,
        # `openwop-app`, ...) that can never match it literally.  An org key is
        # therefore accepted when it has no dot and `<org>.<name>` matches the
        # pattern for a valid name, i.e. when it is a valid first segment.
        if "." in org or not key_pattern.fullmatch(f"{org}.{_PROBE_NAME}"):
            raise ArtifactError(
                f"{where}: not an org segment of extensionsKeyPattern {key_pattern.pattern}")
        if not isinstance(entry, dict):
            raise ArtifactError(f"{where}: expected an object")
        for required in ("name", "registered"):  # required by RFC 0180 §A.2
            if not isinstance(entry.get(required), str) or not entry[required]:
                raise ArtifactError(f"{where}: {required} must be a non-empty string")
    return frozenset(extensions), frozenset(reserved)


def _errors(doc: Any) -> dict[str, dict]:
    name = ERRORS
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise ArtifactError(f"{name}: expected an object with a rows list")
    by_code: dict[str, dict] = {}
    row_of: dict[str, int] = {}
    for number, row in enumerate(doc["rows"], 1):
        if not isinstance(row, dict) or not isinstance(row.get("code"), str) or not row["code"]:
            raise ArtifactError(f"{name} row {number}: expected an object with a non-empty string code")
        code = row["code"]
        if code in by_code:
            raise ArtifactError(f"{name} row {number} (code {code!r}): duplicate code, already on row {row_of[code]}")
        by_code[code] = row
        row_of[code] = number
    for code in REQUIRED_ERROR_CODES:
        if code not in by_code:
            raise ArtifactError(f"{name}: code {code!r} is not registered, and the seat raises it")
    return by_code


def _check_schema_grammar(doc: Any) -> None:
    """The pinned run-event schema must state the grammar this module enforces."""

    def member(value: Any, key: str) -> Any:
        return value.get(key) if isinstance(value, dict) else None

    alternatives = member(member(member(doc, "properties"), "type"), "oneOf")
    if not isinstance(alternatives, list):
        alternatives = []
    patterns = [p for p in (member(alt, "pattern") for alt in alternatives) if p is not None]
    if V2_EVENT_TYPE_GRAMMAR not in patterns:
        raise ArtifactError(
            f"{RUN_EVENT_SCHEMA}: properties.type does not state the v2 event-type grammar "
            f"{V2_EVENT_TYPE_GRAMMAR} (it has {patterns!r}); the seat must be reviewed before adopting this set")
