"""The SQL classifier: a pure function from statement text (and the reader's major) to a plan.

A translated session never reads the host's events table itself: every read
reference to it, at any query level (CTEs, subqueries, LATERAL, set
operations, joins, ``EXPLAIN``, ``DECLARE … CURSOR``, SQL ``PREPARE``,
``CREATE TABLE AS``, ``COPY … TO``), is replaced by the seat's translated
relation for the session's major (``openwop_seat.events_m2`` / ``events_m1``,
:mod:`proxy.db.relations`), under the name the statement used for it.  The
statement then works on translated values whatever it does with them, so there
is nothing to track column by column and nothing to do per row in the seat.

Writes stay on the base table (the writer rule's triggers guard them).  A
``RETURNING`` list of a write to the events table is evaluated over the written
rows as the reader rule returns them: the write becomes a data-modifying CTE
and the list is selected over its rows with ``type_m2``/``payload_m2`` (``_m1``) applied;
an ``INSERT`` writes through ``openwop_seat.events_insert_m2`` (``_m1``), which returns
them translated (ADR 0019: the net refuses the new row of any other ``INSERT …
RETURNING`` in a translated session).

A row lock that applies to the events table reads the lockable translation
(``events_m2_lock``/``_m1_lock``, ADR 0017); a CTE named like the table is the
CTE where PostgreSQL's scoping says so.

What cannot be substituted exactly is refused (``statement_untranslatable``,
the plan's ``kind`` and ``detail`` say why): objects that would keep a read of
the events table for later (views, rules, SQL-body functions, policies),
``MERGE``, writes whose predicates or values read the stored
``type``/``payload`` of the rows they change, references to the seat's own
relations, references to views over the events table that read it past the net
(owned by a role that reads past row-level security: ``set_functions``), text
the parser rejects, and statements larger than the analysis limit whose text
could return a stored row past the net (ADR 0017: the others are sent
unparsed, and the net decides).

Plans are cached by exact text, bounded in bytes; pglast runs only on a cache
miss and only after a substring prefilter (the table's name, a Unicode-escaped
identifier, or the seat's schema).
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from typing import NamedTuple

from proxy.config import HostConfig
from proxy.errors import SeatException
from proxy.readpath import encoding
from proxy.readpath.pgnodes import walk as _walk

log = logging.getLogger("openwop_seat.classify")
CLASSIFIER_FAILED = "classifier error"  # the reason of the refusal made when the classifier raised

PASS, TRANSLATE, REFUSE = "passthrough", "translate", "refuse"
PREFILTERED = "prefiltered"  # StatementPlan.kind of a PASS the prefilter made: its text names nothing the seat reads
SEAT_SCHEMA = "openwop_seat"
VIEW = {2: "events_m2", 1: "events_m1"}
# What a level whose row lock applies to the events table reads (ADR 0017): the same translation, lockable.
LOCK_VIEW = {2: "events_m2_lock", 1: "events_m1_lock"}
KEYS_VIEW = "events_keys"  # the events table without type and payload (proxy/db/net_sql.py)
DELETE_VIEW = "events_delete"  # the same, for a DELETE that reads neither (proxy/db/net_sql.py)
RUN_FUNCTION = "events_m2_run"  # events_m2 for one run (proxy/db/store_sql.py, ADR 0015 decision 7)
# A run's page reads the union of these two arms, each cut at the page's limit (proxy/db/store_sql.py, ADR 0015)
RUN_LIVE_FUNCTION, FILLED_VIEW = "events_m2_run_live", "events_v2_filled"
ERA3_FUNCTION = "events_m2_run_era3"  # an era-3 run's rows as stored, or no row (ADR 0024)
# The written rows' type and payload as the reader rule returns them (proxy.db.relations): RETURNING reads them.
WRITTEN_FUNCTIONS = {2: ("type_m2", "payload_m2"), 1: ("type_m1", "payload_m1")}
WRITTEN = "openwop_seat_written"  # the data-modifying CTE a RETURNING write becomes
# What an INSERT … RETURNING writes through (proxy.db.relations, ADR 0019): the net refuses the new row of one on the
# table itself in a translated session; the view returns it translated, as these two columns.
INSERT_VIEW = {2: "events_insert_m2", 1: "events_insert_m1"}
TYPE_OUT, PAYLOAD_OUT = "openwop_seat_type", "openwop_seat_payload"
SYSTEM_COLUMNS = ("xmax", "xmin", "ctid", "cmin", "cmax", "tableoid")  # what a RETURNING list may name (issue 23)
SYSTEM_PREFIX = "openwop_seat_sys_"  # a system column carried from the written rows to the RETURNING list
DEFAULT_MAX_STATEMENT_BYTES = 1 << 20
DEFAULT_CACHE_BYTES = 32 << 20
PASSED_TEXTS = 1024
# The texts the prefilter passed are kept only while short, and at most this many bytes of them: a long text costs
# as much to look up (hashing it) as to test again, and must not stay after the session that sent it (issue 23).
PASSED_MAX_TEXT = 16 << 10
PASSED_BYTES = 4 << 20
ANALYSED_KEPT = 16  # plans made off the event loop and not yet taken by their session (see Classifier.analysed)
# A plan for a text longer than this is dropped from the cache when the session that made it ends (ReadPath.close).
LARGE_TEXT = PASSED_MAX_TEXT


# NamedTuples, not frozen dataclasses: a plan is made for every new statement text, and a frozen
# dataclass costs several times as much to build.
class StatementPlan(NamedTuple):
    action: str  # PASS, TRANSLATE or REFUSE
    sql: str  # the text to send for this statement
    kind: str = ""  # for REFUSE: what was refused (names the statement kind); for PASS: PREFILTERED or ""
    detail: str = ""  # for REFUSE: a human explanation
    fast: str = ""  # for a page (TRANSLATE): its fast statement, an era-3 run's rows as stored or none (ADR 0024)
    fast_key: int = 0  # the parameter that names the page's run ($n), 0 when the text names it


class Plan(NamedTuple):
    """The plan for one Query string or one Parse: its statements and the text to send."""

    statements: tuple[StatementPlan, ...]
    text: str
    translated: bool = False  # some statement reads the translated relation
    refused: StatementPlan | None = None  # the first refused statement
    changed: bool = False  # text differs from the client's
    fast: str = ""  # one statement, a run's page: the text of its fast page (ADR 0024), else ""
    fast_key: int = 0  # the parameter of the fast page's run ($n), 0 when the text names it

    @property
    def passthrough(self) -> bool:
        return not self.changed


class Untranslatable(SeatException):
    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


def _names(ref) -> list[str]:
    from pglast import ast

    return [("*" if isinstance(f, ast.A_Star) else f.sval) for f in ref.fields]



GUARD_FUNCTION = "events_named"  # openwop_seat.events_named(name): true, or refuses the statement (proxy.db.relations)


def _guard_call(name: str):
    from pglast import ast

    return ast.FuncCall(funcname=(ast.String(sval=SEAT_SCHEMA), ast.String(sval=GUARD_FUNCTION)),
                        args=(ast.A_Const(val=ast.String(sval=name)),), funcformat=0)


def _guard_once(name: str):
    """``(SELECT openwop_seat.events_named(name))``: the guard as a sub-select, which PostgreSQL evaluates once per
    execution (an InitPlan) wherever the planner pushes it; a page's plain call is pushed into both arms of its
    union and evaluated in each (the guard is SQL that PostgreSQL inlines, ADR 0021)."""
    from pglast import ast, enums

    return ast.SubLink(subLinkType=enums.SubLinkType.EXPR_SUBLINK, subselect=ast.SelectStmt(
        targetList=(ast.ResTarget(val=_guard_call(name)),), limitOption=enums.LimitOption.LIMIT_OPTION_DEFAULT,
        op=enums.SetOperation.SETOP_NONE))


def _and(where, guard):
    from pglast import ast

    if where is None:
        return guard
    return ast.BoolExpr(boolop=0, args=(where, guard))  # AND_EXPR

class Classifier:
    """Plans statements for one reader major against one host layout, with a byte-bounded LRU cache."""

    def __init__(self, host: HostConfig, major: int, columns: tuple[str, ...] = (), *,
                 cache_bytes: int = DEFAULT_CACHE_BYTES, max_statement_bytes: int = DEFAULT_MAX_STATEMENT_BYTES,
                 first_boot: bool = False, run_function: bool = False, page_function: bool = False,
                 fast_page: bool = False):
        if major not in VIEW:
            raise ValueError(f"Classifier: major must be 1 or 2, got {major!r}")
        self.host = host
        self.major = major
        # The events table's columns in table order: the RETURNING wrapper selects them by name.
        self.columns = tuple(columns) or (host.event_id_column or "event_id", host.run_id_column, "sequence",
                                          host.type_column, host.node_id_column or "node_id",
                                          host.payload_column, "timestamp", "causation_id")
        self.cache_bytes = cache_bytes
        self.max_statement_bytes = max_statement_bytes
        self._cache: OrderedDict[str, Plan] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = 0
        self._passed: dict[str, Plan] = {}  # texts the prefilter passes (see classify)
        self._passed_bytes = 0  # their length in characters (PASSED_BYTES)
        self._analysed: dict[str, Plan] = {}  # plans made off the event loop, until classify() takes them
        self.generation = 0  # bumped by set_functions: a plan analysed before is not used
        schema, _, table = host.events_table.rpartition(".")
        self._schema = schema or None
        self._table = table
        self._needle = table.lower()
        self.functions: frozenset[str] = frozenset()  # see set_functions
        # The events table's constraints an ON CONFLICT ON CONSTRAINT may name -> their columns (set_functions,
        # from the watch: proxy.serve.context.ARBITERS)
        self.arbiters: dict[str, tuple[str, ...]] = {}
        self.arities: dict | None = None  # name -> ((lowest, highest or None), …) of its risky overloads; None: any
        # The database holds code the net cannot hold (proxy.serve.context.PAST_NET; unknown until set_functions):
        # while it does, DO blocks and functions running dynamic SQL are refused (ADR 0019)
        self.past_net = True
        self.held_roles: frozenset[str] = frozenset()  # the login roles the net holds (set_functions)
        # Relations over the events table that read it past the net (issue 23; set_functions, from the watch:
        # proxy.serve.context.past_net_relations): a statement naming one is refused. By lower-case name.
        self.relations: dict[str, tuple] = {}
        self.strict = False  # for the sessions of a role the net does not hold: dynamic SQL refused (ADR 0019)
        self._cte_refs: set[int] = set()  # references to a CTE named like the table (_cte_references)
        # First boot (docs/operations.md#first-boot): the seat's rules are not in force in the database yet, so
        # no statement may read or write the events table's rows; DDL on it (the host's own migrations) passes.
        self.first_boot = first_boot
        # The database has events_m2_run (the v2 store is installed): a major-2 level that names its run reads it
        self.run_function = run_function and major == 2
        # The database has events_m2_run_live too: a run's page reads the store's and the live arm, each in order
        self.page_function = page_function and self.run_function
        # and events_m2_run_era3: a page, the statement's whole text, has a fast twin (ADR 0024)
        self.fast_page = fast_page and self.page_function
        self._page_parts: dict[int, tuple] = {}  # the statement's page levels: WHERE, run key, alias (_fast_text)

    # -- public

    def classify(self, sql: str) -> Plan:
        plan = self._cache.get(sql)
        if plan is not None:
            self.hits += 1
            self._cache.move_to_end(sql)
            return plan
        plan = self._passed.get(sql)
        if plan is not None:
            return plan
        analysed = self._analysed.pop(sql, None) if self._analysed else None  # made off the event loop (analyse)
        low = sql.lower()
        if not self._worth_parsing(sql, low):
            # Nothing to parse. Kept in a small table that is emptied when full, not in the LRU: statements
            # with literals (each text new) would otherwise fill it with garbage the collector keeps walking.
            plan = analysed or _unparsed_plan(sql, low)
            if len(sql) <= PASSED_MAX_TEXT:
                if len(self._passed) >= PASSED_TEXTS or self._passed_bytes + len(sql) > PASSED_BYTES:
                    self._passed.clear()
                    self._passed_bytes = 0
                self._passed[sql] = plan
                self._passed_bytes += len(sql)
            return plan
        self.misses += 1
        plan = analysed or self._classify_or_refuse(sql)
        if plan.refused is not None and plan.refused.kind == CLASSIFIER_FAILED:
            return plan  # not kept: a fixed seat (or a reload) classifies it again
        cost = _cost(sql, plan)
        if cost <= self.cache_bytes:
            self._cache[sql] = plan
            self.bytes += cost
            while self.bytes > self.cache_bytes:
                old_sql, old = self._cache.popitem(last=False)
                self.bytes -= _cost(old_sql, old)
        return plan

    def touch(self, sql: str) -> None:
        """What classify() does to its tables for a text it holds, without the plan: ReadPath._repeated_parse
        repeats a Parse whose plan it kept, and its cache hit is counted and kept recent all the same."""
        if sql in self._cache:
            self.hits += 1
            self._cache.move_to_end(sql)

    # -- analysis off the event loop (issue 23): a long statement is parsed in a worker thread while other sessions
    # are served; its plan is handed back to the next classify() of the same text.

    def needs_analysis(self, sql: str) -> bool:
        """Would classify() parse this text (no plan for it yet)?"""
        return (sql not in self._cache and sql not in self._passed and sql not in self._analysed
                and (self._worth_parsing(sql) or encoding.might_set(sql.lower())))

    def analyse(self, sql: str) -> tuple[Plan, int]:
        """The plan classify() would make for ``sql`` on a cache miss, and the generation it was made in. Safe to
        call from another thread: it works on a shallow copy (the rewrite keeps per-statement state on the
        instance) and reads only what set_functions replaces whole."""
        import copy

        worker = copy.copy(self)
        generation = self.generation
        low = sql.lower()
        if worker._worth_parsing(sql, low):
            return worker._classify_or_refuse(sql), generation
        return _unparsed_plan(sql, low), generation

    def analysed(self, sql: str, plan: Plan, generation: int) -> None:
        """Hand an analyse() result to the next classify() of ``sql`` (dropped if the functions changed since)."""
        if generation != self.generation:
            return
        if len(self._analysed) >= ANALYSED_KEPT:  # results whose session ended before it used them
            self._analysed.clear()
        self._analysed[sql] = plan

    @property
    def size(self) -> int:
        return len(self._cache)

    @property
    def passed_bytes(self) -> int:
        return self._passed_bytes

    @property
    def passed_entries(self) -> int:
        return len(self._passed)

    def forget(self, texts) -> None:
        """Drop the plans of these texts (a session's long statements, when it ends: ReadPath.close)."""
        for sql in texts:
            plan = self._cache.pop(sql, None)
            if plan is not None:
                self.bytes -= _cost(sql, plan)

    def mentions_events(self, sql: str) -> bool:
        low = sql.lower()
        return self._needle in low or "u&" in low

    def _worth_parsing(self, sql: str, low: str | None = None) -> bool:
        # plain substring tests, written out: several times cheaper than a regular expression or any() here
        if low is None:
            low = sql.lower()
        return (self._needle in low or "u&" in low or "openwop_seat" in low or "to_xml" in low or "ts_stat" in low
                or "ts_rewrite" in low or "dblink" in low or ("do" in low and _DO_BLOCK.search(low) is not None)
                or ("create" in low and ("function" in low or "procedure" in low))  # ADR 0017: a dynamic body
                or (bool(self.functions) and any(f in low for f in self.functions))
                or (bool(self.relations) and any(r in low for r in self.relations)))

    def set_functions(self, names) -> None:
        """The functions defined in the database whose bodies could read the events table out of the seat's
        sight (lower case; ``proxy.serve.context.risky_functions``): a translated session may not call them. With
        their ``arities`` (the argument counts of their risky overloads), a call with a count none of them takes is
        not one of them (a user's ``public.lower(text, int)`` leaves ``lower(x)`` alone). With their ``relations``
        (``proxy.serve.context.past_net_relations``: views and materialized views over the events table that read
        it past the net), which no statement may name (issue 23). The plans made with another set are dropped."""
        if self.strict and getattr(names, "strict", None) is not None:
            names = names.strict  # ADR 0019: functions running EXECUTE stay risky for a role the net does not hold
        arities = getattr(names, "arities", None)
        arities = None if arities is None else {k.lower(): tuple(v) for k, v in arities.items()}
        past_net = bool(getattr(names, "past_net", True))
        self.held_roles = frozenset(getattr(names, "held_roles", ()))
        arbiters = getattr(names, "arbiters", None)
        arbiters = self.arbiters if arbiters is None else dict(arbiters)  # unknown: as before
        relations: dict[str, tuple] = {}
        for r in sorted(getattr(names, "relations", ()), key=lambda r: (r.schema, r.name)):
            relations[r.name.lower()] = relations.get(r.name.lower(), ()) + (r,)
        names = frozenset(n.lower() for n in names)
        if names != self.functions or arities != self.arities or past_net != self.past_net \
                or arbiters != self.arbiters or relations != self.relations:
            self.functions = names
            self.arities = arities
            self.past_net = past_net
            self.arbiters = arbiters
            self.relations = relations
            self.generation += 1
            self._analysed.clear()
            self._cache.clear()
            self._passed.clear()
            self._passed_bytes = 0
            self.bytes = 0

    # -- internals

    def _classify_or_refuse(self, sql: str) -> Plan:
        """:meth:`_classify`, and a refusal of the statement (never the session) when the classifier itself fails:
        a bug here must not pass an untranslated statement, nor end the client's connection."""
        try:
            return self._classify(sql)
        except Exception:
            log.exception("the classifier failed on a statement (refused); please report it with the statement")
            refusal = StatementPlan(REFUSE, sql, CLASSIFIER_FAILED,
                                    "the seat failed to analyse a statement that mentions the events table (an "
                                    "error in the seat, logged): it is refused rather than passed untranslated")
            return Plan((refusal,), sql, False, refusal, True)

    def _classify(self, sql: str) -> Plan:
        if not self._worth_parsing(sql):
            return Plan((StatementPlan(PASS, sql),), sql)
        if len(sql.encode("utf-8", "surrogateescape")) > self.max_statement_bytes:
            why = self._unsafe_unparsed(sql)
            if not why:
                # ADR 0017: not parsed, sent as it is; the net refuses whatever in it reads the stored rows
                return Plan((StatementPlan(PASS, sql),), sql)
            refusal = StatementPlan(REFUSE, sql, "statement too large",
                                    f"a statement that mentions the events table is larger than the seat analyses "
                                    f"({self.max_statement_bytes} bytes, reader.max_statement_bytes) and {why}")
            return Plan((refusal,), sql, False, refusal, True)
        from pglast import parse_sql
        from pglast.parser import ParseError

        try:
            raw_stmts = parse_sql(sql)
        except UnicodeEncodeError:
            # Bytes that are not UTF-8 (a single-byte client_encoding): analysed as latin-1 (proxy/readpath/encoding.py)
            return encoding.from_latin1(self._classify(encoding.to_latin1(sql)))
        except ParseError as e:
            # Fail closed: a statement naming the events table that we cannot read is not passed on.
            refusal = StatementPlan(REFUSE, sql, "unparsable statement",
                                    f"the seat could not parse a statement that mentions the events table: {e}")
            return Plan((refusal,), sql, False, refusal, True)
        pieces: list[StatementPlan] = []
        for raw in raw_stmts:
            start = raw.stmt_location or 0
            length = raw.stmt_len or (len(sql) - start)
            pieces.append(self._statement(raw.stmt, sql[start:start + length]))
        if not pieces or all(p.action == PASS for p in pieces):
            return Plan(tuple(pieces) or (StatementPlan(PASS, sql),), sql)
        refused = next((p for p in pieces if p.action == REFUSE), None)
        text = "; ".join(p.sql for p in pieces)
        fast = pieces[0] if len(pieces) == 1 and pieces[0].fast else None
        return Plan(tuple(pieces), text, any(p.action == TRANSLATE for p in pieces), refused, True,
                    fast.fast if fast else "", fast.fast_key if fast else 0)

    def _unsafe_unparsed(self, sql: str) -> str:
        """Why a statement too large to parse may not be sent unparsed ('' when it may), ADR 0017. The net refuses
        every read of the stored rows in a translated session whatever the text; what it does not hold is the new
        row of an ``INSERT … RETURNING`` (which only the seat's rewrite translates), dynamic SQL and DO blocks
        (which can build such a statement), ``dblink`` (another session) and the seat's own relations. A word
        test on the whole text, literals and comments included: a false alarm refuses, as before."""
        if self.first_boot:  # a v1 session reads and writes rows as stored then (docs/operations.md#first-boot)
            return "" if self.major == 1 else "the seat's rules are not in force yet"
        low = sql.lower()
        for word, what in (("returning", "holds RETURNING"), ("execute", "holds EXECUTE"),
                           ("openwop_seat", "names the seat's schema"), ("dblink", "calls dblink")):
            if word in low:
                return what
        if "do" in low and _DO_BLOCK.search(low) is not None:
            return "holds a DO block"
        if any(f in low for f in self.functions):
            return "calls a function whose body could read the events table"
        if self._names_past_net_relation(low) is not None:
            return "names a relation that reads the events table past row-level security"
        if "client_encoding" in low or "set_config" in low or _SETS_NAMES.search(low) is not None:
            return "may set client_encoding"
        return ""

    def _statement(self, stmt, text: str) -> StatementPlan:
        from pglast.stream import RawStream

        spoof = _seat_setting(stmt)
        if spoof:
            return StatementPlan(REFUSE, text, "openwop_seat setting", spoof)
        why = encoding.setting_refusal(stmt)  # the session's client_encoding (proxy/readpath/encoding.py)
        if why:
            return StatementPlan(REFUSE, text, encoding.ERROR_CODE, why)
        try:
            self._cte_refs = self._cte_references(stmt)
            self._seat_relations(stmt)
            self._past_net_relations(stmt)
            self._server_side_sql(stmt, text)
            if not any(self._is_events(n) for n in _walk(stmt)):
                return StatementPlan(PASS, text)
            if self.first_boot and isinstance(stmt, _ROW_STATEMENTS):
                if self.major == 1:
                    # No run can be era 3 before the rules are in force (nothing stamps one), so a v1 session reads
                    # and writes event rows as stored: runs it creates are era 2, as a v1 host's are. The session
                    # ends once the rules come into force (docs/operations.md#first-boot).
                    return StatementPlan(PASS, text)
                raise Untranslatable("rules not in force", FIRST_BOOT_REFUSAL)
            self._page_parts = {}  # filled by this statement's rewrite only (a COPY's makes a statement of its own)
            new = self._rewrite(stmt)
        except Untranslatable as e:
            return StatementPlan(REFUSE, text, e.kind, e.detail)
        if new is None:
            return StatementPlan(PASS, text)
        translated = RawStream()(new)
        if self.fast_page and id(new) in self._page_parts:
            return StatementPlan(TRANSLATE, translated, "", "", *self._fast_text(new))
        return StatementPlan(TRANSLATE, translated)

    def _fast_text(self, level) -> tuple[str, int]:
        """A statement that is a run's page, alone (``_is_page``): its fast twin, the same page of
        ``openwop_seat.events_m2_run_era3(<key>)`` under the page's own ``WHERE`` (and the level's search_path
        guard, if any), ``ORDER BY`` and ``LIMIT``: the page's rows where the run is era 3, as stored, else none
        (ADR 0024). With the number of the parameter that names the run (0: a constant)."""
        from pglast import ast, enums
        from pglast.stream import RawStream

        where, key, alias = self._page_parts[id(level)]
        call = ast.FuncCall(funcname=(ast.String(sval=SEAT_SCHEMA), ast.String(sval=ERA3_FUNCTION)), args=(key,),
                            agg_within_group=False, agg_star=False, agg_distinct=False, func_variadic=False,
                            funcformat=enums.CoercionForm.COERCE_EXPLICIT_CALL)
        era3 = ast.RangeFunction(lateral=False, ordinality=False, is_rowsfrom=False, functions=((call, None),),
                                    alias=alias)
        saved = level.fromClause, level.whereClause
        level.fromClause = (era3,)
        level.whereClause = where if saved[1] is None else _and(where, saved[1])  # saved[1]: the guard
        try:
            text = RawStream()(level)
        finally:
            level.fromClause, level.whereClause = saved
        param = key.arg if isinstance(key, ast.TypeCast) else key
        return text, param.number if isinstance(param, ast.ParamRef) else 0

    # ---- what names the events table

    def _is_events(self, node) -> bool:
        from pglast import ast

        if not isinstance(node, ast.RangeVar) or node.relname != self._table or id(node) in self._cte_refs:
            return False
        if node.catalogname is not None:
            return True  # db.schema.events: treat as the table (PostgreSQL refuses other databases anyway)
        if self._schema is None:
            return node.schemaname in (None, "public")
        return node.schemaname in (None, self._schema)

    def _cte_references(self, stmt) -> set[int]:
        """The unqualified references named like the events table that PostgreSQL resolves to a CTE of that name
        (``WITH events AS (…) SELECT … FROM events``), by its scoping: the CTE is seen by the query that holds the
        WITH, its sub-queries and the CTEs after it in the list, and by every CTE of the list, its own body
        included, when the WITH is RECURSIVE; an inner WITH of the same name hides an outer one. They are not the
        table and are not substituted. Had one been taken for the CTE wrongly, it would read the table itself,
        which the net refuses (ADR 0009, 0017)."""
        from pglast import ast

        if self._needle not in {getattr(n, "ctename", "").lower() for n in _walk(stmt)
                                if isinstance(n, ast.CommonTableExpr)}:
            return set()
        scope: dict[int, bool] = {}  # id(RangeVar) -> it is the CTE; outer WITHs first, inner ones override

        def mark(node, cte: bool) -> None:
            for m in _walk(node):
                if isinstance(m, ast.RangeVar) and m.relname == self._table and m.schemaname is None \
                        and m.catalogname is None:
                    if cte:
                        scope[id(m)] = True
                    else:  # where this WITH's CTE is not seen, an outer one of the same name still is
                        scope.setdefault(id(m), False)

        for n in _walk(stmt):  # parents before children: an inner WITH is seen after the outer one
            w = getattr(n, "withClause", None) if "withClause" in getattr(n, "__slots__", ()) else None
            if w is None or not any(c.ctename == self._table for c in w.ctes or ()):
                continue
            k = next(i for i, c in enumerate(w.ctes) if c.ctename == self._table)
            n.withClause = None  # the query's own body: everything but its WITH
            try:
                mark(n, True)
            finally:
                n.withClause = w
            for i, c in enumerate(w.ctes):
                mark(c.ctequery, bool(w.recursive) or i > k)
            # a CTE body's own inner WITHs are walked later and override what they define
        return {i for i, cte in scope.items() if cte}

    def _seat_relations(self, stmt) -> None:
        """A client reads the seat's relations only through the rewrite: naming them itself (a major-2 session
        reading events_m1, say) would hand it the other reader's spelling."""
        from pglast import ast

        for n in _walk(stmt):
            if isinstance(n, ast.RangeVar) and n.schemaname == SEAT_SCHEMA and n.relname.startswith("events_"):
                raise Untranslatable("seat relation", f"{SEAT_SCHEMA}.{n.relname} is the seat's own relation; "
                                                      f"read the events table by its own name")
            if isinstance(n, ast.FuncCall) and len(n.funcname) == 2 and n.funcname[0].sval == SEAT_SCHEMA and \
                    n.funcname[1].sval in ("type_m1", "type_m2", "payload_m1", "payload_m2"):
                raise Untranslatable("seat function", f"{SEAT_SCHEMA}.{n.funcname[1].sval} is called by the seat's "
                                                      f"rewrite only")

    def _past_net_relations(self, stmt) -> None:
        """Issue 23: a view over the events table owned by a role that reads past row-level security (and not
        ``security_invoker``), or such a materialized view, hands whoever reads it the stored rows: the net does
        not apply to it. A statement naming one (by its name, qualified by its schema or not: an unqualified name is
        taken for it whatever ``search_path`` finds, which fails closed) is refused."""
        from pglast import ast

        if not self.relations:
            return
        for n in _walk(stmt):
            if not isinstance(n, ast.RangeVar):
                continue
            for r in self.relations.get(n.relname.lower(), ()):
                if n.schemaname is None or n.schemaname.lower() == r.schema.lower():
                    raise Untranslatable("relation past the net", past_net_refusal(r))

    def _names_past_net_relation(self, body: str):
        """The first relation that reads the events table past the net whose name a body (lower case) holds (a
        substring test, as for the risky functions' names), or None."""
        return next((rs[0] for name, rs in self.relations.items() if name in body), None)

    def _server_side_sql(self, stmt, text: str) -> None:
        """SQL the server would run on the session's behalf, out of the seat's sight: refused where it can be
        seen to read the events table, and the catalog functions that run a query given as text, always."""
        from pglast import ast

        if isinstance(stmt, (ast.DoStmt, ast.CreateFunctionStmt)):
            named = self._names_past_net_relation(text.lower())
            if named is not None:  # issue 23: code that would read it on the server
                raise Untranslatable("relation past the net", past_net_refusal(named))
        if isinstance(stmt, ast.DoStmt) and self._risky_block(stmt):
            raise Untranslatable("DO block", "a DO block that names the events table, runs dynamic SQL, is not "
                                             "PL/pgSQL or calls a function that could read the table runs code out "
                                             "of the seat's sight; run it from a raw session")
        if isinstance(stmt, ast.CreateFunctionStmt) and self.mentions_events(text):
            raise Untranslatable("a function body naming the events table",
                                 "a function body naming the events table would read it on the server, "
                                 "untranslated; create it from a raw session")
        if isinstance(stmt, ast.CreateFunctionStmt) and self._dynamic_function(stmt):
            # ADR 0017: such a body can build an INSERT … RETURNING into events, whose new row the net lets pass;
            # a function created here in pg_temp is never in the database's watched list, so it is refused here.
            raise Untranslatable("a function body running dynamic SQL",
                                 "a function whose body runs dynamic SQL (EXECUTE, query_to_xml …) or is not SQL or "
                                 "PL/pgSQL could return the events table's stored rows out of the seat's sight; "
                                 "create it from a raw session")
        for n in _walk(stmt):
            if not isinstance(n, ast.FuncCall):
                continue
            name = n.funcname[-1].sval.lower()
            schema = n.funcname[0].sval.lower() if len(n.funcname) > 1 else None
            if name in QUERY_RUNNING_FUNCTIONS and schema in (None, "pg_catalog"):
                raise Untranslatable("query-running function",
                                     f"{n.funcname[-1].sval}() runs SQL (or reads whole tables) on the server, out "
                                     f"of the seat's sight: it is refused in a translated session")
            if name in self.functions and schema != "pg_catalog" and self._may_be_risky(name, len(n.args or ())):
                raise Untranslatable("database function",
                                     f"{n.funcname[-1].sval}() is defined in the database and its body could read "
                                     f"the events table out of the seat's sight (it names the table, runs dynamic "
                                     f"SQL, or calls such a function), so a translated session may not call it "
                                     f"(call it from a raw session, or read the events table directly)")

    def _may_be_risky(self, name: str, nargs: int) -> bool:
        """Could a call of ``name`` with ``nargs`` arguments resolve to one of its risky overloads? (PostgreSQL
        resolves a call only to a function that takes that many arguments, defaults and VARIADIC counted.)"""
        if self.arities is None or name not in self.arities:
            return True
        return any(lo <= nargs and (hi is None or nargs <= hi) for lo, hi in self.arities[name])

    def _dynamic_words(self) -> tuple[str, ...]:
        """What makes server-side code run SQL out of the seat's sight (ADR 0019): ``EXECUTE`` counts only while
        the net does not hold dynamic SQL (first boot, or code in the database that reads past the net)."""
        return DYNAMIC_SQL_WORDS if self.first_boot or self.past_net or self.strict else DYNAMIC_SQL_WORDS_NET

    def strict_twin(self) -> "Classifier":
        """A classifier like this one for the sessions of a role the net does not hold (a superuser, a BYPASSRLS
        role, or one that may SET ROLE to such a role): it refuses dynamic SQL whatever the database holds."""
        twin = Classifier(self.host, self.major, self.columns, cache_bytes=self.cache_bytes,
                          max_statement_bytes=self.max_statement_bytes, first_boot=self.first_boot,
                          run_function=self.run_function, page_function=self.page_function,
                          fast_page=self.fast_page)
        twin.strict = True  # set_functions gives it the watch's strict set
        twin.arbiters = self.arbiters
        return twin

    def _dynamic_function(self, stmt) -> bool:
        """Does a CREATE FUNCTION/PROCEDURE's body run dynamic SQL the net does not hold, or is it in a language
        other than SQL and PL/pgSQL (the watch's test of the database's functions,
        proxy.serve.context.risky_functions)? A ``SECURITY DEFINER`` body's ``EXECUTE`` counts in any case."""
        language, body = "sql", ""
        for d in stmt.options or ():
            if d.defname == "language" and getattr(d.arg, "sval", None):
                language = d.arg.sval.lower()
            elif d.defname == "as":
                parts = d.arg if isinstance(d.arg, (list, tuple)) else (d.arg,)
                body = " ".join(getattr(p, "sval", "") or "" for p in parts).lower()
        definer = any(d.defname == "security" and getattr(d.arg, "boolval", d.arg) for d in stmt.options or ())
        words = DYNAMIC_SQL_WORDS if definer else self._dynamic_words()
        return language not in ("sql", "plpgsql") or any(w in body for w in words)

    def _risky_block(self, stmt) -> bool:
        """Could a DO block read the events table: the same test as for the database's functions."""
        opts = {d.defname: d.arg.sval for d in stmt.args or () if getattr(d.arg, "sval", None) is not None}
        body = opts.get("as", "").lower()
        # ADR 0019: while the net holds dynamic SQL, it holds the block's own statements too (they run with the
        # session's rights): naming the events table no longer refuses it, what it reads meets the net
        named = self._needle in body and self._dynamic_words() is DYNAMIC_SQL_WORDS
        return (opts.get("language", "plpgsql").lower() != "plpgsql" or named
                or any(w in body for w in self._dynamic_words()) or any(f in body for f in self.functions)
                or self._names_past_net_relation(body) is not None)

    # ---- the rewrite

    def _rewrite(self, stmt):
        """``stmt`` with every read of the events table substituted (in place), or a new statement for a
        RETURNING write; None when nothing reads the table (DDL on it, COPY FROM, a write without RETURNING)."""
        from pglast import ast

        kind = type(stmt).__name__
        if isinstance(stmt, (ast.ViewStmt, ast.RuleStmt, ast.CreateFunctionStmt, ast.CreatePolicyStmt,
                             ast.AlterPolicyStmt, ast.CreateTrigStmt, ast.MergeStmt, ast.CreateStatsStmt)):
            if isinstance(stmt, ast.CreateTrigStmt):
                return None  # a trigger on the table: DDL, not a read (its function is separate)
            raise Untranslatable(f"{_KIND.get(kind, kind)} over the events table",
                                 f"{_KIND.get(kind, kind)} naming the events table would keep a read of it that no "
                                 f"later reader's major applies to; create it from a raw session")
        if isinstance(stmt, ast.CopyStmt):
            return self._copy(stmt)
        if not isinstance(stmt, _QUERY_STATEMENTS):
            # DDL and the like on the table itself (ALTER, DROP, TRUNCATE, LOCK, GRANT, COMMENT, INDEX,
            # VACUUM, ANALYZE): no rows come back. Only a query inside one could read it.
            for n in _walk(stmt):
                if isinstance(n, (ast.SelectStmt, ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)):
                    raise Untranslatable(f"{kind} with a query over the events table",
                                         f"{kind} with a query naming the events table is not translated")
            return None
        changed = self._substitute(stmt)
        if changed:
            self._unqualify_columns(stmt)
        if isinstance(stmt, (ast.SelectStmt, ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)):
            stmt, more = self._root(stmt)
        else:  # EXPLAIN, DECLARE … CURSOR, PREPARE, CREATE TABLE AS: the statement holds the query
            stmt.query, more = self._root(stmt.query)
        self._leftovers(stmt)
        return stmt if changed or more else None

    def _root(self, q):
        """A statement's top query level: its writes checked, data-modifying CTEs and a RETURNING write of the
        events table wrapped to return translated rows. (query, whether it changed)."""
        from pglast import ast

        self._check_writes(q)
        changed = False
        if isinstance(q, (ast.SelectStmt, ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)) and \
                q.withClause is not None:
            changed = self._wrap_cte_writes(q)
        if self._returning_write(q):
            return self._wrap_returning(q), True
        return q, changed

    def _relation(self, rv):
        from pglast import ast

        alias = rv.alias if rv.alias is not None else ast.Alias(aliasname=rv.relname)
        return ast.RangeVar(schemaname=SEAT_SCHEMA, relname=VIEW[self.major], inh=True, relpersistence="p",
                            alias=alias, location=rv.location)

    def _substitute(self, stmt) -> bool:
        """Replace the events table in every FROM position under ``stmt`` whose query level could read a
        translated column; True when anything changed.

        A level that reads only the columns both eras store alike (``run_id``, ``sequence``, …: no ``type``,
        no ``payload``, no ``*``, no whole row, no ``NATURAL`` join or ``USING`` over them) reads
        ``events_keys``, the table without those two columns and without a join (ADR 0009: the net refuses a
        read of the table itself): its answer is the same, and PostgreSQL keeps its plain-table optimisations
        (``max(sequence)`` as one index probe); field notation or a whole row at such a level sees no stored
        ``type``/``payload``. The test is on everything under the level, sub-levels included, so a column a
        sub-level takes from it by correlation counts too."""
        from pglast import ast

        changed = False
        self._kept: set[int] = set()
        self._paged: set[int] = set()  # the levels read as a page's union (_run_relation)
        self._page_parts: dict[int, tuple] = {}  # their WHERE, run key and alias, for the fast twin (_fast_text)
        unqualified: list[str] = []
        locks = _lock_targets(stmt)

        def from_item(item, translate: bool, run_key=None, locked=frozenset()):
            nonlocal changed
            if self._is_events(item):
                changed = True
                if item.schemaname is None and item.catalogname is None:
                    unqualified.append(item.relname)
                view = self._relation(item)
                if locked is None or view.alias.aliasname in locked:
                    # ADR 0017: a row lock applies to these rows: the lockable translation, which PostgreSQL locks
                    # through to the events table's rows (whatever the level reads: only what it names is computed)
                    view.relname = LOCK_VIEW[self.major]
                    return view
                if run_key is not None and run_key[0] is item:
                    return self._run_relation(item, run_key[1], run_key[2])
                if not translate:
                    # ADR 0009: the events table itself is never read in a translated session (the net refuses
                    # it); a level that reads neither type nor payload reads events_keys, a join-free view.
                    keys = self._relation(item)
                    keys.relname = KEYS_VIEW
                    self._kept.add(id(keys))
                    return keys
                return view
            if isinstance(item, ast.JoinExpr):
                item.larg = from_item(item.larg, translate, run_key, locked)
                item.rarg = from_item(item.rarg, translate, run_key, locked)
            elif isinstance(item, ast.RangeTableSample):
                if self._is_events(item.relation):
                    raise Untranslatable("TABLESAMPLE on the events table",
                                         "TABLESAMPLE samples the stored table, which a translated session never reads")
            return item

        for n in list(_walk(stmt)):
            for field in ("fromClause", "usingClause"):
                items = getattr(n, field, None) if field in getattr(n, "__slots__", ()) else None
                if items:
                    translate = self._reads_translated(n, items)
                    locked = locks.get(id(n), frozenset())
                    # a level a row lock reaches (its own, or pushed down from an outer level) reads the lock view,
                    # never events_m2_run: PostgreSQL does not lock through a function in FROM
                    run_key = self._run_key(n, items) if translate and self.run_function and \
                        field == "fromClause" and isinstance(n, ast.SelectStmt) and not n.lockingClause and \
                        id(n) not in locks else None
                    setattr(n, field, tuple(from_item(i, translate, run_key, locked) for i in items))
            if unqualified and "whereClause" in getattr(n, "__slots__", ()):
                # An unqualified name is the host's table only where the session's search_path finds it there
                # (issue 23: a schema per tenant, a temporary table of the same name): checked by PostgreSQL
                # once per execution, and refused otherwise, never read from the host's table instead.
                guard = _guard_once if id(n) in self._paged else _guard_call
                n.whereClause = _and(n.whereClause, guard(unqualified[0]))
            unqualified.clear()
            if isinstance(n, ast.DeleteStmt) and self._is_events(n.relation) \
                    and not (n.returningClause is not None and n.returningClause.exprs) \
                    and not self._reads_translated(n, [n.relation]):
                # The host deletes a run's events by run_id (host-traffic.md). PostgreSQL applies the table's
                # SELECT policy to the rows a DELETE's WHERE reads, and the net cannot tell that from a read
                # of stored rows; a DELETE that reads neither type nor payload deletes through events_delete,
                # the seat's join-free view of the keys, checked against the reader's own DELETE privilege.
                target = self._relation(n.relation)
                target.relname = DELETE_VIEW
                n.relation = target
                changed = True
        return changed

    def _run_key(self, level, items):
        """(the events reference, the run's expression, ``level`` when it is a page) when ``level`` reads one
        events reference of its FROM
        and its WHERE holds, as a conjunct at the top, ``<that reference>.run_id = <a parameter or a constant>``
        (the host's page statement, ``WHERE run_id = $1 AND sequence > $2``): that reference may then read
        ``events_m2_run(<the expression>)``, events_m2 restricted to the run, which asks once per statement
        whether the run is in the v2 store (ADR 0015 decision 7). The level keeps its WHERE, so its answer is
        the same (a page's arms take it over, ``_run_relation``). None otherwise. A page: see ``_is_page``."""
        from pglast import ast, enums

        refs = []

        def collect(item):
            if isinstance(item, ast.JoinExpr):
                collect(item.larg)
                collect(item.rarg)
            elif isinstance(item, ast.RangeVar) and self._is_events(item):
                refs.append(item)

        for item in items:
            collect(item)
        if len(refs) != 1 or level.whereClause is None:
            return None
        (rv,) = refs
        alone = len(items) == 1 and items[0] is rv  # an unqualified column can only be the reference's
        name = rv.alias.aliasname if rv.alias is not None else rv.relname
        run = self.host.run_id_column
        if rv.alias is not None and rv.alias.colnames:
            return None  # FROM events AS e(a, b, …): the run's column has another name here

        def is_run_column(n) -> bool:
            if not isinstance(n, ast.ColumnRef) or not all(isinstance(f, ast.String) for f in n.fields):
                return False
            names = [f.sval for f in n.fields]
            if names[-1] != run:
                return False
            if len(names) == 1:
                return alone
            if len(names) == 2:
                return names[0] == name
            return len(names) == 3 and rv.alias is None and names[1] == rv.relname and \
                names[0] in {rv.schemaname or self._schema or "public"}

        def is_key(n) -> bool:
            if isinstance(n, ast.TypeCast):
                n = n.arg
            return isinstance(n, ast.ParamRef) or (isinstance(n, ast.A_Const) and not n.isnull)

        where = level.whereClause
        conjuncts = where.args if isinstance(where, ast.BoolExpr) and where.boolop == enums.BoolExprType.AND_EXPR \
            else (where,)
        for c in conjuncts:
            if isinstance(c, ast.A_Expr) and c.kind == enums.A_Expr_Kind.AEXPR_OP and len(c.name) == 1 and \
                    c.name[0].sval == "=":
                for col, key in ((c.lexpr, c.rexpr), (c.rexpr, c.lexpr)):
                    if is_run_column(col) and is_key(key):
                        page = self.page_function and alone and self._is_page(level, conjuncts, c, is_key, name)
                        return rv, key, level if page else None
        return None

    @staticmethod
    def _is_page(level, conjuncts, run_conjunct, is_key, name: str) -> bool:
        """Is ``level`` a run's page, ``SELECT <columns> FROM events WHERE run_id = <key> AND sequence > <key>
        ORDER BY sequence [ASC] LIMIT <key>`` and nothing else (the host's page statement)? Its rows are then the
        first ``LIMIT`` rows in ``sequence`` order of the ones its ``WHERE`` keeps, and since ``sequence`` is unique
        in a run, so are the first ``LIMIT`` of the union of any two arms that part the run's rows, each arm cut at
        its own first ``LIMIT`` under the same ``WHERE`` and ``ORDER BY``. Only plain columns in its target list
        (a set-returning function there would take rows past the limit), no ``DISTINCT``, grouping, window,
        ``OFFSET``, ``WITH TIES``, ``WITH`` or locking."""
        from pglast import ast, enums

        if level.op != enums.SetOperation.SETOP_NONE or level.distinctClause or level.groupClause or \
                level.havingClause is not None or level.windowClause or level.lockingClause or \
                level.withClause is not None or level.intoClause is not None or level.limitOffset is not None or \
                level.limitCount is None or not is_key(level.limitCount) or \
                level.limitOption != enums.LimitOption.LIMIT_OPTION_COUNT:
            return False
        if not level.targetList or not all(isinstance(t, ast.ResTarget) and isinstance(t.val, ast.ColumnRef)
                                           for t in level.targetList):
            return False

        def is_sequence(n) -> bool:
            if not isinstance(n, ast.ColumnRef) or not all(isinstance(f, ast.String) for f in n.fields):
                return False
            names = [f.sval for f in n.fields]
            return names == ["sequence"] or names == [name, "sequence"]

        if any(isinstance(n, ast.ColumnRef) and len(n.fields) > 2 for n in (run_conjunct.lexpr, run_conjunct.rexpr)):
            return False  # public.events.run_id: left to events_m2_run, whose name _unqualify_columns knows
        others = [c for c in conjuncts if c is not run_conjunct]
        if len(others) != 1 or not isinstance(others[0], ast.A_Expr) or \
                others[0].kind != enums.A_Expr_Kind.AEXPR_OP or len(others[0].name) != 1:
            return False
        after, op = others[0], others[0].name[0].sval
        if not ((op == ">" and is_sequence(after.lexpr) and is_key(after.rexpr)) or
                (op == "<" and is_sequence(after.rexpr) and is_key(after.lexpr))):
            return False
        if not level.sortClause or len(level.sortClause) != 1:
            return False
        (by,) = level.sortClause
        return is_sequence(by.node) and by.useOp is None and \
            by.sortby_dir in (enums.SortByDir.SORTBY_DEFAULT, enums.SortByDir.SORTBY_ASC) and \
            by.sortby_nulls == enums.SortByNulls.SORTBY_NULLS_DEFAULT

    def _run_relation(self, rv, key, page=None):
        """``openwop_seat.events_m2_run(<key>) AS <the reference's name>`` in place of the events reference; for a
        page (``_is_page``), the union of its two arms, each with the page's ``WHERE``, ``ORDER BY`` and ``LIMIT``:

            ((SELECT * FROM openwop_seat.events_v2_filled AS <name> WHERE … ORDER BY … LIMIT …)
             UNION ALL
             (SELECT * FROM openwop_seat.events_m2_run_live(<key>) AS <name> WHERE … ORDER BY … LIMIT …)) AS <name>

        so that each arm is an index range read in order and cut at the limit, merged in order below the level's
        own ORDER BY and LIMIT (ADR 0015, page plans); the arms' texts are printed from the level's before
        anything else changes it. The level's WHERE is then dropped (every row of either arm passes it) and the
        search_path guard, if any, becomes the level's WHERE as a sub-select (``_guard_once``)."""
        from pglast import ast, enums, parse_sql
        from pglast.stream import RawStream

        alias = rv.alias if rv.alias is not None else ast.Alias(aliasname=rv.relname)
        if page is not None:
            name = _quote(alias.aliasname)
            where, order = RawStream()(page.whereClause), RawStream()(page.sortClause[0])
            limit = RawStream()(page.limitCount)
            arm = "(SELECT * FROM {} AS " + name + f" WHERE {where} ORDER BY {order} LIMIT {limit})"
            union = (arm.format(f"{SEAT_SCHEMA}.{FILLED_VIEW}") + " UNION ALL " +
                     arm.format(f"{SEAT_SCHEMA}.{RUN_LIVE_FUNCTION}({RawStream()(key)})"))
            sub = parse_sql(f"SELECT * FROM ({union}) AS {name}")[0].stmt.fromClause[0]
            sub.alias = alias
            # Each arm keeps only rows of that WHERE (over the keys, the run and the sequence, which both arms
            # read alike), so the level's own copy of it would only test every row of the merge again.
            self._page_parts[id(page)] = (page.whereClause, key, alias)
            page.whereClause = None
            self._paged.add(id(page))
            return sub
        call = ast.FuncCall(funcname=(ast.String(sval=SEAT_SCHEMA), ast.String(sval=RUN_FUNCTION)), args=(key,),
                            agg_within_group=False, agg_star=False, agg_distinct=False, func_variadic=False,
                            funcformat=enums.CoercionForm.COERCE_EXPLICIT_CALL)
        return ast.RangeFunction(lateral=False, ordinality=False, is_rowsfrom=False, functions=((call, None),),
                                 alias=alias)

    def _unqualify_columns(self, stmt) -> None:
        """``public.events.type`` (what SQLAlchemy Core emits for ``Table('events', …, schema='public')``) names
        the relation by its schema and table; once substituted, the relation is the seat's view aliased to the
        table's name, so the reference becomes ``events.type``. Only where a substituted item kept that name
        (a schema-qualified reference to an aliased table is an error in PostgreSQL too)."""
        from pglast import ast

        named = {n.alias.aliasname for n in _walk(stmt) if isinstance(n, ast.RangeVar) and n.schemaname ==
                 SEAT_SCHEMA and n.relname in (VIEW[self.major], LOCK_VIEW[self.major], KEYS_VIEW)
                 and n.alias is not None}
        named |= {n.alias.aliasname for n in _walk(stmt) if isinstance(n, ast.RangeFunction) and n.alias is not None
                  and [f.sval for f in n.functions[0][0].funcname] == [SEAT_SCHEMA, RUN_FUNCTION]}
        if self._table not in named:
            return
        schemas = {self._schema or "public"}
        for n in _walk(stmt):
            if not isinstance(n, ast.ColumnRef) or len(n.fields) < 3:
                continue
            names = [getattr(f, "sval", None) for f in n.fields]
            for skip in (2, 1):  # catalog.schema.events.col, schema.events.col
                if len(names) >= skip + 2 and names[skip] == self._table and names[skip - 1] in schemas:
                    n.fields = tuple(n.fields[skip:])
                    break

    def _reads_translated(self, level, items) -> bool:
        """Could ``level`` (a statement with ``items`` in its FROM) read a translated column of an events
        reference among them? Conservative: any mention anywhere under it counts."""
        from pglast import ast

        names = set()
        for item in items:
            for n in _walk(item):
                if self._is_events(n):
                    names.add(n.alias.aliasname if n.alias is not None else n.relname)
                elif isinstance(n, ast.JoinExpr) and n.alias is not None and \
                        any(self._is_events(m) for m in _walk(n)):
                    names.add(n.alias.aliasname)  # (events JOIN runs …) AS j: j's whole row holds type
        if not names:
            return True
        stored = {self.host.type_column, self.host.payload_column}
        columns = set(self.columns)
        for n in _walk(level):
            if isinstance(n, ast.ColumnRef):
                cols = _names(n)
                if cols[-1] in stored or cols[-1] == "*" or (len(cols) == 1 and cols[0] in names):
                    return True
                # e.to_jsonb, events.row_to_json: field notation for a function of the whole row (ADR 0009)
                if len(cols) == 2 and cols[0] in names and cols[1] not in columns:
                    return True
            elif isinstance(n, ast.A_Indirection):  # (j).type, (e).*: a field of a whole row
                if any(isinstance(i, ast.A_Star) or (isinstance(i, ast.String) and i.sval in stored)
                       for i in n.indirection or ()):
                    return True
            elif isinstance(n, ast.JoinExpr):
                if n.isNatural or any(u.sval in stored for u in n.usingClause or ()):
                    return True
            elif isinstance(n, ast.RangeVar) and self._is_events(n) and n.alias is not None and n.alias.colnames:
                return True  # columns renamed by position
        return False

    def _leftovers(self, stmt) -> None:
        """After the substitution, the events table may remain only as the target of a write, or where its
        query level reads no translated column."""
        from pglast import ast

        targets = {id(n.relation) for n in _walk(stmt)
                   if isinstance(n, (ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)) and n.relation is not None}
        # FOR UPDATE OF events: a name in a lock clause is the alias of a FROM item, not a reference of its own
        targets |= {id(rv) for n in _walk(stmt) if isinstance(n, ast.LockingClause) for rv in n.lockedRels or ()}
        for n in _walk(stmt):
            if self._is_events(n) and id(n) not in targets and id(n) not in self._kept:
                raise Untranslatable("events table in an unknown position",
                                     "the statement names the events table where the seat cannot substitute it")

    def _writes(self, stmt) -> bool:
        from pglast import ast

        return isinstance(stmt, (ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)) and self._is_events(stmt.relation)

    def _returning_write(self, stmt) -> bool:
        return self._writes(stmt) and stmt.returningClause is not None and bool(stmt.returningClause.exprs)

    def _check_writes(self, stmt) -> None:
        """Writes to the events table whose values or predicates read the stored type/payload of the rows
        they change (the target's columns are stored, not translated) are refused."""
        from pglast import ast

        for n in _walk(stmt):
            if not isinstance(n, (ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)) or not self._is_events(n.relation):
                continue
            alias = n.relation.alias.aliasname if n.relation.alias else n.relation.relname
            if isinstance(n, ast.InsertStmt):
                if n.onConflictClause is not None:
                    parts = (n.onConflictClause.targetList, n.onConflictClause.whereClause)
                    self._no_stored_columns(parts, alias, "ON CONFLICT DO UPDATE", allow=("excluded",))
                continue
            if isinstance(n, ast.UpdateStmt):
                if n.fromClause:
                    self._no_stored_columns((n.targetList, n.whereClause), alias, "UPDATE … FROM")
                parts = (n.targetList, n.whereClause)
                what = "UPDATE"
            else:
                parts = (n.whereClause,)
                what = "DELETE"
            if (n.fromClause if isinstance(n, ast.UpdateStmt) else n.usingClause) and n.returningClause is not None:
                raise Untranslatable(f"{what} … RETURNING with other tables",
                                     f"{what} of the events table joined with other tables cannot return "
                                     f"translated rows")
            self._no_stored_columns(parts, alias, what)

    def _no_stored_columns(self, parts, alias: str, what: str, allow: tuple[str, ...] = ()) -> None:
        from pglast import ast

        stored = {self.host.type_column, self.host.payload_column}
        for part in parts:
            for n in _walk(part):
                if not isinstance(n, ast.ColumnRef):
                    continue
                names = _names(n)
                if len(names) > 1 and names[-2] in allow:
                    continue
                if names[-1] in stored or names[-1] == "*" or names == [alias]:
                    raise Untranslatable(f"{what} reading stored event columns",
                                         f"{what} of the events table reads {'.'.join(names)} as stored; in a "
                                         f"translated session only run_id, sequence and the other untranslated "
                                         f"columns may decide or feed a write")

    def _copy(self, stmt):
        from pglast import parse_sql

        if stmt.relation is not None:
            if stmt.is_from or not self._is_events(stmt.relation):
                return None  # COPY events FROM: a write, the writer rule's business
            cols = ", ".join(_quote(c.sval) for c in stmt.attlist) if stmt.attlist else "*"
            query = parse_sql(f"SELECT {cols} FROM {SEAT_SCHEMA}.{VIEW[self.major]} AS {_quote(self._table)}")[0].stmt
            stmt.relation = None
            stmt.attlist = None
            stmt.query = query
            return stmt
        if stmt.query is not None:
            changed = self._substitute(stmt.query)
            stmt.query, more = self._root(stmt.query)
            self._leftovers(stmt)
            return stmt if changed or more else None
        return None

    # ---- RETURNING

    def _returned(self, write, source: str):
        """A SELECT of ``write``'s RETURNING list over the translated rows of the CTE ``source``."""
        from pglast import parse_sql

        h = self.host
        alias = write.relation.alias.aliasname if write.relation.alias else write.relation.relname

        def arg(name: str | None, cast: str) -> str:
            return f"(openwop_seat_w.{_quote(name)})::{cast}" if name and name in self.columns else f"NULL::{cast}"

        via = self._via_view(write)
        type_fn, payload_fn = WRITTEN_FUNCTIONS[self.major]
        era = "openwop_seat_r.era"
        translated = {
            h.type_column: f"{SEAT_SCHEMA}.{type_fn}({arg(h.type_column, 'text')}, {era}, "
                           f"{arg(h.run_id_column, 'text')}, {arg('sequence', 'bigint')})",
            h.payload_column: f"{SEAT_SCHEMA}.{payload_fn}({arg(h.type_column, 'text')}, "
                              f"{arg(h.payload_column, 'jsonb')}, {era}, {arg(h.run_id_column, 'text')}, "
                              f"{arg('sequence', 'bigint')}, {arg(h.event_id_column, 'text')}, "
                              f"{arg(h.node_id_column, 'text')})"}
        if via:
            # ADR 0019: the view returns the written row's type and payload translated, each only where the list
            # may read it (a data-modifying CTE computes its whole RETURNING list for every row)
            self._need = self._stored_named(write.returningClause.exprs, alias)
            translated = {h.type_column: f"openwop_seat_w.{TYPE_OUT}" if h.type_column in self._need else "NULL::text",
                          h.payload_column: f"openwop_seat_w.{PAYLOAD_OUT}" if h.payload_column in self._need
                          else "NULL::jsonb"}
        cols = ", ".join(f"{translated[c]} AS {_quote(c)}" if c in translated else f"openwop_seat_w.{_quote(c)}"
                         for c in self.columns)
        self._system = self._system_columns(write, alias)
        cols += "".join(f", openwop_seat_w.{SYSTEM_PREFIX}{c}" for c in self._system)
        call = f"(SELECT {SEAT_SCHEMA}.era_now({arg(h.run_id_column, 'text')}) AS era)"
        lateral = "" if via else f" CROSS JOIN LATERAL {call} openwop_seat_r"
        select = parse_sql(f"SELECT 1 FROM (SELECT {cols} FROM {_quote(source)} openwop_seat_w"
                           f"{lateral}) AS {_quote(alias)}")[0].stmt
        select.targetList = write.returningClause.exprs
        return select

    def _system_columns(self, write, alias: str) -> list[str]:
        """The system columns (``xmax``, ``ctid`` …) ``write``'s RETURNING list names (``RETURNING *, (xmax = 0)``
        of an upsert, issue 23), the list rewritten in place to read them from the written rows: the CTE returns
        each as ``openwop_seat_sys_<name>``, the translated rows carry it along, and a ``*`` of the list (which
        would now take those too) is spelled out as the table's columns. A whole row of the target together with
        a system column, or a system column inside a sub-select of the list, is refused."""
        from pglast import ast

        found: list[str] = []
        exprs = write.returningClause.exprs

        def name_of(ref) -> str | None:
            names = [getattr(f, "sval", None) for f in ref.fields]
            if len(names) == 1 and names[0] in SYSTEM_COLUMNS:
                return names[0]
            if len(names) == 2 and names[0] == alias and names[1] in SYSTEM_COLUMNS:
                return names[1]
            return None

        for n in _walk(exprs):
            if isinstance(n, ast.SubLink) and any(isinstance(m, ast.ColumnRef) and name_of(m) for m in _walk(n)):
                raise Untranslatable("RETURNING system column in a sub-select",
                                     "a system column inside a sub-select of a RETURNING list of the events table is "
                                     "not translated; name it in the list itself")
        refs = [n for n in _walk(exprs) if isinstance(n, ast.ColumnRef) and name_of(n)]
        if not refs:
            return []
        stars = [t for t in exprs if isinstance(t.val, ast.ColumnRef) and isinstance(t.val.fields[-1], ast.A_Star)
                 and (len(t.val.fields) == 1 or getattr(t.val.fields[0], "sval", None) == alias)]
        for n in _walk(exprs):
            if isinstance(n, ast.ColumnRef) and [getattr(f, "sval", None) for f in n.fields] == [alias] \
                    and not isinstance(n.fields[-1], ast.A_Star):
                raise Untranslatable("RETURNING system column with a whole row",
                                     "a RETURNING list of the events table naming both its whole row and a system "
                                     "column is not translated")
        for ref in refs:
            name = name_of(ref)
            if name not in found:
                found.append(name)
            ref.fields = (ast.String(sval=alias), ast.String(sval=SYSTEM_PREFIX + name))
        for t in exprs:
            if isinstance(t.val, ast.ColumnRef) and t.name is None and len(t.val.fields) == 2 and \
                    getattr(t.val.fields[1], "sval", "").startswith(SYSTEM_PREFIX):
                t.name = t.val.fields[1].sval[len(SYSTEM_PREFIX):]  # RETURNING xmax: still named xmax
        out = []
        for t in exprs:
            if any(t is s for s in stars):
                out += [ast.ResTarget(val=ast.ColumnRef(fields=(ast.String(sval=alias), ast.String(sval=c))))
                        for c in self.columns]
            else:
                out.append(t)
        write.returningClause.exprs = tuple(out)
        return found

    def _star_returning(self, write):
        from pglast import ast, enums

        def ref(name: str):
            return ast.ResTarget(val=ast.ColumnRef(fields=(ast.String(sval=name),)))

        if self._via_view(write):
            # the view: every column but the stored type and payload (not granted), their translations where the
            # list reads them, the system columns it carries (openwop_seat_sys_<name>); then the target is the view
            stored = {self.host.type_column: TYPE_OUT, self.host.payload_column: PAYLOAD_OUT}
            exprs = [ref(c) for c in self.columns if c not in stored]
            need = getattr(self, "_need", None)
            exprs += [ref(out) for c, out in stored.items() if need is None or c in need]
            exprs += [ref(SYSTEM_PREFIX + c) for c in getattr(self, "_system", ())]
            alias = write.relation.alias if write.relation.alias is not None else \
                ast.Alias(aliasname=write.relation.relname)
            write.relation = ast.RangeVar(schemaname=SEAT_SCHEMA, relname=INSERT_VIEW[self.major], inh=True,
                                          relpersistence="p", alias=alias, location=write.relation.location)
            oc = write.onConflictClause
            if oc is not None and oc.infer is not None and oc.infer.conname:
                # the view has no constraint: the arbiter named by its columns, which infers the same unique index
                oc.infer = ast.InferClause(indexElems=tuple(
                    ast.IndexElem(name=c, ordering=enums.SortByDir.SORTBY_DEFAULT,
                                  nulls_ordering=enums.SortByNulls.SORTBY_NULLS_DEFAULT)
                    for c in self.arbiters[oc.infer.conname]))
        else:
            exprs = [ast.ResTarget(val=ast.ColumnRef(fields=(ast.A_Star(),)))]
            exprs += [ast.ResTarget(name=SYSTEM_PREFIX + c, val=ast.ColumnRef(fields=(ast.String(sval=c),)))
                      for c in getattr(self, "_system", ())]
        self._system = []
        self._need = None
        write.returningClause = ast.ReturningClause(exprs=tuple(exprs))

    def _via_view(self, write) -> bool:
        """ADR 0019: does this RETURNING write go through the seat's insert view? Every ``INSERT`` into the events
        table (the net refuses its new row on the table itself in a translated session), except one whose ``ON
        CONFLICT … DO UPDATE`` reads the stored type or payload of the existing or the proposed row (the view does
        not grant them), and ``ON CONFLICT ON CONSTRAINT`` naming a constraint the watch does not know as a unique or
        primary key of plain columns (PostgreSQL would look it up on the view, which has none; a known one is named
        by its columns instead): those stay on the table, where they meet the net."""
        from pglast import ast, enums

        if not isinstance(write, ast.InsertStmt) or not self._is_events(write.relation):
            return False
        oc = write.onConflictClause
        if oc is not None and oc.infer is not None and oc.infer.conname and oc.infer.conname not in self.arbiters:
            return False  # a constraint of the table the view cannot name by its columns
        if oc is None or oc.action != enums.OnConflictAction.ONCONFLICT_UPDATE:
            return True
        alias = write.relation.alias.aliasname if write.relation.alias else write.relation.relname
        stored = {self.host.type_column, self.host.payload_column}
        for n in _walk((oc.targetList, oc.whereClause)):
            if isinstance(n, ast.A_Indirection):
                return False
            if isinstance(n, ast.ColumnRef):
                names = _names(n)
                if names[-1] in stored or names[-1] == "*" or names in ([alias], ["excluded"]):
                    return False
        return True

    def _stored_named(self, exprs, alias: str) -> set[str]:
        """The stored columns (type, payload) a RETURNING list may read: named, or through ``*``, a whole row, field
        notation or a name that is not one of the table's other columns (conservative)."""
        from pglast import ast

        stored = {self.host.type_column, self.host.payload_column}
        known = (set(self.columns) - stored) | set(SYSTEM_COLUMNS)
        need: set[str] = set()
        for n in _walk(exprs):
            if isinstance(n, ast.A_Indirection):
                return stored
            if isinstance(n, ast.ColumnRef):
                last = _names(n)[-1]
                if last in stored:
                    need.add(last)
                elif last not in known and not last.startswith(SYSTEM_PREFIX):
                    return stored
        return need

    def _wrap_returning(self, write):
        """``WITH …, written AS (write RETURNING *) SELECT <its RETURNING list> FROM <translated rows>``."""
        from pglast import ast

        select = self._returned(write, WRITTEN)
        ctes = list(write.withClause.ctes) if write.withClause is not None else []
        recursive = bool(write.withClause and write.withClause.recursive)
        write.withClause = None
        self._star_returning(write)
        ctes.append(ast.CommonTableExpr(ctename=WRITTEN, ctequery=write))
        select.withClause = ast.WithClause(ctes=tuple(ctes), recursive=recursive)
        return select

    def _wrap_cte_writes(self, stmt) -> bool:
        """Data-modifying CTEs that write the events table with RETURNING: each returns translated rows."""
        from pglast import ast

        out, changed = [], False
        for i, cte in enumerate(stmt.withClause.ctes):
            q = cte.ctequery
            if self._returning_write(q):
                if q.withClause is not None:
                    raise Untranslatable("nested WITH in a data-modifying CTE",
                                         "a data-modifying CTE with its own WITH over the events table")
                source = f"{WRITTEN}_{i}"
                select = self._returned(q, source)
                self._star_returning(q)
                out.append(ast.CommonTableExpr(ctename=source, ctequery=q))
                cte.ctequery = select
                changed = True
            out.append(cte)
        stmt.withClause.ctes = tuple(out)
        return changed


# Catalog functions that run a query given as text, or read whole tables or schemas, on the server.
QUERY_RUNNING_FUNCTIONS = frozenset((
    "query_to_xml", "query_to_xmlschema", "query_to_xml_and_xmlschema", "table_to_xml", "table_to_xmlschema",
    "table_to_xml_and_xmlschema", "schema_to_xml", "schema_to_xmlschema", "schema_to_xml_and_xmlschema",
    "database_to_xml", "database_to_xmlschema", "database_to_xml_and_xmlschema", "cursor_to_xml",
    "cursor_to_xmlschema", "ts_stat", "ts_rewrite", "dblink", "dblink_exec", "dblink_open", "dblink_send_query"))
# Words in server-side code (a function's body, a DO block) that mean it may run SQL the seat cannot see.
DYNAMIC_SQL_WORDS = ("execute", "query_to_", "table_to_", "schema_to_", "database_to_", "cursor_to_", "dblink",
                     "ts_stat", "ts_rewrite")
# The same where the net holds dynamic SQL (ADR 0019): EXECUTE run with the session's rights meets the net, whatever
# it reads or returns, as long as the database holds no code that reads past it (proxy.serve.context.PAST_NET).
DYNAMIC_SQL_WORDS_NET = tuple(w for w in DYNAMIC_SQL_WORDS if w != "execute")
_DO_BLOCK = re.compile(r"(^|;)\s*do[\s$']")
_SETS_NAMES = re.compile(r"\b(set\s+names|reset)\b")  # SET NAMES, RESET client_encoding / ALL

_QUERY_STATEMENTS: tuple = ()
_ROW_STATEMENTS: tuple = ()  # statements that read or write rows: the query statements and COPY
FIRST_BOOT_REFUSAL = ("the seat's rules are not in force in this database yet (first boot): a statement that reads or "
                      "writes the events table's rows is refused until `openwop-seat migrate` has run and the seat "
                      "has seen it (see docs/operations.md#first-boot)")
_KIND = {"ViewStmt": "a view", "RuleStmt": "a rule", "CreateFunctionStmt": "a function body",
         "CreatePolicyStmt": "a policy", "AlterPolicyStmt": "a policy", "MergeStmt": "MERGE",
         "CreateStatsStmt": "extended statistics"}


def _init_kinds() -> None:
    global _QUERY_STATEMENTS, _ROW_STATEMENTS
    from pglast import ast

    _QUERY_STATEMENTS = (ast.SelectStmt, ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt, ast.ExplainStmt,
                         ast.DeclareCursorStmt, ast.PrepareStmt, ast.CreateTableAsStmt)
    _ROW_STATEMENTS = (*_QUERY_STATEMENTS, ast.CopyStmt, ast.MergeStmt)


_init_kinds()


def _lock_targets(stmt) -> dict:
    """The query levels under ``stmt`` that a row lock (``FOR UPDATE``, ``FOR NO KEY UPDATE``, ``FOR SHARE``, ``FOR
    KEY SHARE``) applies to, as PostgreSQL applies it: ``id(level)`` → the names of the level's ``FROM`` items it
    locks (``None``: all of them, a lock without ``OF``). A lock of a sub-select in ``FROM`` (named, or all) is pushed
    into it and locks everything there, at every level of it, as PostgreSQL pushes it (ADR 0017)."""
    from pglast import ast

    out: dict = {}
    levels = {}
    for n in _walk(stmt):
        if isinstance(n, ast.SelectStmt) and n.lockingClause:
            names: set | None = set()
            for clause in n.lockingClause:
                if not clause.lockedRels:
                    names = None
                    break
                names |= {rv.relname for rv in clause.lockedRels}
            out[id(n)] = None if names is None else frozenset(names)
            levels[id(n)] = n
    todo = list(levels.values())
    while todo:
        level = todo.pop()
        locked = out[id(level)]
        for item in _from_items(level):
            if isinstance(item, ast.RangeSubselect) and item.alias is not None and \
                    (locked is None or item.alias.aliasname in locked):
                for sub in _select_levels(item.subquery):
                    if out.get(id(sub), frozenset()) is not None:
                        out[id(sub)] = None
                        todo.append(sub)
    return out


def _from_items(level):
    """A level's FROM items, joins opened."""
    from pglast import ast

    stack = list(getattr(level, "fromClause", None) or ())
    while stack:
        item = stack.pop()
        if isinstance(item, ast.JoinExpr):
            stack += [item.larg, item.rarg]
        else:
            yield item


def _select_levels(query):
    """The SELECT levels of a sub-select a pushed-down lock reaches: the sub-select itself and, below it, the
    sub-selects of its FROM (each level's own FROM is pushed into by _lock_targets' loop)."""
    from pglast import ast

    if isinstance(query, ast.SelectStmt):
        yield query
        for part in (query.larg, query.rarg):  # a set operation: PostgreSQL refuses the lock there itself
            if part is not None:
                yield from _select_levels(part)


def _cost(sql: str, plan: Plan) -> int:
    """What a cached plan holds, roughly in bytes: the key and the rewritten text (when it differs)."""
    return 2 * len(sql) + (len(plan.text) + len(plan.fast) if plan.changed else 0) + 600  # texts and objects


def _unparsed_plan(sql: str, low: str) -> Plan:
    """The plan of a text the prefilter passes (``low``: its lower case): sent as it is, its statement marked
    PREFILTERED (it names nothing the seat reads, so it is no event write either), unless it sets a client_encoding
    the seat cannot parse in."""
    return (_encoding_plan(sql) if encoding.might_set(low) else None) or Plan((StatementPlan(PASS, sql, PREFILTERED),),
                                                                              sql)


def _encoding_plan(sql: str) -> Plan | None:
    """A statement the prefilter passes may still set a client_encoding the seat cannot parse in
    (proxy/readpath/encoding.py): the plan that refuses it, or None."""
    pieces = encoding.statement_refusals(sql)
    if pieces is None:
        return None
    plans = tuple(StatementPlan(REFUSE, text, encoding.ERROR_CODE, why) if why else StatementPlan(PASS, text)
                  for text, why in pieces)
    refused = next(p for p in plans if p.action == REFUSE)
    return Plan(plans, "; ".join(p.sql for p in plans), False, refused, True)


def past_net_refusal(r) -> str:
    """The refusal's text for a relation past the net (``proxy.serve.context.PastNetRelation``)."""
    what = "materialized view" if r.kind == "m" else "view"
    fix = ("drop it (its rows are stored rows whoever owns it; a view with security_invoker = true reads through the "
           "net instead)" if r.kind == "m" else
           f"ALTER VIEW {_quote(r.schema)}.{_quote(r.name)} SET (security_invoker = true), or give it to an owner "
           f"that does not read past row-level security (ALTER VIEW … OWNER TO …)")
    return (f"{r.schema}.{r.name} is a {what} that reads the events table past the seat's row-level security "
            f"({r.why}), so a translated session may not read it: it would see the stored rows, not this "
            f"reader's translation; fix it from a raw session: {fix}")


def _seat_setting(stmt) -> str:
    """Why a statement tries to set the seat's own state (openwop_seat.* settings, the claim), or ''."""
    from pglast import ast

    for n in _walk(stmt):
        if isinstance(n, ast.VariableSetStmt) and (n.name or "").lower().startswith("openwop_seat."):
            return f"SET {n.name}: openwop_seat.* settings belong to the seat and cannot be set by a client"
        if isinstance(n, ast.FuncCall):
            name = ".".join(f.sval for f in n.funcname).lower()
            if name in ("set_config", "pg_catalog.set_config") and n.args:
                first = n.args[0]
                if isinstance(first, ast.A_Const) and isinstance(first.val, ast.String) and \
                        first.val.sval.lower().startswith("openwop_seat."):
                    return f"set_config('{first.val.sval}', …): openwop_seat.* settings belong to the seat"
            if name in ("openwop_seat.claim", "openwop_seat.claim_challenge", "openwop_seat.claim_once"):
                return f"{name} is called by the seat itself, never by a client"
    return ""


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
