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


@dataclass
class _Ctx:
    host: HostConfig
    major: int
    ctes: dict = field(default_factory=dict)  # CTE name -> carries event columns (hidden column added)


class Classifier:
    """Classifies statements for one reader major against one host layout, with an LRU cache."""

    def __init__(self, host: HostConfig, major: int, cache_size: int = 4096):
        from .schema import era_sql, read_check_sql

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
        self._read_check_sql = read_check_sql

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

    def mentions_events(self, sql: str) -> bool:
        return self._needle in (sql.lower() if self._fold else sql)

    # -- internals

    def _classify(self, sql: str) -> Plan:
        if not self.mentions_events(sql):
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
            length = raw.stmt_len or (len(sql.encode()) - start)
            # pglast locations are byte offsets into the UTF-8 text
            text = sql.encode()[start:start + length].decode()
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

        if not any(isinstance(n, ast.RangeVar) and self._is_events(n) for n in _walk(stmt)):
            return StatementPlan(PASS, text)
        ctx = _Ctx(self.host, self.major)
        try:
            changed = self._top(stmt, ctx)
        except Untranslatable as e:
            return StatementPlan(REFUSE, text, e.kind, e.detail)
        if not changed:
            return StatementPlan(PASS, text)
        return StatementPlan(TRANSLATE, RawStream()(stmt))

    def _is_events(self, rv) -> bool:
        if rv.relname != self._table:
            return False
        if self._schema is None:
            return rv.schemaname in (None, "public")
        return rv.schemaname in (None, self._schema)

    def _top(self, stmt, ctx: _Ctx) -> bool:
        """Analyse a top-level statement; add hidden columns in place. True when rewritten."""
        from pglast import ast

        if isinstance(stmt, ast.SelectStmt):
            return self._select(stmt, ctx, top=True)
        if isinstance(stmt, (ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)):
            return self._dml(stmt, ctx, top=True)
        if isinstance(stmt, ast.CopyStmt):
            if stmt.is_from and stmt.relation is not None:
                return False  # COPY events FROM: a write, the writer rule's business
            raise Untranslatable("COPY TO", "COPY … TO of the events table cannot be translated row by row")
        if isinstance(stmt, ast.DeclareCursorStmt):
            self._reject_event_columns(stmt.query, ctx, "cursor over the events table")
            return False
        if isinstance(stmt, (ast.ExplainStmt,)):
            return False  # returns a plan, not rows
        if isinstance(stmt, ast.PrepareStmt):
            self._reject_event_columns(stmt.query, ctx, "SQL PREPARE over the events table")
            return False
        if isinstance(stmt, (ast.ViewStmt, ast.CreateTableAsStmt)):
            self._reject_event_columns(stmt.query, ctx, "view or table created from event columns")
            return False
        if isinstance(stmt, ast.RuleStmt):
            raise Untranslatable("rule on the events table", "rules on the events table are not translated")
        return False  # DDL and the rest: no rows come back

    def _reject_event_columns(self, query, ctx: _Ctx, kind: str) -> None:
        """Refuse when event type/payload flow anywhere in ``query``."""
        if query is None:
            return
        if self._touches_event_columns(query):
            raise Untranslatable(kind, f"{kind}: event type/payload would reach the reader untranslated")

    def _touches_event_columns(self, node) -> bool:
        from pglast import ast

        has_events = any(isinstance(n, ast.RangeVar) and self._is_events(n) for n in _walk(node))
        if not has_events:
            return False
        for n in _walk(node):
            if isinstance(n, ast.ColumnRef):
                names = _colref_names(n)
                if names[-1] in ("*", self.host.type_column, "payload") or names == [self._table]:
                    return True
        return False

    # ---- SELECT

    def _select(self, sel, ctx: _Ctx, top: bool) -> bool:
        """Analyse one SELECT level; returns True when it outputs event columns (hidden column added)."""
        from pglast import ast

        from pglast.enums import SetOperation

        if sel.op != SetOperation.SETOP_NONE:
            if self._touches_event_columns(sel):
                raise Untranslatable("set operation", "UNION/INTERSECT/EXCEPT over event type/payload columns")
            return False
        if sel.withClause is not None:
            self._with(sel.withClause, ctx)
        if sel.valuesLists:
            return False
        sources: list[_Source] = []
        for item in sel.fromClause or ():
            self._from_item(item, ctx, sources)
        # Everything but the target list must not look at type/payload.
        for clause, what in ((sel.whereClause, "a predicate on"), (sel.groupClause, "GROUP BY on"),
                             (sel.havingClause, "HAVING on"), (sel.sortClause, "ORDER BY on"),
                             (sel.distinctClause, "DISTINCT ON"), (sel.windowClause, "a window over"),
                             (sel.limitCount, "LIMIT over"), (sel.limitOffset, "OFFSET over")):
            self._no_event_columns(clause, sources, ctx, what)
        if sel.lockingClause and sources:
            pass  # FOR UPDATE of event rows reads them like any SELECT
        carries = False
        has_star_over_source = False
        for target in sel.targetList or ():
            kind = self._target(target.val, sources, ctx)
            if kind == "column":
                carries = True
            elif kind == "star":
                carries = True
                has_star_over_source = True
        if not carries:
            return False
        if sel.distinctClause is not None and len(sel.distinctClause) >= 1:
            raise Untranslatable("DISTINCT", "DISTINCT over event type/payload columns")
        if sel.groupClause:
            raise Untranslatable("GROUP BY", "GROUP BY with event type/payload columns in the result")
        if len(sources) != 1:
            raise Untranslatable("join of event sources",
                                 "a result joining the events table with itself or with another event source")
        source = sources[0]
        if source.direct or not has_star_over_source:
            sel.targetList = tuple(sel.targetList) + (self._hidden_target(source),)
        return True

    def _with(self, with_clause, ctx: _Ctx) -> None:
        from pglast import ast

        for cte in with_clause.ctes or ():
            q = cte.ctequery
            if with_clause.recursive and self._touches_event_columns(q):
                raise Untranslatable("recursive CTE", "a recursive CTE over event columns")
            if isinstance(q, ast.SelectStmt):
                ctx.ctes[cte.ctename] = self._select(q, ctx, top=False)
            elif isinstance(q, (ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)):
                ctx.ctes[cte.ctename] = self._dml(q, ctx, top=False)
            else:
                ctx.ctes[cte.ctename] = False

    def _from_item(self, item, ctx: _Ctx, sources: list) -> None:
        from pglast import ast

        if isinstance(item, ast.RangeVar):
            if self._is_events(item):
                sources.append(_Source(item.alias.aliasname if item.alias else item.relname, True))
            elif item.schemaname is None and ctx.ctes.get(item.relname):
                sources.append(_Source(item.alias.aliasname if item.alias else item.relname, False))
        elif isinstance(item, ast.JoinExpr):
            self._from_item(item.larg, ctx, sources)
            self._from_item(item.rarg, ctx, sources)
            self._no_event_columns(item.quals, sources, ctx, "a join condition on")
        elif isinstance(item, ast.RangeSubselect):
            if self._select(item.subquery, ctx, top=False):
                if item.alias is None:
                    raise Untranslatable("subquery", "a subquery over event columns needs an alias")
                sources.append(_Source(item.alias.aliasname, False))
        elif isinstance(item, ast.RangeFunction):
            if self._touches_event_columns(item):
                raise Untranslatable("function in FROM", "a function in FROM over event columns")
        else:
            if self._touches_event_columns(item):
                raise Untranslatable("FROM item", f"{type(item).__name__} over event columns")

    def _no_event_columns(self, clause, sources: list, ctx: _Ctx, what: str) -> None:
        """Refuse when ``clause`` refers to an event type/payload column (or reads them in a sublink)."""
        if clause is None:
            return
        from pglast import ast

        for n in _walk(clause):
            if isinstance(n, ast.ColumnRef) and sources and self._refers_to_event_column(n, sources):
                raise Untranslatable(f"{what} event columns",
                                     f"{what} event {_colref_names(n)[-1]} is not translated")
            if isinstance(n, ast.SubLink) and self._touches_event_columns(n.subselect):
                raise Untranslatable(f"{what} event columns", f"{what} event columns inside a subquery")

    def _refers_to_event_column(self, ref, sources: list) -> bool:
        names = _colref_names(ref)
        col = names[-1]
        names_of_sources = {s.name for s in sources}
        if len(names) == 1:
            # An unqualified name: type/payload, or a whole-row reference to an event source.
            return col in (self.host.type_column, "payload") or col in names_of_sources
        qualifier = names[-2]
        if qualifier not in names_of_sources:
            return False
        return col in (self.host.type_column, "payload", "*")

    def _target(self, val, sources: list, ctx: _Ctx) -> str:
        """'column'/'star' when the target outputs event columns as they are, '' when none; refuse expressions."""
        from pglast import ast

        if not sources:
            for n in _walk(val):
                if isinstance(n, ast.SubLink) and self._touches_event_columns(n.subselect):
                    raise Untranslatable("subquery over event columns",
                                         "a scalar subquery returning event type/payload")
            return ""
        if isinstance(val, ast.ColumnRef):
            names = _colref_names(val)
            if names[-1] == "*":
                if len(names) == 1 or names[-2] in {s.name for s in sources}:
                    return "star"
                return ""
            if self._refers_to_event_column(val, sources):
                if len(names) == 1 and names[0] in {s.name for s in sources}:
                    raise Untranslatable("whole-row reference", "a whole-row reference to an event row")
                return "column"
            return ""
        for n in _walk(val):
            if isinstance(n, ast.ColumnRef) and self._refers_to_event_column(n, sources):
                raise Untranslatable("expression over event columns",
                                     f"an expression over event {_colref_names(n)[-1]} is not translated")
            if isinstance(n, ast.SubLink) and self._touches_event_columns(n.subselect):
                raise Untranslatable("subquery over event columns", "a scalar subquery returning event columns")
        return ""

    def _hidden_target(self, source: _Source):
        from pglast import ast, parse_sql

        if source.direct:
            q = _quote(source.name)
            era = self._era_sql(self.host, f"{q}.{_quote(self.host.run_id_column)}")
            expr = self._read_check_sql(self.major, era, f"{q}.{_quote(self.host.type_column)}",
                                        f"{q}.{_quote(self.host.run_id_column)}", f"{q}.sequence")
        else:
            expr = f"{_quote(source.name)}.{HIDDEN}"
        node = parse_sql(f"SELECT {expr}")[0].stmt.targetList[0].val
        return ast.ResTarget(name=HIDDEN, val=node)

    # ---- INSERT/UPDATE/DELETE

    def _dml(self, stmt, ctx: _Ctx, top: bool) -> bool:
        from pglast import ast

        if stmt.withClause is not None:
            self._with(stmt.withClause, ctx)
        target_is_events = stmt.relation is not None and self._is_events(stmt.relation)
        if isinstance(stmt, ast.InsertStmt):
            if stmt.selectStmt is not None and not target_is_events:
                self._reject_event_columns(stmt.selectStmt, ctx, "copy of event columns into another table")
            elif stmt.selectStmt is not None:
                self._reject_event_columns_from_select(stmt.selectStmt, ctx)
        else:
            if not target_is_events:
                for clause in (getattr(stmt, "whereClause", None), getattr(stmt, "targetList", None)):
                    self._reject_event_columns(clause, ctx, "write derived from event columns")
        if not target_is_events:
            return False
        name = stmt.relation.alias.aliasname if stmt.relation.alias else stmt.relation.relname
        source = _Source(name, True)
        if isinstance(stmt, (ast.UpdateStmt, ast.DeleteStmt)):
            self._no_event_columns(stmt.whereClause, [source], ctx, "a predicate on")
        returning = stmt.returningClause.exprs if stmt.returningClause is not None else ()
        if not returning:
            return False
        carries = False
        for target in returning:
            if self._target(target.val, [source], ctx):
                carries = True
        if not carries:
            return False
        stmt.returningClause.exprs = tuple(returning) + (self._hidden_target(source),)
        return True

    def _reject_event_columns_from_select(self, select, ctx: _Ctx) -> None:
        """INSERT INTO events SELECT … FROM events: copying stored spellings into a run is not translated."""
        from pglast import ast

        reads_events = any(isinstance(n, ast.RangeVar) and self._is_events(n) for n in _walk(select))
        if reads_events and self._touches_event_columns(select):
            raise Untranslatable("copy of event rows", "INSERT … SELECT of event type/payload is not translated")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
