"""What a seat learns from the host database at start (and re-reads while it runs): the events table, the
derived views and risky functions, the classifiers of both majors; and the view of the listener that sessions and
the metrics collector are given (SeatView), so neither imports the listener."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from proxy.config import Config, ConfigError
from proxy.db import relations
from proxy.readpath.classify import DYNAMIC_SQL_WORDS, DYNAMIC_SQL_WORDS_NET
from proxy.readpath.read_path import EventColumns, RelationWatch

log = logging.getLogger("openwop_seat.server")

if TYPE_CHECKING:
    import ssl

    from proxy.readpath.read_path import ReadPath
    from proxy.stats import Stats


class SeatView(Protocol):
    """What a session and the metrics collector may use of the listener that owns them (one way: they are given
    it, they never import it)."""

    config: Config
    stats: Stats
    sessions: set
    read_context: ReadContext | None
    client_ssl_context: ssl.SSLContext | None
    upstream_ssl_context: ssl.SSLContext | None
    claim_secret: str | None
    claim_salt: str | None  # the claim secret's salt, once a challenge returned it (one-round-trip claims, ADR 0013)
    claim_owners: dict  # user -> (whether it owns openwop_seat, monotonic time the claim found it)
    upstream_pooler: bool  # a claim saw a pooler between the seat and PostgreSQL: raw sessions are claimed too
    pool: Any  # proxy.serve.pool.Pool: the pooled server connections ([pool], ADR 0016)
    writer_rule_verdict: str  # the last runtime check: why the writer rule is not in force, or ""

    @property
    def writer_rule_broken(self) -> str: ...  # the verdict, or at first boot that no trigger is installed yet
    paused: bool  # SIGUSR1: not accepting new connections until SIGUSR2

    @property
    def first_boot(self) -> str: ...  # why the seat's rules are not in force in the host database yet, or ""

    def read_path_for(self, params: dict[str, str], major: int | str) -> ReadPath | None: ...

    def on_host_database(self, params: dict[str, str]) -> bool: ...

    async def writer_rule_refusal(self) -> str: ...

    def session_ended(self, session) -> None: ...  # called soon after a session closed

    async def readiness(self) -> tuple[bool, str]: ...



RELATION_CHECK_SECONDS = 2.0


class CatalogConnection:
    """The one connection a seat process keeps to the host database for its own checks: the catalog check every
    RELATION_CHECK_SECONDS, the writer rule's check every host.check_interval, /readyz and the writer counters on
    /metrics. Opened at first use, used by one check at a time, and opened again after it failed (a check that
    fails on it drops it: its state is not known then); a new host.dsn (reload) gets a new one."""

    def __init__(self, view: SeatView):
        import asyncio

        self._view = view
        self._conn = None
        self._dsn: str | None = None
        self._lock = asyncio.Lock()
        self.opened = 0  # connections opened so far (a test and the logs read it)

    async def run(self, check, timeout: float | None = None):
        """``await check(conn)`` on the connection, within ``timeout`` (default: proxy.connect_timeout, for the
        connection and again for the check); its exception, if any, is raised after the connection is dropped."""
        import asyncio

        from proxy.db.connect import connect
        from proxy.db.layout import SchemaError

        config = self._view.config
        timeout = config.connect_timeout if timeout is None else timeout
        async with self._lock:
            if self._conn is not None and (self._conn.is_closed() or self._dsn != config.host.dsn):
                await self._drop()
            for attempt in (1, 2):
                reused = self._conn is not None
                if self._conn is None:
                    self._conn = await asyncio.wait_for(connect(config.host.dsn), config.connect_timeout)
                    self._dsn = config.host.dsn
                    self.opened += 1
                try:
                    return await asyncio.wait_for(check(self._conn), timeout)
                except SchemaError:
                    raise  # the database answered: the connection is fine
                except BaseException:
                    closed = self._conn.is_closed()
                    await self._drop()
                    # the kept connection was closed under it (idle_session_timeout, a terminated backend, a restart):
                    # once more, on a new one
                    if not (reused and closed and attempt == 1):
                        raise

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    async def close(self) -> None:
        async with self._lock:
            await self._drop()


@dataclass
class ReadContext:
    """What every translated session of this seat shares: artifacts, classifiers, the events table."""

    database: str
    events: EventColumns | None  # None at first boot, until the events table exists
    classifiers: dict
    artifacts: object
    watch: RelationWatch | None = None  # kept fresh by SeatServer._watch_relations
    # First boot (docs/operations.md#first-boot): why the seat's rules are not in force yet ("" once they are).
    # Sessions on the host database are not claimed and their classifiers refuse every statement that reads or
    # writes the events table's rows; the listener re-reads the database until `migrate` has run.
    first_boot: str = ""
    # ADR 0019: the classifiers of the sessions of a role the net does not hold (HELD_ROLES): they refuse dynamic SQL
    # as before; built beside ``classifiers`` when None
    strict: dict | None = None

    def __post_init__(self) -> None:
        if self.watch is None:
            self.watch = RelationWatch(self.events)
        if self.strict is None:
            self.strict = {major: c.strict_twin() for major, c in self.classifiers.items()}

    def all_classifiers(self):
        """Every classifier, the strict ones too: what the function watch updates."""
        return [*self.classifiers.values(), *self.strict.values()]

    def summed(self, attr: str) -> list[tuple[int, int]]:
        """(major, ``attr`` of its classifier and of its strict twin added up), by major: the metrics' and the admin
        console's figures per major."""
        return [(major, getattr(c, attr) + getattr(self.strict[major], attr))
                for major, c in sorted(self.classifiers.items())]


# Views and materialized views that read events.type, directly or through other views: a result
# with their columns cannot be translated (no era), so the read path refuses it.
DERIVED_RELATIONS = """
WITH RECURSIVE derived(oid) AS (
    SELECT r.ev_class FROM pg_catalog.pg_depend d
    JOIN pg_catalog.pg_rewrite r ON d.classid = 'pg_catalog.pg_rewrite'::regclass AND d.objid = r.oid
    WHERE d.refclassid = 'pg_catalog.pg_class'::regclass AND d.refobjid = $1 AND d.refobjsubid = $2
      AND r.ev_class <> $1
    UNION
    SELECT r.ev_class FROM derived
    JOIN pg_catalog.pg_depend d ON d.refclassid = 'pg_catalog.pg_class'::regclass AND d.refobjid = derived.oid
    JOIN pg_catalog.pg_rewrite r ON d.classid = 'pg_catalog.pg_rewrite'::regclass AND d.objid = r.oid
    WHERE r.ev_class <> derived.oid
)
SELECT oid FROM derived
"""


# Functions defined in the database outside the system schemas, the seat's own and extensions, trigger
# functions excepted: those that could read the events table are refused to translated sessions
# (risky_functions, proxy.readpath.classify.Classifier.set_functions).
DATABASE_FUNCTIONS = """
SELECT pg_catalog.lower(p.proname) AS name, l.lanname AS language, COALESCE(p.prosrc, '') AS body,
       p.pronargs AS nargs, p.pronargdefaults AS ndefaults, p.provariadic OPERATOR(pg_catalog.<>) 0 AS variadic,
       p.prosecdef AS definer
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
JOIN pg_catalog.pg_language l ON l.oid = p.prolang
WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'openwop_seat')
  AND n.nspname !~ '^pg_(toast|temp)'
  AND p.prorettype NOT IN ('pg_catalog.trigger'::pg_catalog.regtype, 'pg_catalog.event_trigger'::pg_catalog.regtype)
  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
                  AND d.objid = p.oid AND d.deptype = 'e')
"""


# ADR 0019: code the net cannot hold, which dynamic SQL could reach by a name it builds: a SECURITY DEFINER function
# owned by a role that reads past row-level security (a superuser, BYPASSRLS, a member of the owner of openwop_seat,
# whose policy is true) outside the seat's schema, a function in an untrusted language
# (it can open a connection of its own), an extension that opens another session (dblink, postgres_fdw). While the
# database holds none, a translated session's DO blocks and functions may run dynamic SQL (EXECUTE): whatever it
# reads of the stored rows, or returns of a new row, meets the net.
PAST_NET = """
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_proc p
    JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
    JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) p.proowner
    JOIN pg_catalog.pg_language l ON l.oid OPERATOR(pg_catalog.=) p.prolang
    WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'openwop_seat')
      AND ((p.prosecdef AND (r.rolsuper OR r.rolbypassrls
                             OR pg_catalog.pg_has_role(p.proowner, (SELECT s.nspowner FROM pg_catalog.pg_namespace s
                                                                    WHERE s.nspname = 'openwop_seat'), 'MEMBER')))
           OR (NOT l.lanpltrusted AND l.lanname NOT IN ('c', 'internal', 'sql')))
) OR EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname IN ('dblink', 'postgres_fdw'))
"""


# ADR 0019: the login roles the net holds: none of them is, or may become (SET ROLE), a superuser or a BYPASSRLS
# role, and none is a member of the owner of openwop_seat (the net's policy for that owner, true, applies to its
# members). Only their sessions may run dynamic SQL (the net does not hold the others); a role created since the last
# read is not among them until the next one.
HELD_ROLES = """
SELECT r.rolname FROM pg_catalog.pg_roles r
WHERE r.rolcanlogin AND NOT r.rolsuper AND NOT r.rolbypassrls
  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles b WHERE (b.rolsuper OR b.rolbypassrls)
                  AND pg_catalog.pg_has_role(r.oid, b.oid, 'MEMBER'))
  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace s WHERE s.nspname = 'openwop_seat'
                  AND pg_catalog.pg_has_role(r.oid, s.nspowner, 'MEMBER'))
"""


# Issue 23: the relations over the events table (views and materialized views, directly or through other views; the
# seat's own are left out, and are not followed) with what decides whether they read past the net: a view that is not
# security_invoker runs its query with its owner's rights, so row-level security does not apply to it when its owner
# reads past it (a superuser, BYPASSRLS, a member of the owner of openwop_seat, whose policy is true), and a
# materialized view holds rows its owner read when it was refreshed. One row per relation and per relation it reads
# (``via``: 0 for the events table itself); past_net_relations() decides. Any dependency on the table counts, not
# only one on its type or payload column: a whole-row reference (``to_jsonb(e)``, ``SELECT e``) records none.
PAST_NET_CANDIDATES = """
WITH RECURSIVE seat AS (
    SELECT s.oid, s.nspowner FROM pg_catalog.pg_namespace s WHERE s.nspname = 'openwop_seat'
), derived(oid, via) AS (
    SELECT DISTINCT r.ev_class, 0::pg_catalog.oid FROM pg_catalog.pg_depend d
    JOIN pg_catalog.pg_rewrite r ON d.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass AND d.objid = r.oid
    JOIN pg_catalog.pg_class c ON c.oid = r.ev_class
    WHERE d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.refobjid = pg_catalog.to_regclass($1)
      AND r.ev_class OPERATOR(pg_catalog.<>) d.refobjid
      AND c.relnamespace IS DISTINCT FROM (SELECT oid FROM seat)
    UNION
    SELECT r.ev_class, derived.oid FROM derived
    JOIN pg_catalog.pg_depend d ON d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass
         AND d.refobjid = derived.oid
    JOIN pg_catalog.pg_rewrite r ON d.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass AND d.objid = r.oid
    JOIN pg_catalog.pg_class c ON c.oid = r.ev_class
    WHERE r.ev_class OPERATOR(pg_catalog.<>) derived.oid AND c.relnamespace IS DISTINCT FROM (SELECT oid FROM seat)
)
SELECT d.oid::pg_catalog.int8 AS oid, d.via::pg_catalog.int8 AS via, n.nspname::text AS schema,
       c.relname::text AS name, c.relkind::text AS kind, o.rolname::text AS owner,
       (o.rolsuper OR o.rolbypassrls
        OR COALESCE(pg_catalog.pg_has_role(c.relowner, (SELECT nspowner FROM seat), 'MEMBER'), false))
           AS owner_past_net,
       COALESCE((SELECT pg_catalog.lower(x.option_value) IN ('true', 'on', '1', 'yes', 't', 'y')
                 FROM pg_catalog.pg_options_to_table(c.reloptions) x
                 WHERE x.option_name = 'security_invoker'), false) AS invoker
FROM derived d
JOIN pg_catalog.pg_class c ON c.oid = d.oid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_roles o ON o.oid = c.relowner
"""


@dataclass(frozen=True)
class PastNetRelation:
    """A relation over the events table that reads past the net (past_net_relations): a translated session may not
    name it (proxy.readpath.classify.Classifier.set_functions)."""

    schema: str
    name: str
    kind: str  # "v" view, "m" materialized view
    owner: str  # its owner, or the owner of the relation it reads past the net through
    why: str  # one sentence: why it reads past the net

    def qualified(self) -> str:
        from proxy.db.sql import quote_ident

        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"


def past_net_relations(rows) -> frozenset[PastNetRelation]:
    """The relations of PAST_NET_CANDIDATES' rows that read the stored rows past the net: a view that is not
    security_invoker, or a materialized view, owned by a role the net does not hold; and every relation that reads
    one of those (through any chain of views, whoever owns them: the one past the net still runs as its owner)."""
    rels: dict = {}
    reads: dict = {}
    for r in rows:
        rels[r["oid"]] = r
        reads.setdefault(r["oid"], set()).add(r["via"])

    def own(r) -> str:
        if not r["owner_past_net"]:
            return ""
        if r["kind"] == "m":
            return (f"a materialized view owned by {r['owner']}, a role that reads past row-level security: its rows "
                    f"are the events table's stored rows as its owner read them")
        if r["kind"] == "v" and not r["invoker"]:
            return (f"a view owned by {r['owner']}, a role that reads past row-level security: it reads the events "
                    f"table with its owner's rights")
        return ""

    why = {oid: own(r) for oid, r in rels.items()}
    origin = {oid: rels[oid]["owner"] for oid, w in why.items() if w}
    changed = True
    while changed:  # a fixpoint over the chains of views
        changed = False
        for oid in rels:
            if why[oid]:
                continue
            through = next((v for v in sorted(reads[oid]) if why.get(v)), None)
            if through is not None:
                t = rels[through]
                why[oid] = (f"it reads {t['schema']}.{t['name']}, which reads the events table past row-level "
                            f"security (owned by {origin[through]})")
                origin[oid] = origin[through]
                changed = True
    return frozenset(PastNetRelation(r["schema"], r["name"], r["kind"], origin[oid], why[oid])
                     for oid, r in rels.items() if why[oid])


class RiskyFunctions(frozenset):
    """The names of the risky functions (a frozenset, what the classifier's prefilter tests), and ``arities``: for
    each name, the numbers of arguments (lowest, highest or None for VARIADIC) its risky overloads take, so that a
    call PostgreSQL cannot resolve to one of them (``lower(x)`` beside a risky ``public.lower(text, int)``) is not
    refused (issue 23)."""

    def __new__(cls, names=(), arities=None, past_net: bool = True, held_roles=frozenset(), relations=frozenset()):
        self = super().__new__(cls, names)
        # past_net_relations(): relations a translated session may not name, nor a function it calls name (issue 23)
        self.relations = frozenset(relations)
        self.arities = dict(arities or {})
        self.past_net = past_net  # the database holds code the net cannot hold (PAST_NET); unknown: True
        self.held_roles = frozenset(held_roles)  # HELD_ROLES; unknown: none
        self.strict = None  # the set for a role the net does not hold, where it differs (database_functions)
        self.arbiters = None  # ARBITERS: the events table's constraints an ON CONFLICT ON CONSTRAINT may name
        return self


def risky_functions(rows, table: str, past_net: bool = True, held_roles=frozenset(),
                    relations=frozenset()) -> RiskyFunctions:
    """The names of the functions whose body names the events table or a relation that reads it past the net
    (``relations``: past_net_relations()), runs dynamic SQL, is not SQL or plpgsql, or calls (by name) another such
    function: a fixpoint over the bodies, conservative; with the argument counts of the overloads that are risky
    themselves."""
    table = table.rpartition(".")[2].lower()
    names = tuple({r.name.lower() for r in relations})
    bodies = {}
    for r in rows:
        nargs = r.get("nargs")
        arity = (0, None) if nargs is None else \
            (nargs - (r.get("ndefaults") or 0), None if r.get("variadic") else nargs)
        bodies.setdefault(r["name"], []).append((r["language"], r["body"].lower(), arity, r.get("definer", True)))

    def own(lang: str, body: str, definer: bool) -> bool:
        # ADR 0019: EXECUTE in a function run with the caller's rights meets the net (what it reads of the stored
        # rows, or returns of a new row); one run with its owner's may not (the owner may read past the net)
        words = DYNAMIC_SQL_WORDS if definer or past_net else DYNAMIC_SQL_WORDS_NET
        return (lang not in ("sql", "plpgsql") or table in body or any(w in body for w in words)
                or any(n in body for n in names))

    risky = {name for name, defs in bodies.items() if any(own(lang, body, d) for lang, body, _, d in defs)}
    while True:
        more = {name for name, defs in bodies.items() if name not in risky
                and any(f in body for _, body, _, _ in defs for f in risky)}
        if not more:
            break
        risky |= more
    arities = {name: tuple(sorted({arity for lang, body, arity, d in bodies[name]
                                   if own(lang, body, d) or any(f in body for f in risky)},
                                  key=lambda a: (a[0], -1 if a[1] is None else a[1])))
               for name in risky}
    return RiskyFunctions(risky, arities, past_net, held_roles, relations)


# The events table's unique and primary key constraints that can arbitrate an ON CONFLICT (not deferrable, on
# plain columns): name -> its columns in key order. ``ON CONFLICT ON CONSTRAINT name`` names one; the seat's insert
# view (ADR 0019) has no constraint of its own, so the rewrite through it names the columns instead.
ARBITERS = """
SELECT con.conname::text AS name, pg_catalog.array_agg(a.attname::text ORDER BY k.ord) AS columns
FROM pg_catalog.pg_constraint con
CROSS JOIN LATERAL pg_catalog.unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_catalog.pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum
WHERE con.conrelid = pg_catalog.to_regclass($1) AND con.contype IN ('p', 'u') AND NOT con.condeferrable
GROUP BY con.conname
"""


async def database_functions(conn, table: str) -> RiskyFunctions:
    from proxy.db.sql import quote_qualified

    # issue 23: a relation over the events table that reads past the net is code the net cannot hold, as a
    # SECURITY DEFINER function is: dynamic SQL could name it by a name it builds (PAST_NET); and a translated session
    # may not name it at all (the classifier's refusal)
    relations = past_net_relations(await conn.fetch(PAST_NET_CANDIDATES, quote_qualified(table)))
    past_net = bool(relations) or bool(await conn.fetchval(PAST_NET))
    held = frozenset(r[0] for r in await conn.fetch(HELD_ROLES))
    rows = await conn.fetch(DATABASE_FUNCTIONS)
    found = risky_functions(rows, table, past_net, held, relations)
    # for the sessions of a role the net does not hold: EXECUTE counts
    found.strict = risky_functions(rows, table, relations=relations)
    found.arbiters = found.strict.arbiters = {
        r["name"]: tuple(r["columns"]) for r in await conn.fetch(ARBITERS, quote_qualified(table))}
    return found


async def relation_state(conn, host, table_oid: int, type_attnum: int, payload_attnum: int | None):
    """(views over events.type, views over events.payload, why the translated relations are stale): what a
    seat learns at start and re-reads while it runs. The seat's own views are not counted as leaks."""
    seat_views = {r["oid"] for r in await conn.fetch(
        "SELECT c.oid FROM pg_catalog.pg_class c WHERE c.relnamespace = 'openwop_seat'::regnamespace")}
    derived = [r["oid"] for r in await conn.fetch(DERIVED_RELATIONS, table_oid, type_attnum)]
    derived_payload = []
    if payload_attnum is not None:
        derived_payload = [r["oid"] for r in await conn.fetch(DERIVED_RELATIONS, table_oid, payload_attnum)]
    problems = await relations.relation_problems(conn, host)
    return (frozenset(o for o in derived if o not in seat_views),
            frozenset(o for o in derived_payload if o not in seat_views), "; ".join(problems))


async def load_read_context(config: Config):
    """Check the seat's schema in the host database and learn where the events table is."""
    from proxy.artifacts.load import load_artifacts
    from proxy.db.connect import connect
    from proxy.db.layout import SchemaError
    from proxy.db.migrate import verify
    from proxy.db.sql import quote_qualified
    from proxy.readpath.classify import Classifier

    host = config.host
    if host.dsn is None:
        raise ConfigError("host.dsn: required to translate reads (set it, or make every major \"raw\")")
    artifacts = load_artifacts()
    conn = await connect(host.dsn)
    try:
        database = await conn.fetchval("SELECT current_database()")
        if await conn.fetchval("SELECT pg_catalog.to_regclass($1) IS NULL", quote_qualified(host.events_table)):
            # First boot: the host has not created its tables yet. Nothing to translate; nothing may be read or
            # written through the events table until migrate has run (the listener looks again every 2 s).
            functions = await database_functions(conn, host.events_table)
            classifiers = {major: Classifier(host, major, cache_bytes=config.plan_cache_bytes,
                                             max_statement_bytes=config.max_statement_bytes, first_boot=True)
                           for major in (1, 2)}
            ctx = ReadContext(database, None, classifiers, artifacts,
                              first_boot=f"the events table {host.events_table!r} does not exist yet")
            for classifier in ctx.all_classifiers():
                classifier.set_functions(functions)
            return ctx
        await verify(conn, config, artifacts)
        row = await conn.fetchrow(
            "SELECT c.oid, a.attnum FROM pg_catalog.pg_class c JOIN pg_catalog.pg_attribute a "
            "ON a.attrelid = c.oid WHERE c.oid = pg_catalog.to_regclass($1) AND a.attname = $2 "
            "AND NOT a.attisdropped", quote_qualified(host.events_table), host.type_column)
        columns = {}
        for table in (host.events_table, host.runs_table):
            columns[table] = {r["attname"]: r["attnum"] for r in await conn.fetch(
                "SELECT a.attname, a.attnum FROM pg_catalog.pg_attribute a WHERE a.attrelid = "
                "pg_catalog.to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped", quote_qualified(table))}
        if row is not None:
            payload_attnum = columns[host.events_table].get(host.payload_column)
            derived, derived_payload, problems = await relation_state(conn, host, row["oid"], row["attnum"],
                                                                      payload_attnum)
            ordered = [r["attname"] for r in await conn.fetch(
                "SELECT a.attname FROM pg_catalog.pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 "
                "AND NOT a.attisdropped ORDER BY a.attnum", row["oid"])]
            functions = await database_functions(conn, host.events_table)
            # the v2 store's per-run function (ADR 0015 decision 7): what a run's page reads, where migrate made it
            run_function = await conn.fetchval(
                "SELECT pg_catalog.to_regproc('openwop_seat.events_m2_run') IS NOT NULL")
            # and its live arm alone, what a run's page reads with the store's (ADR 0015, page plans)
            page_function = await conn.fetchval(
                "SELECT pg_catalog.to_regproc('openwop_seat.events_m2_run_live') IS NOT NULL")
            # and an era-3 run's rows as stored: a page's fast twin (ADR 0024), unless host.fast_page is off
            fast_page = host.fast_page and await conn.fetchval(
                "SELECT pg_catalog.to_regproc('openwop_seat.events_m2_run_era3') IS NOT NULL")
    finally:
        await conn.close()
    if row is None:
        raise SchemaError(
            f"host.events_table {host.events_table!r} with column {host.type_column!r} not found in database "
            f"{database!r}")
    if problems:
        raise SchemaError(f"the seat's translated relations do not match the events table: {problems}: "
                                 f"run openwop-seat migrate")
    host, absent = resolve_columns(host, columns[host.events_table], columns[host.runs_table])
    classifiers = {major: Classifier(host, major, tuple(ordered), cache_bytes=config.plan_cache_bytes,
                                     max_statement_bytes=config.max_statement_bytes, run_function=run_function,
                                     page_function=page_function, fast_page=fast_page)
                   for major in (1, 2)}
    events = EventColumns(row["oid"], row["attnum"], derived, payload_attnum, derived_payload)
    for key in absent:
        log.warning("host.%s = %r: no such column; the payload projection goes without it "
                    "(see docs/configuration.md#host%s)", key, getattr(config.host, key), key)
    ctx = ReadContext(database, events, classifiers, artifacts)
    for classifier in ctx.all_classifiers():
        classifier.set_functions(functions)
    return ctx


async def first_boot_events(conn, host) -> EventColumns | None:
    """At first boot, once the host created the events table but before migrate: where its columns are and the
    views over them (the leak check), or None while it does not exist."""
    from proxy.db.sql import quote_qualified

    row = await conn.fetchrow(
        "SELECT c.oid, a.attnum, (SELECT p.attnum FROM pg_catalog.pg_attribute p WHERE p.attrelid = c.oid "
        "AND p.attname = $3 AND NOT p.attisdropped) AS payload FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid "
        "WHERE c.oid = pg_catalog.to_regclass($1) AND a.attname = $2 AND NOT a.attisdropped",
        quote_qualified(host.events_table), host.type_column, host.payload_column)
    if row is None:
        return None
    derived = frozenset(r["oid"] for r in await conn.fetch(DERIVED_RELATIONS, row["oid"], row["attnum"]))
    derived_payload = frozenset()
    if row["payload"] is not None:
        derived_payload = frozenset(r["oid"] for r in await conn.fetch(DERIVED_RELATIONS, row["oid"], row["payload"]))
    return EventColumns(row["oid"], row["attnum"], derived, row["payload"] or 0, derived_payload)


def resolve_columns(host, event_columns: dict, run_columns: dict):
    """``host`` with the optional projection columns the tables do not have set to None, and their keys."""
    from dataclasses import replace

    if host.payload_column not in event_columns:
        from proxy.db.layout import SchemaError
        raise SchemaError(f"host.payload_column {host.payload_column!r}: no such column in "
                                 f"{host.events_table!r}")
    absent = [k for k, cols in (("event_id_column", event_columns), ("node_id_column", event_columns),
                                ("tenant_column", run_columns)) if getattr(host, k) and getattr(host, k) not in cols]
    return replace(host, **{k: None for k in absent}), absent


async def check_claim_secret(config: Config, secret: str) -> None:
    """Fail at start, not at every connection, when the secret is not the one migrate installed."""
    import asyncpg

    from proxy.db.claims import claim_async
    from proxy.db.connect import connect
    from proxy.db.layout import SchemaError

    conn = await connect(config.host.dsn)
    try:
        await claim_async(conn, secret, 1)
    except asyncpg.PostgresError as e:
        raise SchemaError(f"the claim secret cannot claim sessions in the host database: {e} "
                                 "(is it the secret `openwop-seat migrate` installed?)") from None
    finally:
        await conn.close()
