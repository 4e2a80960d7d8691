"""The v2 payload schemas, compiled into per-type object shapes for the projection.

The normative map from a v2 event type to its payload definition is the *root*
``_typeIndex`` of ``schemas/v2/run-event-payloads.schema.json`` (its
``properties`` object; the sibling ``$defs._typeIndex`` is the informative v1
map and is not read).  Each entry is followed through ``$ref`` (within a file,
``#/$defs/X``, and across files, by relative or absolute URI) and through
``allOf``, and compiled into an :class:`ObjectShape`: the keys the definition
declares, the keys it requires, whether it is closed, whether it carries the
hatch, and the shapes of the nested objects below it.  Nothing here is
per-type: every fact comes from the vendored files (issue #4; spec digest §2).

Reading rules (JSON Schema 2020-12, restricted to what the projection needs):

* **Where a file is found.**  Every ``schemas/v2/*.json`` file is registered
  under its ``$id`` (a file without one gets a private base URI from its name).
  A ``$ref`` is resolved against the ``$id`` of the file it appears in; a URI
  that names no registered file falls back to the registered file with the
  same last path segment.  Fragments are JSON pointers (``#/$defs/X``);
  ``$anchor`` fragments are not supported and raise.
* **Merging.**  A schema's own keywords, its ``$ref`` target (siblings of
  ``$ref`` apply too, as in 2020-12) and each ``allOf`` branch are merged:
  declared keys in schema order (own first, then the ``$ref`` target, then the
  ``allOf`` branches), required keys unioned, closed when any part is closed.
  When a part is closed, a key another part declares survives only if that
  closed part admits it too (declares it or a pattern of its matches), because
  ``additionalProperties: false`` only sees its own sibling ``properties``.
* **Conditionals** (``if``/``then``/``else``) add no declared or required keys
  (a ``then`` cannot widen a closed object, whose ``additionalProperties``
  sees only its siblings).  One form is recorded because the projection needs
  it: ``if: {properties: {K: {const: V}}} then: {properties: {P: <object>}}``
  binds the shape of property ``P`` to the value of sibling ``K``
  (``suspend-request.schema.json`` binds ``data`` to ``kind`` this way), kept
  in :attr:`ObjectShape.discriminated`.
* **Closed / open.**  A shape is closed when ``additionalProperties`` or
  ``unevaluatedProperties`` is ``false`` on any merged part; otherwise it is
  open (absent, ``true`` or a schema all admit undeclared keys).
* **Hatched.**  A shape is hatched when a merged part's ``patternProperties``
  has exactly the key :data:`HATCH_PATTERN` (``^(openwop-|x-|vendor\\.)``, the
  only hatch spelling in the vendored set) with a subschema other than
  ``false``.  The hatch is per shape: a nested object is hatched only if its
  own definition says so (the digest §2.2 step 5).
* **Unions** (``oneOf``/``anyOf``).  A union is recorded, not flattened: the
  shape's own ``declared``/``required`` are those of its base (the keywords
  beside the union), and :attr:`ObjectShape.union` holds one shape per branch,
  each branch merged with the base.  When every branch is an object the union
  is projectable; a branch that is not an object (a string enum, say) is left
  out and :attr:`ObjectShape.unprojectable` says so.  A union whose branches
  are all non-objects is not an object at all and is not recorded as nested.
  Two unions on one merged schema are not combined:
  :attr:`ObjectShape.unprojectable` is set and no branches are recorded.
* **Nested objects.**  A property whose schema compiles to an object (``type``
  ``object``, or no ``type`` but object keywords) is in
  :attr:`ObjectShape.nested`; an array property whose ``items`` compile to an
  object is in :attr:`ObjectShape.items`.  A bare ``{}`` (any value) is not an
  object and is not recorded.
* **Cycles.**  Recursion through a property (a tree of nodes) is fine: the
  shape is shared, and the graph is cyclic.  A ``$ref``/``allOf`` chain that
  comes back to itself without passing through a property has no meaning and
  raises :class:`PayloadSchemaError`.

Shapes are compared by identity (the graph can be cyclic, so structural
equality is not computed); compile once and keep the result.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from proxy.artifacts._json import ArtifactError, parse_json
from proxy.errors import SeatException

SCHEMA_DIR = "schemas/v2"
PAYLOADS_FILE = "run-event-payloads.schema.json"

# The hatch, spelled as the vendored schemas spell it (a JSON object key).
HATCH_PATTERN = r"^(openwop-|x-|vendor\.)"

# Keywords that make a schema more than a plain reference.
_STRUCTURAL = frozenset({
    "type", "properties", "patternProperties", "additionalProperties", "unevaluatedProperties",
    "required", "allOf", "oneOf", "anyOf", "items", "if", "then", "else",
})
# Keywords whose presence (with no `type`) means "this is an object schema".
_OBJECT_KEYWORDS = ("properties", "patternProperties", "additionalProperties",
                    "unevaluatedProperties", "required")
_PRIVATE_BASE = "https://openwop-seat.invalid/schemas/v2/"


class PayloadSchemaError(SeatException):
    """The payload schemas cannot be compiled; the message names the type and the ref."""


@dataclass(frozen=True, eq=False, repr=False)
class ObjectShape:
    """The compiled shape of one object definition.

    ``ref`` is where the definition is (``file#pointer``, relative to
    ``schemas/v2``); ``via`` is the chain of ``$ref`` targets followed to reach
    it from the referring schema (for a top-level shape, from the
    ``_typeIndex`` entry), ending at ``ref``.
    """

    ref: str
    via: tuple[str, ...]
    declared: tuple[str, ...]
    required: frozenset[str]
    hatched: bool
    open: bool
    patterns: tuple[str, ...] = ()
    nested: dict[str, ObjectShape] = field(default_factory=dict)
    items: dict[str, ObjectShape] = field(default_factory=dict)
    union: tuple[ObjectShape, ...] = ()
    union_kind: str | None = None
    discriminated: dict[str, tuple[str, dict[str, ObjectShape]]] = field(default_factory=dict)
    unprojectable: str | None = None

    @property
    def closed(self) -> bool:
        return not self.open

    def admits(self, key: str) -> bool:
        """True when ``key`` may appear here: declared, matching a pattern, or the shape is open."""
        return self.open or key in self.declared or any(re.search(p, key) for p in self.patterns)

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        state = "open" if self.open else ("closed+hatched" if self.hatched else "closed")
        extra = f", union={self.union_kind}[{len(self.union)}]" if self.union_kind else ""
        return f"ObjectShape({self.ref}, {state}, {len(self.declared)} declared{extra})"


# --- compiling -----------------------------------------------------------------


def compile_payload_schemas(directory: str | os.PathLike[str]) -> dict[str, ObjectShape]:
    """Compile the root ``_typeIndex`` of the payload schemas in ``directory`` (an artifact folder).

    ``directory`` is the folder that holds ``schemas/v2/`` (``Artifacts.directory``).
    Returns one shape per v2 type, in ``_typeIndex`` order.
    """
    registry = _Registry(os.path.join(os.fspath(directory), *SCHEMA_DIR.split("/")))
    doc_uri = registry.uri_of_file(PAYLOADS_FILE)
    root = registry.docs[doc_uri][1]
    index = root.get("_typeIndex") if isinstance(root, dict) else None
    entries = index.get("properties") if isinstance(index, dict) else None
    if not isinstance(entries, dict) or not entries:
        raise PayloadSchemaError(f"{PAYLOADS_FILE}: the root _typeIndex has no properties object")
    compiler = _Compiler(registry)
    shapes: dict[str, ObjectShape] = {}
    for v2type, entry in entries.items():
        where = f"{PAYLOADS_FILE}#/_typeIndex/properties/{_escape(v2type)}"
        try:
            shape = compiler.shape((doc_uri, _pointer_of(where)), entry)
        except PayloadSchemaError as e:
            raise PayloadSchemaError(f"type {v2type!r}: {e}") from None
        if shape is None:
            raise PayloadSchemaError(f"type {v2type!r}: {where} does not resolve to an object definition")
        shapes[v2type] = shape
    return shapes


class _Registry:
    """The schema files of one folder, by URI."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.docs: dict[str, tuple[str, Any]] = {}  # uri (no fragment) -> (file name, document)
        self.by_name: dict[str, str] = {}  # file name -> uri
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
        except OSError as e:
            raise PayloadSchemaError(f"{SCHEMA_DIR}: cannot list the schema folder: {e.strerror}") from None
        for name in names:
            try:
                with open(os.path.join(folder, name), "rb") as f:
                    content = f.read()
            except OSError as e:
                raise PayloadSchemaError(f"{SCHEMA_DIR}/{name}: cannot read: {e.strerror}") from None
            try:
                doc = parse_json(f"{SCHEMA_DIR}/{name}", content)
            except ArtifactError as e:
                raise PayloadSchemaError(str(e)) from None
            uri = doc.get("$id") if isinstance(doc, dict) else None
            if not isinstance(uri, str) or not uri:
                uri = _PRIVATE_BASE + name
            uri = urllib.parse.urldefrag(uri)[0]
            if uri in self.docs:
                raise PayloadSchemaError(
                    f"{SCHEMA_DIR}/{name}: $id {uri} is also the $id of {self.docs[uri][0]}")
            self.docs[uri] = (name, doc)
            self.by_name[name] = uri
        if PAYLOADS_FILE not in self.by_name:
            raise PayloadSchemaError(f"{SCHEMA_DIR}/{PAYLOADS_FILE}: missing")

    def uri_of_file(self, name: str) -> str:
        return self.by_name[name]

    def name(self, loc: tuple[str, str]) -> str:
        return f"{self.docs[loc[0]][0]}#{loc[1]}"

    def resolve(self, base: str, ref: str, at: str) -> tuple[tuple[str, str], Any]:
        """Return ((uri, pointer), node) for ``ref`` written in the document ``base``."""
        target, fragment = urllib.parse.urldefrag(urllib.parse.urljoin(base, ref))
        if target not in self.docs:
            name = target.rsplit("/", 1)[-1]
            if name in self.by_name:
                target = self.by_name[name]
            else:
                raise PayloadSchemaError(f"$ref {ref!r} at {at}: no schema file {name!r} in {SCHEMA_DIR}")
        pointer = urllib.parse.unquote(fragment)
        if pointer and not pointer.startswith("/"):
            raise PayloadSchemaError(f"$ref {ref!r} at {at}: only JSON-pointer fragments are supported")
        node = self.docs[target][1]
        for token in pointer.split("/")[1:]:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                raise PayloadSchemaError(
                    f"$ref {ref!r} at {at}: {self.docs[target][0]}#{pointer} does not exist")
        return (target, pointer), node


class _Parts:
    """A schema flattened through `$ref` and `allOf`: its unconditional parts and its conditionals."""

    def __init__(self) -> None:
        self.parts: list[tuple[tuple[str, str], dict]] = []
        self.conditionals: list[tuple[tuple[str, str], dict]] = []
        self.unions: list[tuple[tuple[str, str], str, list]] = []


class _Compiler:
    def __init__(self, registry: _Registry) -> None:
        self.registry = registry
        self.memo: dict[tuple[tuple[str, str], tuple[str, ...]], ObjectShape | None] = {}

    # A location is (document uri, JSON pointer); `name` renders it as file#pointer.
    def name(self, loc: tuple[str, str]) -> str:
        return self.registry.name(loc)

    def follow(self, loc: tuple[str, str], node: Any) -> tuple[tuple[str, str], Any, tuple[str, ...]]:
        """Follow plain references (a `$ref` with no structural siblings) to the schema they name."""
        seen = [loc]
        via: list[str] = []
        while isinstance(node, dict) and isinstance(node.get("$ref"), str) and not (_STRUCTURAL & node.keys()):
            loc, node = self.registry.resolve(loc[0], node["$ref"], self.name(loc))
            if loc in seen:
                chain = " -> ".join(self.name(s) for s in [*seen, loc])
                raise PayloadSchemaError(f"$ref cycle: {chain}")
            seen.append(loc)
            via.append(self.name(loc))
        return loc, node, tuple(via)

    def flatten(self, loc: tuple[str, str], node: Any, out: _Parts, stack: tuple) -> None:
        if node is True or node == {}:
            return
        if not isinstance(node, dict):
            raise PayloadSchemaError(f"{self.name(loc)}: a schema must be an object or a boolean")
        if loc in stack:
            chain = " -> ".join(self.name(s) for s in [*stack, loc])
            raise PayloadSchemaError(f"$ref/allOf cycle: {chain}")
        stack = (*stack, loc)
        out.parts.append((loc, node))
        for kw in ("oneOf", "anyOf"):
            if kw in node:
                if not isinstance(node[kw], list) or not node[kw]:
                    raise PayloadSchemaError(f"{self.name(loc)}: {kw} must be a non-empty list")
                out.unions.append((loc, kw, node[kw]))
        if "if" in node:
            out.conditionals.append((loc, node))
        ref = node.get("$ref")
        if ref is not None:
            if not isinstance(ref, str):
                raise PayloadSchemaError(f"{self.name(loc)}: $ref must be a string")
            target_loc, target = self.registry.resolve(loc[0], ref, self.name(loc))
            self.flatten(target_loc, target, out, stack)
        branches = node.get("allOf", [])
        if not isinstance(branches, list):
            raise PayloadSchemaError(f"{self.name(loc)}: allOf must be a list")
        for i, branch in enumerate(branches):
            self.flatten((loc[0], f"{loc[1]}/allOf/{i}"), branch, out, stack)

    def shape(self, loc: tuple[str, str], node: Any, base: _Parts | None = None) -> ObjectShape | None:
        """Compile the schema at ``loc`` (merged with ``base``, for a union branch); None if not an object."""
        via: tuple[str, ...] = ()
        if base is None:
            loc, node, via = self.follow(loc, node)
            key = (loc, via)
            if key in self.memo:
                return self.memo[key]
        flat = _Parts()
        self.flatten(loc, node, flat, ())
        if base is not None:
            flat.parts[:0] = base.parts
            flat.conditionals[:0] = base.conditionals
        if not self._is_object(flat):
            if base is None:
                self.memo[(loc, via)] = None
            return None

        parts = [p for _, p in flat.parts]
        declared: list[str] = []
        for part_loc, part in flat.parts:
            props = part.get("properties", {})
            if not isinstance(props, dict):
                raise PayloadSchemaError(f"{self.name(part_loc)}: properties must be an object")
            declared.extend(k for k in props if k not in declared)
        patterns: list[str] = []
        for part_loc, part in flat.parts:
            pp = part.get("patternProperties", {})
            if not isinstance(pp, dict):
                raise PayloadSchemaError(f"{self.name(part_loc)}: patternProperties must be an object")
            patterns.extend(p for p, sub in pp.items() if sub is not False and p not in patterns)
        closing = [p for p in parts if p.get("additionalProperties") is False
                   or p.get("unevaluatedProperties") is False]
        for part in closing:
            own = part.get("properties", {})
            own_patterns = [p for p, s in part.get("patternProperties", {}).items() if s is not False]
            declared = [k for k in declared if k in own or any(re.search(p, k) for p in own_patterns)]
        required: set[str] = set()
        for part_loc, part in flat.parts:
            req = part.get("required", [])
            if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
                raise PayloadSchemaError(f"{self.name(part_loc)}: required must be a list of strings")
            required.update(req)

        unsatisfiable = None
        if closing:
            stranded = sorted(r for r in required if r not in declared
                              and not any(re.search(p, r) for p in patterns))
            if stranded:
                unsatisfiable = (f"required {stranded} but a closed part does not admit them "
                                 "(additionalProperties: false sees only its own sibling properties)")
        shape = ObjectShape(
            ref=self.name(loc),
            via=via or (self.name(loc),),
            declared=tuple(declared),
            required=frozenset(required),
            hatched=HATCH_PATTERN in patterns,
            open=not closing,
            patterns=tuple(patterns),
            unprojectable=unsatisfiable,
        )
        if base is None:
            self.memo[(loc, via)] = shape  # before recursing: a property may lead back here

        for part_loc, part in flat.parts:
            for prop, sub in part.get("properties", {}).items():
                if prop not in declared:
                    continue
                sub_loc = (part_loc[0], f"{part_loc[1]}/properties/{_escape(prop)}")
                child = self.shape(sub_loc, sub)
                if child is not None and prop not in shape.nested:
                    shape.nested[prop] = child
                items = _items_of(self, sub_loc, sub)
                if items is not None and prop not in shape.items:
                    item_loc, item_node = items
                    item = self.shape(item_loc, item_node)
                    if item is not None:
                        shape.items[prop] = item

        if flat.unions:
            self._union(shape, flat)
        self._discriminators(shape, flat)
        return shape

    def _is_object(self, flat: _Parts) -> bool:
        return _is_object(flat, self)

    def _union(self, shape: ObjectShape, flat: _Parts) -> None:
        if len(flat.unions) > 1:
            where = ", ".join(f"{self.name(loc)}/{kw}" for loc, kw, _ in flat.unions)
            object.__setattr__(shape, "union_kind", flat.unions[0][1])
            object.__setattr__(shape, "unprojectable", f"more than one union on one schema ({where})")
            return
        loc, kw, branches = flat.unions[0]
        base = _Parts()
        base.parts = [(ploc, {k: v for k, v in p.items() if k not in ("oneOf", "anyOf")}) for ploc, p in flat.parts]
        if (any(p.get("additionalProperties") is False for _, p in base.parts)
                and not any(p.get("properties") or p.get("patternProperties") for _, p in base.parts)):
            # A closed base that declares nothing admits no key at all, so no branch could ever validate
            # (orchestrator-decision.schema.json's root; a schema defect, SOURCES.md). The branches are
            # taken as the seats: the base's additionalProperties is not merged into them (ADR 0007).
            base.parts = [(ploc, {k: v for k, v in p.items() if k != "additionalProperties"})
                          for ploc, p in base.parts]
            note = f"{self.name(loc)}: closed base without properties; its {kw} branches are taken as the seats"
            object.__setattr__(shape, "unprojectable",
                               f"{shape.unprojectable}; {note}" if shape.unprojectable else note)
        trivial = not any(k in p for _, p in base.parts for k in _OBJECT_KEYWORDS)
        options: list[ObjectShape] = []
        skipped: list[int] = []
        for i, branch in enumerate(branches):
            branch_loc = (loc[0], f"{loc[1]}/{kw}/{i}")
            option = self.shape(branch_loc, branch) if trivial else self.shape(branch_loc, branch, base)
            if option is None:
                skipped.append(i)
            else:
                options.append(option)
        object.__setattr__(shape, "union", tuple(options))
        object.__setattr__(shape, "union_kind", kw)
        if skipped:
            note = f"{self.name(loc)}/{kw}: branches {skipped} are not objects"
            object.__setattr__(shape, "unprojectable",
                               f"{shape.unprojectable}; {note}" if shape.unprojectable else note)

    def _discriminators(self, shape: ObjectShape, flat: _Parts) -> None:
        for cond_loc, cond in flat.conditionals:
            test, then = cond.get("if"), cond.get("then")
            if not isinstance(test, dict) or not isinstance(then, dict):
                continue
            tprops = test.get("properties")
            if not isinstance(tprops, dict) or len(tprops) != 1:
                continue
            (key, cond_schema), = tprops.items()
            if not isinstance(cond_schema, dict) or "const" not in cond_schema:
                continue
            value = cond_schema["const"]
            if not isinstance(value, str):
                continue
            for prop, sub in (then.get("properties") or {}).items():
                sub_loc = (cond_loc[0], f"{cond_loc[1]}/then/properties/{_escape(prop)}")
                child = self.shape(sub_loc, sub)
                if child is None:
                    continue
                disc_key, by_value = shape.discriminated.setdefault(prop, (key, {}))
                if disc_key == key:
                    by_value.setdefault(value, child)


def _is_object(flat: _Parts, compiler: _Compiler | None = None) -> bool:
    if flat.unions and not any(k in p for _, p in flat.parts for k in _OBJECT_KEYWORDS + ("type",)):
        # A bare union: an object when some branch is one.
        assert compiler is not None
        loc, kw, branches = flat.unions[0]
        for i, branch in enumerate(branches):
            sub = _Parts()
            compiler.flatten((loc[0], f"{loc[1]}/{kw}/{i}"), branch, sub, ())
            if _is_object(sub, compiler):
                return True
        return False
    types = [p["type"] for _, p in flat.parts if "type" in p]
    for t in types:
        ts = t if isinstance(t, list) else [t]
        if "object" not in ts:
            return False
    if types:
        return True
    return any(k in p for _, p in flat.parts for k in _OBJECT_KEYWORDS)


def _items_of(compiler: _Compiler, loc: tuple[str, str], node: Any) -> tuple[tuple[str, str], Any] | None:
    """The `items` schema of an array property, after following plain references."""
    loc, node, _ = compiler.follow(loc, node)
    if not isinstance(node, dict) or not isinstance(node.get("items"), dict):
        return None
    t = node.get("type")
    if t is not None and "array" not in (t if isinstance(t, list) else [t]):
        return None
    return (loc[0], f"{loc[1]}/items"), node["items"]


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _pointer_of(where: str) -> str:
    return where.split("#", 1)[1]


# --- debugging -----------------------------------------------------------------


def describe(shape: ObjectShape, indent: int = 0, _seen: frozenset[int] = frozenset()) -> str:
    """A readable, indented rendering of ``shape`` and everything below it (cycles shown once)."""
    pad = "  " * indent
    state = "open" if shape.open else ("closed, hatched" if shape.hatched else "closed, no hatch")
    lines = [f"{pad}{shape.ref} ({state})"]
    if len(shape.via) > 1:
        lines.append(f"{pad}  via: {' -> '.join(shape.via)}")
    if id(shape) in _seen:
        lines[0] += " [cycle, see above]"
        return "\n".join(lines)
    seen = _seen | {id(shape)}
    keys = ", ".join(k + ("*" if k in shape.required else "") for k in shape.declared)
    lines.append(f"{pad}  keys: {keys or '(none)'}")
    missing = sorted(shape.required - set(shape.declared))
    if missing:
        lines.append(f"{pad}  required but undeclared: {', '.join(missing)}")
    other = [p for p in shape.patterns if p != HATCH_PATTERN]
    if other:
        lines.append(f"{pad}  other patterns: {', '.join(other)}")
    if shape.unprojectable:
        lines.append(f"{pad}  unprojectable: {shape.unprojectable}")
    for prop, child in shape.nested.items():
        lines.append(f"{pad}  .{prop}:")
        lines.append(describe(child, indent + 2, seen))
    for prop, child in shape.items.items():
        lines.append(f"{pad}  .{prop}[]:")
        lines.append(describe(child, indent + 2, seen))
    for i, option in enumerate(shape.union):
        lines.append(f"{pad}  {shape.union_kind}[{i}]:")
        lines.append(describe(option, indent + 2, seen))
    for prop, (key, by_value) in shape.discriminated.items():
        for value, child in by_value.items():
            lines.append(f"{pad}  .{prop} when {key} == {value!r}:")
            lines.append(describe(child, indent + 2, seen))
    return "\n".join(lines)


__all__ = ["HATCH_PATTERN", "ObjectShape", "PayloadSchemaError", "compile_payload_schemas", "describe"]


# The spelling a configured carrier must have: a hatch prefix and a name of letters, digits, '-' and '.' segments.
CARRIER_GRAMMAR = (r"^(openwop-[a-z0-9]+(-[a-z0-9]+)*|x-[a-z0-9]+(-[a-z0-9]+)*"
                   r"|vendor\.[a-z][a-z0-9]*(-[a-z0-9]+)*(\.[a-z0-9]+(-[a-z0-9]+)*)*)$")


class CarrierError(SeatException, ValueError):
    """A configured carrier the hatch or the org registry does not admit."""


def check_carrier(carrier: str, vendor_orgs=None) -> str:
    """``carrier`` if it is a key the hatch admits and, for ``vendor.<org>``, ``<org>`` is registered in
    declaration.json (``vendor_orgs``; None skips that check, for a config read without artifacts)."""
    import re

    if not isinstance(carrier, str) or not re.fullmatch(CARRIER_GRAMMAR, carrier):
        raise CarrierError(f"payload carrier {carrier!r}: expected a key the hatch {HATCH_PATTERN} admits, "
                           "spelled x-<name>, openwop-<name> or vendor.<org>[.<name>] (lower case, digits, '-')")
    if carrier.startswith("vendor.") and vendor_orgs is not None:
        org = carrier.split(".")[1]
        if org not in vendor_orgs:
            raise CarrierError(f"payload carrier {carrier!r}: org {org!r} is not registered in declaration.json "
                               f"(registered: {', '.join(sorted(vendor_orgs))})")
    return carrier
