"""The SQL classifier: a pure function from statement text (and the reader's major) to a plan.

A plan says, per statement, whether it passes untouched, is rewritten to carry a
hidden era column (computed by the database, in the statement's own snapshot,
and checked there so that a refusal fails the server-side statement exactly as a
PostgreSQL error would), or is refused because it reads event columns in a way
the seat cannot translate exactly. Plans are cached by exact text; pglast only
runs on a cache miss and only after a cheap substring prefilter.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from .config import HostConfig

HIDDEN = "__openwop_era"

PASS, TRANSLATE, REFUSE = "passthrough", "translate", "refuse"


@dataclass(frozen=True)
class StatementPlan:
    action: str  # PASS, TRANSLATE or REFUSE
    sql: str  # the text to send for this statement
    kind: str = ""  # for REFUSE: what was refused (names the statement kind)
    detail: str = ""  # for REFUSE: a human explanation
    columns: tuple[str, ...] = ()  # for TRANSLATE: the result's columns that carry event type/payload


@dataclass(frozen=True)
class Plan:
    """The plan for one Query string or one Parse: its statements and the text to send."""

    statements: tuple[StatementPlan, ...]
    text: str
    translated: bool = False  # some statement carries the hidden era column
    refused: StatementPlan | None = None  # the first refused statement
    changed: bool = False  # text differs from the client's

    @property
    def passthrough(self) -> bool:
        return not self.changed


PASSTHROUGH_EMPTY = Plan((), "", False, None, False)


class Untranslatable(Exception):
    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


# ---------------------------------------------------------------- AST helpers (pglast nodes)


def _walk(node):
    """Yield every pglast node under ``node`` (inclusive), depth first."""
    from pglast import ast

    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, (list, tuple)):
            stack.extend(n)
        elif isinstance(n, ast.Node):
            yield n
            for name in n.__slots__:
                child = getattr(n, name, None)
                if isinstance(child, (ast.Node, list, tuple)):
                    stack.append(child)


def _colref_names(ref) -> list:
    from pglast import ast

    return [("*" if isinstance(f, ast.A_Star) else f.sval) for f in ref.fields]


@dataclass
class _Source:
    name: str  # alias or relation name, as referenced in this level
    direct: bool  # True: the events table itself; False: a derived table carrying a hidden column
    tainted: frozenset = frozenset()  # column names, through this source, that carry event type/payload


@dataclass
class _Ctx:
    host: HostConfig
    major: int
    ctes: dict = field(default_factory=dict)  # CTE name -> its event-column output names (∅: none)


class Classifier:
    """Classifies statements for one reader major against one host layout, with an LRU cache."""

    def __init__(self, host: HostConfig, major: int, cache_size: int = 4096):
        from .schema import era_now_sql, era_sql, read_check_sql, read_project_sql, returned_project_sql

        self.host = host
        self.major = major
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Plan] = OrderedDict()
        self.hits = self.misses = 0
        schema, _, table = host.events_table.rpartition(".")
        self._schema = schema or None
        self._table = table
        self._needle = table.lower() if table == table.lower() else table
        self._fold = table == table.lower()
        self._era_sql = era_sql
        self._era_now_sql = era_now_sql
        self._read_check_sql = read_check_sql
        self._read_project_sql = read_project_sql
        self._returned_project_sql = returned_project_sql

    # -- public

    def classify(self, sql: str) -> Plan:
        plan = self._cache.get(sql)
        if plan is not None:
            self.hits += 1
            self._cache.move_to_end(sql)
            return plan
        self.misses += 1
        plan = self._classify(sql)
        self._cache[sql] = plan
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return plan

    @property
    def size(self) -> int:
        return len(self._cache)

    def mentions_events(self, sql: str) -> bool:
        return self._needle in (sql.lower() if self._fold else sql)

    # -- internals

    def _classify(self, sql: str) -> Plan:
        if not self.mentions_events(sql) and "openwop_seat" not in sql.lower():
            return Plan((StatementPlan(PASS, sql),), sql)
        from pglast import parse_sql
        from pglast.parser import ParseError

        try:
            raw_stmts = parse_sql(sql)
        except ParseError as e:
            # Fail closed: a statement naming the events table that we cannot read is not passed on.
            refusal = StatementPlan(REFUSE, sql, "unparsable statement",
                                    f"the seat could not parse a statement that mentions the events table: {e}")
            return Plan((refusal,), sql, False, refusal, True)
        pieces: list[StatementPlan] = []
        for raw in raw_stmts:
            start = raw.stmt_location or 0
            length = raw.stmt_len or (len(sql) - start)
            # pglast reports statement locations in characters of the text
            text = sql[start:start + length]
            pieces.append(self._statement(raw.stmt, text))
        if not pieces:
            return Plan((StatementPlan(PASS, sql),), sql)
        if all(p.action == PASS for p in pieces):
            return Plan(tuple(pieces), sql)
        refused = next((p for p in pieces if p.action == REFUSE), None)
        text = "; ".join(p.sql for p in pieces)
        return Plan(tuple(pieces), text, any(p.action == TRANSLATE for p in pieces), refused, True)

    def _statement(self, stmt, text: str) -> StatementPlan:
        from pglast import ast
        from pglast.stream import RawStream

        spoof = _seat_setting(stmt)
        if spoof:
            return StatementPlan(REFUSE, text, "openwop_seat setting", spoof)
        if not any(isinstance(n, ast.RangeVar) and self._is_events(n) for n in _walk(stmt)):
            return StatementPlan(PASS, text)
        ctx = _Ctx(self.host, self.major)
        try:
            self._reserved_name(stmt)
            carried = self._top(stmt, ctx)
        except Untranslatable as e:
            return StatementPlan(REFUSE, text, e.kind, e.detail)
        if carried is None:
            return StatementPlan(PASS, text)
        return StatementPlan(TRANSLATE, RawStream()(stmt), columns=tuple(sorted(carried)))

    def _is_events(self, rv) -> bool:
        if rv.relname != self._table:
            return False
        if self._schema is None:
            return rv.schemaname in (None, "public")
        return rv.schemaname in (None, self._schema)

    def _reserved_name(self, stmt) -> None:
        """The hidden column's name is the seat's: a client may not produce or read a column of that name."""
        from pglast import ast

        for n in _walk(stmt):
            if (isinstance(n, ast.ResTarget) and n.name == HIDDEN) or (
                    isinstance(n, ast.ColumnRef) and _colref_names(n)[-1] == HIDDEN):
                raise Untranslatable("reserved column name", f"the column name {HIDDEN} is reserved for the seat")

    def _top(self, stmt, ctx: _Ctx) -> frozenset[str] | None:
        """Analyse a top-level statement; add hidden columns in place. The result's event columns when rewritten,
        else None."""
        from pglast import ast

        if isinstance(stmt, ast.SelectStmt):
            return self._select(stmt, ctx)
        if isinstance(stmt, (ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)):
            return self._dml(stmt, ctx)
        if isinstance(stmt, ast.CopyStmt):
            if stmt.is_from and stmt.relation is not None:
                return None  # COPY events FROM: a write, the writer rule's business
            raise Untranslatable("COPY TO", "COPY … TO of the events table cannot be translated row by row")
        if isinstance(stmt, ast.DeclareCursorStmt):
            self._reject_event_columns(stmt.query, ctx, "cursor over the events table")
            return None
        if isinstance(stmt, ast.ExplainStmt):
            return None  # returns a plan, not rows
        if isinstance(stmt, ast.PrepareStmt):
            self._reject_event_columns(stmt.query, ctx, "SQL PREPARE over the events table")
            return None
        if isinstance(stmt, (ast.ViewStmt, ast.CreateTableAsStmt)):
            self._reject_event_columns(stmt.query, ctx, "view or table created from event columns")
            return None
        if isinstance(stmt, ast.RuleStmt):
            raise Untranslatable("rule on the events table", "rules on the events table are not translated")
        return None  # DDL and the rest: no rows come back

    def _reject_event_columns(self, query, ctx: _Ctx, kind: str) -> None:
        """Refuse when event type/payload flow anywhere in ``query``."""
        if query is not None and self._touches(query, ctx):
            raise Untranslatable(kind, f"{kind}: event type/payload would reach the reader untranslated")

    def _touches(self, node, ctx: _Ctx, columns_in=None) -> bool:
        """Conservatively: does ``node`` read an event type/payload column anywhere (in ``columns_in``
        when given: the parts of ``node`` whose column references count)?"""
        from pglast import ast

        names = set(self._event_columns)
        reads = False
        local_ctes = {c.ctename for n in _walk(node) if isinstance(n, ast.WithClause) for c in n.ctes or ()}
        for n in _walk(node):
            if isinstance(n, ast.RangeVar):
                if n.schemaname is None and ctx.ctes.get(n.relname):
                    reads = True
                    names |= ctx.ctes[n.relname]
                elif self._is_events(n) and not (n.schemaname is None and n.relname in local_ctes):
                    reads = True
        if not reads:
            return False
        for n in _walk(node if columns_in is None else columns_in):
            if isinstance(n, ast.ColumnRef):
                cols = _colref_names(n)
                if cols[-1] == "*" or cols[-1] in names or cols == [self._table]:
                    return True
        # reading events without naming its type/payload columns (e.g. count(*), run_id, sequence)
        return False

    @property
    def _event_columns(self) -> frozenset[str]:
        return frozenset((self.host.type_column, self.host.payload_column))

    # ---- SELECT

    def _select(self, sel, ctx: _Ctx) -> frozenset[str] | None:
        """Analyse one SELECT level. When it outputs event type/payload columns, add the hidden
        column and return their output names; otherwise return None."""
        from pglast import ast
        from pglast.enums import SetOperation

        if sel.op != SetOperation.SETOP_NONE:
            if self._touches(sel, ctx):
                raise Untranslatable("set operation", "UNION/INTERSECT/EXCEPT over event type/payload columns")
            return None
        if sel.withClause is not None:
            self._with(sel.withClause, ctx)
        if sel.valuesLists:
            return None
        sources: list[_Source] = []
        for item in sel.fromClause or ():
            self._from_item(item, ctx, sources)
        # Everything but the target list must not look at type/payload.
        for clause, what in ((sel.whereClause, "a predicate on"), (sel.groupClause, "GROUP BY on"),
                             (sel.havingClause, "HAVING on"), (sel.sortClause, "ORDER BY on"),
                             (sel.distinctClause, "DISTINCT ON"), (sel.windowClause, "a window over"),
                             (sel.limitCount, "LIMIT over"), (sel.limitOffset, "OFFSET over")):
            self._no_event_columns(clause, sources, ctx, what)
        outputs: list[tuple[str, bool]] = []  # (output name, carries an event column)
        tainted: set[str] = set()
        star_over_derived = False
        payload_out = False  # a star or the payload column itself: the payload leaves this level
        for target in sel.targetList or ():
            kind, names = self._target(target.val, sources, ctx)
            if kind == "star":
                tainted |= names
                star_over_derived = star_over_derived or any(not s.direct for s in sources)
                outputs.append(("*", True))
                payload_out = True
            elif kind == "column":
                out = target.name or _colref_names(target.val)[-1]
                tainted.add(out)
                outputs.append((out, True))
                payload_out = payload_out or _colref_names(target.val)[-1] == self.host.payload_column
            else:
                outputs.append((target.name or "", False))
        if not tainted:
            return None
        # ORDER BY / GROUP BY / DISTINCT ON naming an output column by alias or position.
        for clause, what in ((sel.sortClause, "ORDER BY on"), (sel.groupClause, "GROUP BY on"),
                             (sel.distinctClause, "DISTINCT ON")):
            for n in _walk(clause):
                if isinstance(n, ast.ColumnRef) and len(n.fields) == 1 and _colref_names(n)[0] in tainted:
                    raise Untranslatable(f"{what} event columns", f"{what} event column {_colref_names(n)[0]}")
                if isinstance(n, ast.A_Const) and isinstance(n.val, ast.Integer):
                    k = n.val.ival
                    if 1 <= k <= len(outputs) and outputs[k - 1][1]:
                        raise Untranslatable(f"{what} event columns", f"{what} an event column (position {k})")
        if sel.distinctClause is not None and any(d is None for d in sel.distinctClause):
            # plain DISTINCT compares the stored spellings (DISTINCT ON's expressions were checked above)
            raise Untranslatable("DISTINCT", "DISTINCT over event type/payload columns")
        if sel.groupClause:
            raise Untranslatable("GROUP BY", "GROUP BY with event type/payload columns in the result")
        if sel.intoClause is not None:
            raise Untranslatable("SELECT INTO", "SELECT … INTO a table from event type/payload columns")
        carrying = [s for s in sources if s.tainted]
        if len(carrying) != 1:
            raise Untranslatable("join of event sources",
                                 "a result joining the events table with itself or with another event source")
        source = carrying[0]
        if source.direct or not star_over_derived:
            sel.targetList = tuple(sel.targetList) + (self._hidden_target(source, payload=payload_out),)
        return frozenset(tainted)

    def _with(self, with_clause, ctx: _Ctx) -> None:
        from pglast import ast

        for cte in with_clause.ctes or ():
            q = cte.ctequery
            if with_clause.recursive and self._touches(q, ctx):
                raise Untranslatable("recursive CTE", "a recursive CTE over event columns")
            if isinstance(q, ast.SelectStmt):
                carried = self._select(q, ctx)
            elif isinstance(q, (ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)):
                carried = self._dml(q, ctx)
            else:
                carried = None
            if carried and cte.aliascolnames:
                raise Untranslatable("column alias list", "a column alias list on a CTE over event columns")
            ctx.ctes[cte.ctename] = carried or frozenset()

    def _from_item(self, item, ctx: _Ctx, sources: list) -> None:
        from pglast import ast

        if isinstance(item, ast.RangeVar):
            name = item.alias.aliasname if item.alias else item.relname
            if item.schemaname is None and item.relname in ctx.ctes:  # a CTE hides a table of that name
                if ctx.ctes[item.relname]:
                    if item.alias and item.alias.colnames:
                        raise Untranslatable("column alias list", "a column alias list over event columns")
                    sources.append(_Source(name, False, ctx.ctes[item.relname]))
            elif self._is_events(item):
                if item.alias and item.alias.colnames:
                    raise Untranslatable("column alias list", "a column alias list on the events table")
                sources.append(_Source(name, True, self._event_columns))
        elif isinstance(item, ast.JoinExpr):
            if item.alias is not None and self._touches(item, ctx):
                raise Untranslatable("aliased join", "an aliased join over event columns")
            self._from_item(item.larg, ctx, sources)
            self._from_item(item.rarg, ctx, sources)
            self._no_event_columns(item.quals, sources, ctx, "a join condition on")
        elif isinstance(item, ast.RangeSubselect):
            carried = self._select(item.subquery, ctx)
            if carried:
                if item.alias is None:
                    raise Untranslatable("subquery", "a subquery over event columns needs an alias")
                if item.alias.colnames:
                    raise Untranslatable("column alias list", "a column alias list over event columns")
                sources.append(_Source(item.alias.aliasname, False, carried))
        elif isinstance(item, ast.RangeTableSample) and isinstance(item.relation, ast.RangeVar):
            self._from_item(item.relation, ctx, sources)
        else:
            # functions and the like in FROM: no event columns as arguments (LATERAL references included)
            self._no_event_columns(item, sources, ctx, "a function in FROM over")
            if self._touches(item, ctx):
                raise Untranslatable("FROM item", f"{type(item).__name__} over event columns")

    def _no_event_columns(self, clause, sources: list, ctx: _Ctx, what: str) -> None:
        """Refuse when ``clause`` refers to an event type/payload column (or reads them in a sublink)."""
        if clause is None:
            return
        from pglast import ast

        for n in _walk(clause):
            if isinstance(n, ast.ColumnRef) and sources and self._refers(n, sources):
                raise Untranslatable(f"{what} event columns",
                                     f"{what} event {_colref_names(n)[-1]} is not translated")
            if isinstance(n, ast.SubLink) and self._sublink_touches(n, ctx):
                raise Untranslatable(f"{what} event columns", f"{what} event columns inside a subquery")

    def _refers(self, ref, sources: list) -> bool:
        """Does a column reference name an event type/payload column (or a whole event row)?"""
        names = _colref_names(ref)
        col = names[-1]
        if len(names) == 1:
            return any(col in s.tainted or col == s.name for s in sources)
        for s in sources:
            if s.name == names[-2]:
                return col == "*" or col in s.tainted
        return False

    def _target(self, val, sources: list, ctx: _Ctx) -> tuple[str, frozenset[str]]:
        """('star', names) / ('column', ∅) when a target outputs event columns as they are, ('', ∅) when
        it outputs none; expressions over event columns are refused."""
        from pglast import ast

        none = ("", frozenset())
        if isinstance(val, ast.ColumnRef):
            names = _colref_names(val)
            if names[-1] == "*":
                if len(names) == 1:
                    carried = frozenset().union(*(s.tainted for s in sources)) if sources else frozenset()
                    return ("star", carried) if carried else none
                for s in sources:
                    if s.name == names[-2] and s.tainted:
                        return "star", s.tainted
                return none
            if sources and self._refers(val, sources):
                if len(names) == 1 and any(names[0] == s.name for s in sources):
                    raise Untranslatable("whole-row reference", "a whole-row reference to an event row")
                return "column", frozenset()
            return none
        for n in _walk(val):
            if isinstance(n, ast.ColumnRef) and sources and self._refers(n, sources):
                raise Untranslatable("expression over event columns",
                                     f"an expression over event {_colref_names(n)[-1]} is not translated")
            if isinstance(n, ast.SubLink) and self._sublink_touches(n, ctx):
                raise Untranslatable("subquery over event columns", "a scalar subquery returning event columns")
        return none

    def _sublink_touches(self, link, ctx: _Ctx) -> bool:
        """EXISTS ignores its sub-select's output list; every other sublink uses it."""
        from pglast import ast
        from pglast.enums import SubLinkType

        sub = link.subselect
        if link.subLinkType == SubLinkType.EXISTS_SUBLINK and isinstance(sub, ast.SelectStmt) and \
                sub.op == 0 and sub.withClause is None:
            parts = (sub.fromClause, sub.whereClause, sub.groupClause, sub.havingClause, sub.sortClause)
            return self._touches(sub, ctx, columns_in=parts)
        return self._touches(sub, ctx)

    def _hidden_target(self, source: _Source, fresh: bool = False, payload: bool = False):
        """The hidden era column for ``source``; ``fresh`` reads the era with a new snapshot (RETURNING).

        When a major-2 result outputs the events table's payload, the hidden column is text and carries the
        projected payload too (``read_v2p``; see proxy.projection); otherwise it is the smallint era."""
        from pglast import ast, parse_sql

        if source.direct:
            q = _quote(source.name)
            run_id = f"{q}.{_quote(self.host.run_id_column)}"
            era = self._era_now_sql(run_id) if fresh else self._era_sql(self.host, run_id)
            if payload and self.major == 2:
                expr = (self._returned_project_sql(self.host, q) if fresh
                        else self._read_project_sql(self.host, era, q))
            else:
                expr = self._read_check_sql(self.major, era, f"{q}.{_quote(self.host.type_column)}",
                                            f"{q}.{_quote(self.host.run_id_column)}", f"{q}.sequence")
        else:
            expr = f"{_quote(source.name)}.{HIDDEN}"
        node = parse_sql(f"SELECT {expr}")[0].stmt.targetList[0].val
        return ast.ResTarget(name=HIDDEN, val=node)

    # ---- INSERT/UPDATE/DELETE

    def _dml(self, stmt, ctx: _Ctx) -> frozenset[str] | None:
        from pglast import ast

        if stmt.withClause is not None:
            self._with(stmt.withClause, ctx)
        rel = stmt.relation
        target_is_events = rel is not None and self._is_events(rel) and not (
            rel.schemaname is None and rel.relname in ctx.ctes)
        if isinstance(stmt, ast.InsertStmt):
            if stmt.selectStmt is not None and self._touches(stmt.selectStmt, ctx):
                kind = "copy of event rows" if target_is_events else "copy of event columns into another table"
                raise Untranslatable(kind, f"{kind}: INSERT … SELECT of event type/payload is not translated")
        else:
            extra = getattr(stmt, "fromClause", None) or getattr(stmt, "usingClause", None) or ()
            from_sources: list[_Source] = []
            for item in extra:
                self._from_item(item, ctx, from_sources)
            if from_sources and self._touches(stmt, ctx):
                raise Untranslatable("write joined with event columns",
                                     "UPDATE … FROM / DELETE … USING over event type/payload is not translated")
            if not target_is_events:
                for clause in (getattr(stmt, "whereClause", None), getattr(stmt, "targetList", None)):
                    self._reject_event_columns(clause, ctx, "write derived from event columns")
        if not target_is_events:
            return None
        source = _Source(rel.alias.aliasname if rel.alias else rel.relname, True, self._event_columns)
        if isinstance(stmt, (ast.UpdateStmt, ast.DeleteStmt)):
            self._no_event_columns(stmt.whereClause, [source], ctx, "a predicate on")
        if isinstance(stmt, ast.UpdateStmt):
            for target in stmt.targetList or ():
                self._no_event_columns(target.val, [source], ctx, "an assignment from")
        returning = stmt.returningClause.exprs if stmt.returningClause is not None else ()
        tainted: set[str] = set()
        payload_out = False
        for target in returning:
            kind, names = self._target(target.val, [source], ctx)
            if kind == "star":
                tainted |= names
                payload_out = True
            elif kind == "column":
                tainted.add(target.name or _colref_names(target.val)[-1])
                payload_out = payload_out or _colref_names(target.val)[-1] == self.host.payload_column
        if not tainted:
            return None
        stmt.returningClause.exprs = tuple(returning) + (self._hidden_target(source, fresh=True,
                                                                             payload=payload_out),)
        return frozenset(tainted)


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
            if name == "openwop_seat.claim":
                return "openwop_seat.claim is called by the seat itself, never by a client"
    return ""


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
