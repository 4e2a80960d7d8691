"""Property tests of the payload projection (issue #4), on the real database function the seat uses.

Payloads are generated per v2 definition from the compiled shapes: declared keys (with nested objects that
mix declared, hatch-pattern and unknown keys), hatch keys, unknown keys, nested ``type`` values. For each:

* deterministic: projecting the same stored row twice, in two sessions, gives the same bytes;
* idempotent: a projected payload, stored again as an era-2 row of the same type, projects to itself;
* no silent drop: every input key is in the output (as declared, hatch key, or inside ``x-v1``), moved by
  one of the named transformations, or the read fails with payload_unprojectable naming it.

The function is called directly (``openwop_seat.read_v2p``, exactly the expression the classifier adds);
the last test drives a sample through the seat itself and checks it reads the same bytes.
"""

from __future__ import annotations

import json

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.artifacts import load_artifacts
from test_projection import TextJsonb

ARTIFACTS = load_artifacts()
SHAPES = ARTIFACTS.payload_shapes
V2_TO_V1 = {v2: v1 for v1, v2 in ARTIFACTS.v1_to_v2.items()}
TYPES = sorted(t for t in SHAPES if t in V2_TO_V1)
RENAMED = sorted(ARTIFACTS.renamed)
PROPERTY = settings(max_examples=300, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

SQL = ("SELECT openwop_seat.read_v2p(2::smallint, %(t)s, %(p)s::jsonb, 'prop-run', 7, 'ev-prop', %(node)s, "
       "%(tenant)s)")

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=8),
                    st.sampled_from([0.5, -1.25, 1e-3]))  # floats that read back as Python wrote them
unknown_keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=6).map(lambda s: "zz" + s)
hatch_keys = st.sampled_from(["x-note", "vendor.acme.flag", "openwop-trace", "x-v1"])


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
            out[key] = draw(st.one_of(scalars, st.fixed_dictionaries({"type": st.sampled_from(RENAMED)})))
    return out


@st.composite
def rows(draw):
    v2 = draw(st.sampled_from(TYPES))
    payload = draw(objects(SHAPES[v2]))
    if v2 == "run.started" and draw(st.booleans()):
        payload["engineVersion"] = draw(st.sampled_from(["7", "0", "12", "v2", "07"]))
    if v2 == "run.started" and draw(st.booleans()):
        payload["owner"] = {"tenant": "acme", **({"principal": "p-1"} if draw(st.booleans()) else {})}
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


def dropped(inp: dict, out: dict, path: str = "") -> list[str]:
    """Input keys found nowhere in ``out``: not under their own name, not in out["x-v1"]."""
    lost = []
    box = out.get("x-v1") if isinstance(out.get("x-v1"), dict) and "x-v1" not in inp else {}
    for key, value in inp.items():
        here = out[key] if key in out else box.get(key, _MISSING)
        if here is _MISSING:
            lost.append(path + key)
        elif isinstance(value, dict) and isinstance(here, dict):
            lost += dropped(value, here, f"{path}{key}.")
        elif here != value and here != map_type(value) and not (key == "engineVersion" and str(here) == value):
            lost.append(path + key)
    return lost


_MISSING = object()


def moved_by_named_rules(v2: str, inp: dict, out: dict) -> dict:
    """``inp`` as the named transformations rearranged it, so ``dropped`` can compare like with like."""
    inp = dict(inp)
    if v2 == "run.started" and isinstance(inp.get("owner"), dict) and "principal" in inp["owner"]:
        owner = dict(inp["owner"])
        assert out["owner"]["subject"]["subjectId"] == owner.pop("principal")
        inp["owner"] = owner
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
