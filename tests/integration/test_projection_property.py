"""Property tests of the payload projection (issue #4), on the real database function the seat uses.

Payloads are generated per v2 definition from the compiled shapes: declared keys (with nested objects that
mix declared, hatch-pattern and unknown keys), hatch keys, unknown keys, nested ``type`` values. For each:

* deterministic: projecting the same stored row twice, in two sessions, gives the same bytes;
* idempotent: a projected payload, stored again as an era-2 row of the same type, projects to itself;
* no silent drop: every input key is in the output (as declared, hatch key, or inside the carrier ``x-v1``,
  or ``x-v1.seat`` when the host wrote ``x-v1``), moved by one of the named transformations, or the read
  fails with payload_unprojectable naming it;
* hatch values are opaque (issue 17): a hatch key's value, with ``type`` values nested in it, is read
  byte-for-byte as stored; owner blocks come in every v1 shape (principal, principalKind, null, a null
  subject, a subject beside principal, keyClass off the saml/scim lanes).

The function is called directly (``openwop_seat.read_v2p``, exactly the expression the classifier adds);
the last test drives a sample through the seat itself and checks it reads the same bytes.
"""

from __future__ import annotations

import json
import re

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_projection import TextJsonb

from proxy.artifacts.load import load_artifacts
from proxy.db.projection_sql import INTERRUPT_KINDS, interrupt_kind_types

ARTIFACTS = load_artifacts()
SHAPES = ARTIFACTS.payload_shapes
V2_TO_V1 = {v2: v1 for v1, v2 in ARTIFACTS.v1_to_v2.items()}
TYPES = sorted(t for t in SHAPES if t in V2_TO_V1)
RENAMED = sorted(ARTIFACTS.renamed)
PROPERTY = settings(max_examples=300, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

SQL = ("SELECT openwop_seat.read_v2p(2::smallint, %(t)s, %(p)s::jsonb, 'prop-run', 7, 'ev-prop', %(node)s, "
       "%(tenant)s)")

# jsonb holds no NUL and no lone surrogate (not UTF-8 encodable)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8),
                    st.sampled_from([0.5, -1.25, 1e-3]))  # floats that read back as Python wrote them
unknown_keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=6).map(lambda s: "zz" + s)
hatch_keys = st.sampled_from(["x-note", "vendor.acme.flag", "openwop-trace", "x-v1", "x-v1.seat"])
HATCH = re.compile(r"^(openwop-|x-|vendor\.)")
KIND_TYPES = set(interrupt_kind_types(SHAPES))
KINDS = st.sampled_from(list(INTERRUPT_KINDS) + ["timer", "walkthrough-step", "conversation"])
SUBJ = {"issuer": "https://idp.example", "subjectId": "p-1", "tenant": "acme", "lane": "oidc", "kind": "user"}
OWNERS = st.sampled_from([
    {"tenant": "acme"}, {"tenant": "acme", "principal": "p-1"},
    {"tenant": "acme", "principal": "p-1", "principalKind": "user"},
    {"tenant": "acme", "principal": "p-1", "principalKind": "agent"},
    {"tenant": "acme", "principal": "p-1", "principalKind": "service"}, {"tenant": "acme", "principalKind": "user"},
    None, {"tenant": "acme", "subject": None}, {"principal": "p-1"}, {"tenant": "other", "principal": "p-1"},
    {"tenant": "acme", "principal": "p-1", "principalKind": "user", "subject": SUBJ},
    {"tenant": "acme", "principal": "p-2", "principalKind": "agent", "subject": SUBJ},
    {"tenant": "acme", "subject": dict(SUBJ, keyClass="opaque-idp")},
    {"tenant": "acme", "subject": dict(SUBJ, lane="saml", keyClass="opaque-idp")}])
nested_types = st.one_of(st.fixed_dictionaries({"type": st.sampled_from(RENAMED)}),
                         st.fixed_dictionaries({"inner": st.lists(st.fixed_dictionaries(
                             {"type": st.sampled_from(RENAMED)}), min_size=1, max_size=2)}))


@st.composite
def objects(draw, shape, depth=0):
    """An object for ``shape``: some of its declared keys, maybe hatch keys, maybe unknown keys."""
    out = {}
    declared = list(shape.declared)
    for key in draw(st.lists(st.sampled_from(declared), unique=True, max_size=len(declared))) if declared else []:
        nested = shape.nested.get(key)
        if nested is not None and depth < 2 and draw(st.booleans()):
            out[key] = draw(objects(nested, depth + 1))
        elif key == "type" or draw(st.integers(0, 9)) == 0:
            out[key] = draw(st.sampled_from(RENAMED + ["node.started"]))
        else:
            out[key] = draw(scalars)
    for key in draw(st.lists(st.one_of(unknown_keys, hatch_keys), unique=True, max_size=2)):
        if key not in out:
            out[key] = draw(st.one_of(scalars, nested_types))
    return out


@st.composite
def rows(draw, types=TYPES):
    v2 = draw(st.sampled_from(types))
    payload = draw(objects(SHAPES[v2]))
    if v2 == "run.started" and draw(st.booleans()):
        payload["engineVersion"] = draw(st.sampled_from(["7", "0", "12", "v2", "07"]))
    if v2 == "run.started" and draw(st.booleans()):
        payload["owner"] = draw(OWNERS)
    if v2 in KIND_TYPES and draw(st.booleans()):
        payload["kind"] = draw(KINDS)
    return V2_TO_V1[v2], v2, payload, draw(st.sampled_from([None, "n-1"])), draw(st.sampled_from([None, "acme"]))


def project(conn, t, payload, node, tenant):
    """('ok', projected payload text or None when unchanged) or ('error', details)."""
    try:
        with conn.transaction():
            hidden = conn.execute(SQL, {"t": t, "p": json.dumps(payload), "node": node, "tenant": tenant}).fetchone()[0]
    except psycopg.Error as e:
        assert e.sqlstate == "OW002", e
        return "error", json.loads(e.diag.message_detail)["details"]
    assert hidden[0] == "2"
    text = hidden[1:].split("\x1e")[0]
    return "ok", text or None


def map_type(value):
    return ARTIFACTS.v1_to_v2.get(value, value) if isinstance(value, str) else value


def carrier_box(inp: dict, out: dict) -> dict:
    """What the projection carried at this level: under x-v1, or x-v1.seat when the host wrote x-v1."""
    for carrier in ("x-v1", "x-v1.seat"):
        if carrier not in inp:
            return out.get(carrier) if isinstance(out.get(carrier), dict) else {}
    return {}


def dropped(inp: dict, out: dict, path: str = "") -> list[str]:
    """Input keys found nowhere in ``out``: not under their own name, not in the carrier; and hatch keys
    whose value was changed (interpreted)."""
    lost = []
    box = carrier_box(inp, out)
    for key, value in inp.items():
        here = out[key] if key in out else box.get(key, _MISSING)
        if here is _MISSING:
            lost.append(path + key)
        elif HATCH.match(key) and key in out:
            if here != value:
                lost.append(path + key + " (a hatch value was changed)")
        elif isinstance(value, dict) and isinstance(here, dict):
            lost += dropped(value, here, f"{path}{key}.")
        elif not equivalent({key: value}, {key: here}) and not (key == "engineVersion" and str(here) == value):
            lost.append(path + key)
    return lost


def equivalent(value, here) -> bool:
    """``here`` is ``value`` with renamed v1 types mapped under non-hatch ``type`` keys, at any depth."""
    if isinstance(value, dict) and isinstance(here, dict):
        return value.keys() == here.keys() and all(
            here[k] == v if HATCH.match(k) else
            (here[k] in (v, map_type(v)) if k == "type" else equivalent(v, here[k])) for k, v in value.items())
    if isinstance(value, list) and isinstance(here, list):
        return len(value) == len(here) and all(equivalent(a, b) for a, b in zip(value, here))
    return here == value


_MISSING = object()


def moved_by_named_rules(v2: str, inp: dict, out: dict) -> dict:
    """``inp`` as the named transformations rearranged it, so ``dropped`` can compare like with like.
    Each moved value is checked to be where the rule puts it (in the Subject, or carried)."""
    inp = dict(inp)
    box = carrier_box(inp, out)
    if v2 == "run.started" and "owner" in inp and inp["owner"] is None and isinstance(out.get("owner"), dict):
        assert out["owner"]["subject"]["issuer"] == "urn:openwop:legacy"
        inp.pop("owner")  # a null owner is stamped
    elif v2 == "run.started" and isinstance(inp.get("owner"), dict):
        owner = dict(inp["owner"])
        subject = out["owner"].get("subject", {})
        carried = box.get("owner", {})
        if "subject" in owner and owner["subject"] is None and isinstance(subject, dict):
            assert subject["issuer"] == "urn:openwop:legacy"
            owner.pop("subject")
        for key, seat in (("principal", "subjectId"), ("principalKind", "kind")):
            if key in owner:
                value = owner.pop(key)
                assert subject.get(seat) == value or carried.get(key) == value, (key, out)
        if isinstance(owner.get("subject"), dict) and "keyClass" in owner["subject"] and "keyClass" not in subject:
            owner["subject"] = dict(owner["subject"])
            assert carried["subject"]["keyClass"] == owner["subject"].pop("keyClass")
        inp["owner"] = owner
    if v2 in KIND_TYPES and isinstance(inp.get("kind"), str) and inp["kind"] not in INTERRUPT_KINDS:
        assert out["kind"] == "custom" and box["kind"] == inp.pop("kind"), out
    if v2 == "approval.requested" and "data" not in inp and "kind" not in inp:
        data = out.get("data", {})
        for key in list(inp):
            seat = {"message": "description"}.get(key, key)
            if key == "timeout":
                assert out["timeoutMs"] == inp.pop(key)
            elif seat in data and data[seat] == inp[key]:
                inp.pop(key)
    return inp


@pytest.fixture(scope="module")
def conn(pg):
    with psycopg.connect(pg.dsn(dbname="postgres"), autocommit=True) as c:
        yield c


@PROPERTY
@given(rows())
def test_projection_is_deterministic_idempotent_and_drops_nothing(conn, pg, row):
    check_row(conn, pg, row)


@settings(PROPERTY, max_examples=200)
@given(rows(types=sorted({"run.started"} | KIND_TYPES)))
def test_owner_blocks_and_interrupt_kinds_hold_the_same_properties(conn, pg, row):
    """The same properties, drawn only over run.started (owner blocks in every v1 shape) and the types
    whose kind is the interrupt enum (kinds inside and outside it)."""
    check_row(conn, pg, row)


def check_row(conn, pg, row):
    t, v2, payload, node, tenant = row
    first = project(conn, t, payload, node, tenant)
    with psycopg.connect(pg.dsn(dbname="postgres"), autocommit=True) as other:
        assert project(other, t, payload, node, tenant) == first  # same bytes in another session
    if first[0] == "error":
        details = first[1]
        assert details["type"] == v2 and details["keys"], details
        for key in details["keys"]:  # each names an input key (a path below one); approval's data is built
            assert any(key == k or key.startswith((k + ".", k + "[")) for k in payload) or (
                v2 == "approval.requested" and key.startswith("data.")), (key, payload)
        return
    text = first[1]
    out = json.loads(text) if text is not None else payload
    # idempotent: the projected payload, stored again under the same type, comes back unchanged
    assert project(conn, t, out, node, tenant) == ("ok", None), (payload, out)
    inp = moved_by_named_rules(v2, payload, out)
    assert dropped(inp, out) == [], (payload, out)


def test_a_sample_reads_the_same_through_the_seat(pg, seat, conn):
    """The seat splices exactly what the function returns (the property above holds for what clients read)."""
    samples = [("variable.changed", {"name": "a", "value": 1, "x-note": 2}),
               ("run.started", {"workflowId": "w", "engineVersion": "3"}),
               ("agent.toolCalled", {"agentId": "a", "toolName": "t", "callId": "c", "zzextra": [1]})]
    for i, (t, payload) in enumerate(samples):
        rid = f"prop-seat-{i}"
        pg.psql(f"DELETE FROM events WHERE run_id = '{rid}'")
        with psycopg.connect(pg.dsn(dbname="postgres"), autocommit=True) as c:
            c.execute("INSERT INTO events (event_id, run_id, sequence, type, payload, timestamp) "
                      "VALUES (%s, %s, 7, %s, %s::jsonb, now())", (f"ev-{rid}", rid, t, json.dumps(payload)))
        want = project(conn, t, payload, None, None)  # no runs row: no tenant; no node_id
        assert want[0] == "ok", want
        with psycopg.connect(seat.dsn(), autocommit=True) as c:
            c.adapters.register_loader("jsonb", TextJsonb)
            got = c.execute("SELECT payload FROM events WHERE run_id = %s", (rid,)).fetchone()[0]
        stored = pg.psql(f"SELECT payload::text FROM events WHERE run_id = '{rid}'").strip()
        assert got == (want[1] if want[1] is not None else stored), (t, payload)
        assert want[1] is not None, (t, want)  # every sample is one the projection changes
