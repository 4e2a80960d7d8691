"""Relations past the net (issue 23), without a database: which relations the watch's catalog rows make a hole
(``proxy.serve.context.past_net_relations``), what that does to the watch's answer (``database_functions``), and the
classifier's refusal of a statement that names one."""

from __future__ import annotations

import asyncio

import pytest

from proxy.config import HostConfig
from proxy.readpath.classify import PASS, REFUSE, TRANSLATE, Classifier
from proxy.serve import context
from proxy.serve.context import PastNetRelation, RiskyFunctions, past_net_relations, risky_functions


def row(oid, via, name, kind="v", past=False, invoker=False, schema="public", owner=None):
    return {"oid": oid, "via": via, "schema": schema, "name": name, "kind": kind,
            "owner": owner or ("postgres" if past else "host_user"), "owner_past_net": past, "invoker": invoker}


def names(rows) -> set[str]:
    return {r.name for r in past_net_relations(rows)}


def test_a_definer_view_or_a_materialized_view_owned_past_the_net_is_a_hole():
    rows = [row(1, 0, "su_view", past=True), row(2, 0, "su_invoker", past=True, invoker=True),
            row(3, 0, "host_view"), row(4, 0, "host_invoker", invoker=True),
            row(5, 0, "bypass_mv", kind="m", past=True, owner="bypasser"), row(6, 0, "host_mv", kind="m")]
    assert names(rows) == {"su_view", "bypass_mv"}
    found = {r.name: r for r in past_net_relations(rows)}
    assert found["bypass_mv"].owner == "bypasser" and "materialized view" in found["bypass_mv"].why
    assert "postgres" in found["su_view"].why and found["su_view"].kind == "v"


def test_every_relation_over_a_hole_is_one_whoever_owns_it_in_any_order():
    """The view past the net runs as its owner wherever it is read from: a host view over it, an invoker view over
    that, a materialized view of it; a view reading a hole and the table too. Rows in any order."""
    rows = [row(1, 0, "su_view", past=True), row(2, 1, "host_over_su"), row(3, 2, "invoker_over_host", invoker=True),
            row(4, 0, "host_view"), row(5, 4, "host_over_host"), row(6, 0, "both"), row(6, 1, "both"),
            row(7, 3, "mv_over_chain", kind="m")]
    for ordered in (rows, list(reversed(rows))):
        assert names(ordered) == {"su_view", "host_over_su", "invoker_over_host", "both", "mv_over_chain"}
    chain = {r.name: r for r in past_net_relations(rows)}
    assert chain["invoker_over_host"].owner == "postgres"
    assert "public.host_over_su" in chain["invoker_over_host"].why


def test_nothing_past_the_net_when_no_owner_reads_past_it():
    assert past_net_relations([row(1, 0, "a"), row(2, 1, "b", invoker=True), row(3, 0, "m", kind="m")]) == frozenset()
    assert past_net_relations([]) == frozenset()


def test_the_qualified_name_is_quoted_part_by_part():
    assert PastNetRelation('we"ird', "a.b", "v", "o", "w").qualified() == '"we""ird"."a.b"'


class FakeConn:
    """Answers the watch's catalog queries with fixed rows."""

    def __init__(self, candidates, past_net=False, functions=()):
        self.candidates, self.past_net, self.functions = candidates, past_net, list(functions)

    async def fetch(self, query, *args):
        if query is context.PAST_NET_CANDIDATES:
            assert args == ('"events"',)
            return self.candidates
        if query is context.HELD_ROLES:
            return [("host_user",)]
        if query is context.DATABASE_FUNCTIONS:
            return self.functions
        return []  # ARBITERS

    async def fetchval(self, query, *args):
        assert query is context.PAST_NET
        return self.past_net


def test_the_watch_counts_a_relation_past_the_net_as_code_the_net_cannot_hold():
    """ADR 0019's PAST_NET becomes true while one exists (dynamic SQL is refused again), for the strict set too, and
    a function whose body names it is risky."""
    fns = [{"name": "reads_view", "language": "sql", "body": "SELECT type FROM public.SU_VIEW", "definer": False},
           {"name": "dyn", "language": "plpgsql", "body": "BEGIN EXECUTE 'select 1'; END", "definer": False}]
    held = asyncio.run(context.database_functions(FakeConn([row(1, 0, "su_view", past=True)], functions=fns),
                                                  "events"))
    assert held.past_net and {r.name for r in held.relations} == {"su_view"}
    assert held == {"reads_view", "dyn"} and {r.name for r in held.strict.relations} == {"su_view"}
    clear = asyncio.run(context.database_functions(FakeConn([row(1, 0, "host_view")], functions=fns), "events"))
    assert not clear.past_net and not clear.relations and clear == set()
    assert asyncio.run(context.database_functions(FakeConn([], past_net=True), "events")).past_net


def test_risky_functions_count_a_body_naming_a_relation_past_the_net():
    rel = PastNetRelation("public", "su_view", "v", "postgres", "…")
    rows = [{"name": "f", "language": "sql", "body": "SELECT * FROM su_view", "nargs": 1, "ndefaults": 0},
            {"name": "g", "language": "sql", "body": "SELECT f(1)"},
            {"name": "h", "language": "sql", "body": "SELECT 1"}]
    assert risky_functions(rows, "events") == set()
    found = risky_functions(rows, "events", relations={rel})
    assert found == {"f", "g"} and found.arities["f"] == ((1, 1),)


SU = PastNetRelation("public", "su_view", "v", "postgres", "a view owned by postgres, …")
MV = PastNetRelation("reports", "bp_mv", "m", "bypasser", "a materialized view owned by bypasser, …")


def watched(major: int = 2, past_net: bool = False, relations=(SU, MV), strict: bool = False) -> Classifier:
    c = Classifier(HostConfig(), major)
    if strict:
        c = c.strict_twin()
    c.set_functions(RiskyFunctions((), {}, past_net, {"host_user"}, relations))
    return c


REFUSED = [
    "SELECT type || '' FROM su_view WHERE run_id = $1",
    "SELECT to_jsonb(v) FROM public.su_view v",
    "SELECT string_agg(type, ',') FROM SU_VIEW",
    'SELECT type FROM "su_view"',
    "SELECT r.run_id, v.type FROM runs r JOIN su_view v USING (run_id)",
    "WITH x AS (SELECT type FROM su_view) SELECT type || '' FROM x",
    "SELECT (SELECT max(type) FROM su_view)",
    "SELECT * FROM runs WHERE EXISTS (SELECT 1 FROM su_view s WHERE s.run_id = runs.run_id AND s.type LIKE 'a%')",
    "SELECT e.type, v.type FROM events e JOIN su_view v USING (run_id)",
    "SELECT type FROM bp_mv", "SELECT type FROM reports.bp_mv", "TABLE su_view", "COPY su_view TO STDOUT",
    "COPY (SELECT type FROM su_view) TO STDOUT", "CREATE TEMP VIEW mine AS SELECT * FROM su_view",
    "REFRESH MATERIALIZED VIEW reports.bp_mv", "SELECT 1; SELECT type FROM su_view",
    "DO $$ BEGIN RAISE EXCEPTION '%', (SELECT string_agg(type, ',') FROM su_view); END $$",
    "CREATE FUNCTION pg_temp.f() RETURNS text LANGUAGE sql AS $f$ SELECT max(type) FROM su_view $f$",
]


@pytest.mark.parametrize("major", [2, 1])
@pytest.mark.parametrize("strict", [False, True], ids=["held", "strict"])
@pytest.mark.parametrize("sql", REFUSED)
def test_a_statement_naming_a_relation_past_the_net_is_refused(sql, major, strict):
    plan = watched(major, strict=strict).classify(sql)
    assert plan.refused is not None and plan.refused.action == REFUSE, plan
    assert plan.refused.kind == "relation past the net", plan.refused
    detail = plan.refused.detail
    assert ("public.su_view" in detail or "reports.bp_mv" in detail) and "past" in detail, detail
    if "su_view" in detail:
        assert 'ALTER VIEW "public"."su_view" SET (security_invoker = true)' in detail, detail


@pytest.mark.parametrize("sql, action", [
    ("SELECT type FROM other.su_view", PASS),  # another schema's relation of the same name
    ("SELECT type FROM su_view_other", PASS),
    ("SELECT type FROM public.bp_mv", PASS),  # bp_mv is in reports
    ("SELECT 'su_view' AS name", PASS),  # a word in a literal is parsed, not refused
    ("SELECT type FROM events", TRANSLATE),
])
def test_other_names_are_not_refused(sql, action):
    plan = watched().classify(sql)
    assert plan.refused is None and (plan.statements[0].action == action), plan


def test_dynamic_sql_is_refused_while_a_relation_past_the_net_exists():
    """The watch sets past_net with the relations (database_functions): a DO block building the name by EXECUTE is
    refused; without any, it is sent (the net holds it)."""
    do = "DO $$ DECLARE t text; BEGIN EXECUTE 'SELECT max(type) FROM su_' || 'view' INTO t; END $$"
    assert watched(past_net=True).classify(do).refused.kind == "DO block"
    assert watched(past_net=False, relations=()).classify(do).refused is None


def test_the_plans_made_before_the_watch_saw_it_are_dropped():
    c = Classifier(HostConfig(), 2)
    c.set_functions(RiskyFunctions((), {}, False, {"host_user"}))
    sql = "SELECT type || '' FROM su_view"
    assert c.classify(sql).refused is None
    generation = c.generation
    c.set_functions(RiskyFunctions((), {}, True, {"host_user"}, {SU}))
    assert c.generation > generation and c.classify(sql).refused is not None
    c.set_functions(RiskyFunctions((), {}, False, {"host_user"}))  # made security_invoker: the net holds it
    assert c.classify(sql).refused is None


def test_an_oversized_statement_naming_a_relation_past_the_net_is_refused():
    c = Classifier(HostConfig(), 2, max_statement_bytes=200)
    c.set_functions(RiskyFunctions((), {}, False, {"host_user"}, {SU}))
    sql = "SELECT type || '' FROM su_view JOIN events USING (run_id) WHERE run_id IN (" + ",".join(
        f"'r{i}'" for i in range(100)) + ")"
    plan = c.classify(sql)
    assert plan.refused is not None and "past row-level security" in plan.refused.detail, plan.refused
