"""The net's generated SQL and the check of its state (ADR 0009); the database side is in tests/integration."""

from __future__ import annotations

from proxy.db import net_sql


def state(rls=True, force=True, names=net_sql.POLICIES, extra=()):
    return {"rls": rls, "force": force,
            "policies": [[n, "r", True, ["public"], "true", None] for n in list(names) + list(extra)]}


def test_the_policies_let_the_seats_owner_read_and_call_net_read_once_per_statement():
    sql = net_sql.policies_sql('"public"."events"', "openwop_seat_owner")
    assert 'FOR SELECT TO "openwop_seat_owner" USING (true)' in sql
    assert "(SELECT openwop_seat.net_read())" in sql  # an InitPlan: once per statement
    assert "USING ((SELECT openwop_seat.net_read()))" in sql
    assert "ctid" not in sql  # ADR 0019: no arm for the new row of an INSERT … RETURNING: it meets the net too
    assert "FORCE ROW LEVEL SECURITY" in sql and "ENABLE ROW LEVEL SECURITY" in sql
    for cmd in ("INSERT", "UPDATE", "DELETE"):
        assert f"FOR {cmd} TO PUBLIC" in sql


def test_the_keys_view_has_neither_type_nor_payload():
    sql = net_sql.keys_view_sql('"public"."events"', ["event_id", "run_id", "sequence", "type", "payload"],
                                ("type", "payload"))
    assert 'SELECT "event_id", "run_id", "sequence"\nFROM "public"."events"' in sql


def test_net_problems_names_what_is_off():
    good = state()
    recorded = net_sql.fingerprint(good)
    assert net_sql.net_problems(good, recorded) == []
    assert net_sql.net_problems(None, recorded) == []  # no events table: nothing to hold
    assert "disabled" in net_sql.net_problems(state(rls=False), recorded)[0]
    assert "not forced" in net_sql.net_problems(state(force=False), recorded)[0]
    assert "openwop_seat_net are missing" in net_sql.net_problems(
        state(names=[n for n in net_sql.POLICIES if n != "openwop_seat_net"]), recorded)[0]
    opened = net_sql.net_problems(state(extra=["wide_open"]), recorded)
    assert opened and "wide_open" in opened[0] and "opens the net" in opened[0]
