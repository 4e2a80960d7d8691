"""``openwop-seat explain``: how the seat would handle one SQL string, without a database.

It runs the classifier ``serve`` runs (:class:`proxy.readpath.classify.Classifier`, built
from the same ``[host]`` configuration) and prints, per statement, whether it
passes untouched, is rewritten to read the seat's translated relation (and the
text sent instead), or is refused (the kind, the reason and the error the
client gets).

What it cannot know without the database (``serve`` learns these at start):

* results of views over the events table pass the classifier and are refused
  only when their rows arrive (``result_untranslatable``, ``OW007``);
* the events table's own column order (``serve`` reads it; here the reference
  host's columns are assumed for a RETURNING list);
* a session on a database other than ``host.dsn``'s is relayed untranslated
  whatever its major; here the session is assumed to be on the host database;
* whether the net holds dynamic SQL (ADR 0019): the classifier here refuses it, as ``serve`` does for a role the
  net does not hold or while the database holds code that reads past the net; when a statement is refused only
  for that, a second line says that a session of a role the net holds, on a database holding no such code,
  sends it.
"""

from __future__ import annotations

import sys
from typing import Callable

from proxy.config import Config
from proxy.errors import ERRORS
from proxy.readpath.classify import (
    LOCK_VIEW,
    PASS,
    REFUSE,
    RUN_FUNCTION,
    RUN_LIVE_FUNCTION,
    TRANSLATE,
    VIEW,
    Classifier,
)

_WHAT = {
    1: "major 1: for era-3 rows, type is mapped to its v1 name; payloads pass as stored",
    2: "major 2: for era-2 rows, type is mapped to its v2 name and a payload in the result is projected onto "
       "its v2 definition; era-3 rows pass as stored",
}


def parse_major(text: str) -> int | str:
    """``1``, ``2`` or ``raw`` (argparse type)."""
    import argparse

    if text == "raw":
        return "raw"
    if text in ("1", "2"):
        return int(text)
    raise argparse.ArgumentTypeError(f"expected 1, 2 or raw, got {text!r}")


def explain(config: Config, sql: str, major: int | str | None = None, out: Callable[[str], None] = print) -> int:
    """Print the plan of ``sql`` for a session of ``major`` (default: the config's default_major); the exit status:
    0 when the seat would send it (passed or rewritten), 1 when it would refuse it."""
    source = "--major" if major is not None else "proxy.default_major"
    major = config.default_major if major is None else major
    out(f"major: {major} ({source})")
    if major == "raw":
        out("passthrough: a raw session is relayed as is; the seat does not classify its statements")
        return 0
    classifier = _classifier(config, major)
    plan = classifier.classify(sql)
    refusal = ERRORS["statement_untranslatable"]
    if not plan.statements:
        out("passthrough: no statement")
        return 0
    for i, st in enumerate(plan.statements, 1):
        head = f"statement {i}: " if len(plan.statements) > 1 else ""
        if st.action == PASS and classifier.mentions_events(st.sql) and \
                len(st.sql.encode("utf-8", "surrogateescape")) > classifier.max_statement_bytes:
            out(f"{head}passthrough: larger than proxy.max_statement_bytes, sent as written without analysis; what it "
                f"reads of the events table's stored rows meets the net (OW008)")
        elif st.action == PASS:
            out(f"{head}passthrough: sent as written (it reads nothing of the events table)")
        elif st.action == TRANSLATE:
            per_run = f"openwop_seat.{RUN_FUNCTION}(" in st.sql
            page = f"openwop_seat.{RUN_LIVE_FUNCTION}(" in st.sql
            out(f"{head}translated: the events table is read as openwop_seat.{VIEW[major]}"
                + (f" (through {RUN_FUNCTION}, one run's rows of it: the v2 store's or the live translation's)"
                   if per_run else "")
                + (" (a run's page: the v2 store's rows and the live translation's above the run's mark, each read "
                   "in order up to the page's limit)" if page else ""))
            if f"openwop_seat.{LOCK_VIEW[major]} " in st.sql:
                out(f"  row lock: the locked rows are read through openwop_seat.{LOCK_VIEW[major]}, the same "
                    f"translation, which PostgreSQL locks through to the stored rows")
            out(f"  {_WHAT[major]}")
            out(f"  sent: {st.sql}")
        else:
            out(f"{head}refused ({st.kind}): {st.detail}")
            out(f"  the client gets SQLSTATE {refusal.sqlstate} ({refusal.code}, HTTP {refusal.http_status}); "
                f"the statement is not run")
    assert all(st.action in (PASS, TRANSLATE, REFUSE) for st in plan.statements)
    if plan.refused is not None and _held_by_the_net(config, major).classify(sql).refused is None:
        out("  with the net (ADR 0019): a session of a role the net holds sends it while the database holds no code "
            "that reads past the net (no SECURITY DEFINER function or view over the events table owned by a "
            "superuser, a BYPASSRLS role or the owner of openwop_seat, no untrusted language, no dblink or "
            "postgres_fdw); what it reads of the stored rows then meets the net (OW008)")
    if plan.refused is not None:
        if len(plan.statements) > 1:
            out("sent together in one Query message, they fail as if the refused statement had failed in "
                "PostgreSQL: the statements after it do not run and the implicit transaction rolls back")
        return 1
    if plan.changed and len(plan.statements) > 1:
        out(f"sent (whole text): {plan.text}")
    return 0


class _NothingPastTheNet(frozenset):
    """What ``serve``'s function watch would give the classifier for a database holding no risky function and no
    code past the net (``proxy.serve.context.RiskyFunctions``, empty)."""

    past_net = False
    arities: dict = {}
    held_roles = frozenset()
    relations = ()


def _classifier(config: Config, major: int) -> Classifier:
    """The classifier ``serve`` builds for ``major``, as a seat whose database has the v2 store of this [host]
    configuration (migrate installs it; ADR 0015)."""
    store = config.host.store and config.host.era_column is None
    return Classifier(config.host, major, run_function=store, page_function=store,
                      max_statement_bytes=config.max_statement_bytes)


def _held_by_the_net(config: Config, major: int) -> Classifier:
    """The classifier ``serve`` gives a session of a role the net holds on a database with nothing past the net."""
    classifier = _classifier(config, major)
    classifier.set_functions(_NothingPastTheNet())
    return classifier


def cmd_explain(config: Config, sql: str, major: int | str | None) -> int:
    """``openwop-seat explain``: 0 (sent), 1 (refused), 2 (bad input: an empty statement)."""
    if not sql.strip():
        print("openwop-seat explain: the SQL is empty", file=sys.stderr)
        return 2
    return explain(config, sql, major)
