"""SQLAlchemy 2 through the seat, with psycopg 3 (``postgresql+psycopg``) and asyncpg (``postgresql+asyncpg``).

Reads of the era-2 run as major 2: Core pages (the host's page statement built with select(), LIMIT bound),
``stream_results=True`` with ``yield_per`` on a Core connection (a server-side cursor: psycopg DECLAREs a named
cursor and FETCHes; asyncpg runs a cursor portal in a transaction), and the ORM with ``yield_per`` (which
streams the same way) over a class mapped onto the events table. The same code reads the seat's translated
view directly (the same columns mapped onto ``openwop_seat.events_m2``). Appends: the host's append path as
text() statements in ``engine.begin()``, payload and timestamp bound as JSONB and DateTime(timezone=True).
Checked as tests/integration/drivers.py says.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

import drivers
import pytest
from drivers import APPEND_LOCK_SQL, APPEND_SQL, PAGE_SIZE
from sqlalchemy import Column, DateTime, Integer, MetaData, Table, Text, bindparam, create_engine, select, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session, registry

DIALECTS = {"psycopg": "postgresql+psycopg", "asyncpg": "postgresql+asyncpg"}
READS = ["core-pages", "stream-results", "orm-yield-per"]


def event_table(metadata: MetaData, name: str, schema: str | None) -> Table:
    return Table(name, metadata,
                 Column("event_id", Text, primary_key=True), Column("run_id", Text), Column("sequence", Integer),
                 Column("type", Text), Column("node_id", Text), Column("payload", JSONB(none_as_null=True)),
                 Column("timestamp", DateTime(timezone=True)), Column("causation_id", Text), schema=schema)


def mapped(relation: str):
    """A table and an ORM class over `events` or over the seat's view (same columns, same class shape)."""
    schema, _, name = relation.rpartition(".")
    reg = registry()
    table = event_table(reg.metadata, name, schema or None)

    class Event:
        pass

    reg.map_imperatively(Event, table)
    return table, Event


def as_row(mapping) -> dict:
    return {k: mapping[k] for k in drivers.COLUMNS}


def statements(relation: str, run_id: str):
    table, Event = mapped(relation)
    c = table.c
    page = lambda after: (select(table).where(c.run_id == run_id, c.sequence > after)  # noqa: E731
                          .order_by(c.sequence).limit(PAGE_SIZE))
    whole = select(table).where(c.run_id == run_id).order_by(c.sequence)
    orm = select(Event).where(Event.run_id == run_id).order_by(Event.sequence).execution_options(yield_per=PAGE_SIZE)
    return page, whole, orm


def read_sync(url: str, relation: str, run_id: str, how: str) -> list[dict]:
    page, whole, orm = statements(relation, run_id)
    engine = create_engine(url)
    out: list[dict] = []
    try:
        if how == "core-pages":
            with engine.connect() as conn:
                after = -1
                while True:
                    got = [as_row(r) for r in conn.execute(page(after)).mappings()]
                    out += got
                    if len(got) < PAGE_SIZE:
                        break
                    after = got[-1]["sequence"]
        elif how == "stream-results":
            with engine.connect() as conn:
                result = conn.execution_options(stream_results=True, yield_per=PAGE_SIZE).execute(whole)
                for partition in result.mappings().partitions():
                    assert len(partition) <= PAGE_SIZE
                    out += [as_row(r) for r in partition]
        else:
            with Session(engine) as session:
                for obj in session.execute(orm).scalars():
                    out.append({k: getattr(obj, k) for k in drivers.COLUMNS})
    finally:
        engine.dispose()
    return out


async def read_async(url: str, relation: str, run_id: str, how: str) -> list[dict]:
    page, whole, orm = statements(relation, run_id)
    engine = create_async_engine(url)
    out: list[dict] = []
    try:
        if how == "core-pages":
            async with engine.connect() as conn:
                after = -1
                while True:
                    got = [as_row(r) for r in (await conn.execute(page(after))).mappings()]
                    out += got
                    if len(got) < PAGE_SIZE:
                        break
                    after = got[-1]["sequence"]
        elif how == "stream-results":
            async with engine.connect() as conn:
                result = await conn.stream(whole, execution_options={"yield_per": PAGE_SIZE})
                async for partition in result.mappings().partitions():
                    assert len(partition) <= PAGE_SIZE
                    out += [as_row(r) for r in partition]
        else:
            async with AsyncSession(engine) as session:
                async for obj in (await session.stream(orm)).scalars():
                    out.append({k: getattr(obj, k) for k in drivers.COLUMNS})
    finally:
        await engine.dispose()
    return out


def read(dialect: str, port: int, relation: str, run_id: str, how: str) -> list[dict]:
    url = f"{DIALECTS[dialect]}://postgres@127.0.0.1:{port}/postgres"
    if dialect == "asyncpg":
        return asyncio.run(read_async(url, relation, run_id, how))
    return read_sync(url, relation, run_id, how)


@pytest.fixture(scope="module")
def era2_run(pg):
    return drivers.seed_read_run(pg, "drv-sqlalchemy")


@pytest.mark.parametrize("how", READS)
@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_major2_read(pg, seat, era2_run, dialect, how):
    run_id, events = era2_run
    direct = read(dialect, pg.port, drivers.TRANSLATED_VIEW, run_id, how)
    via = read(dialect, seat.port, "events", run_id, how)
    drivers.check_read(pg, run_id, events, via, direct, f"sqlalchemy {dialect} {how}")


def _named(sql: str) -> str:
    for n, name in ((7, "causation_id"), (6, "ts"), (5, "payload"), (4, "node_id"), (3, "type"), (2, "event_id"),
                    (1, "run")):
        sql = sql.replace(f"${n}", f":{name}")
    return sql


APPEND = text(_named(APPEND_SQL)).bindparams(bindparam("payload", type_=JSONB(none_as_null=True)),
                                            bindparam("ts", type_=DateTime(timezone=True)))
LOCK = text(_named(APPEND_LOCK_SQL))


def _params(run_id: str, e: dict) -> dict:
    return {"run": run_id, "event_id": e["eventId"], "type": e["type"], "node_id": e["nodeId"],
            "payload": None if e["payload"] is None else json.loads(e["payload"]),
            "ts": datetime.fromisoformat(e["timestamp"]), "causation_id": e["causationId"]}


def append(dialect: str, port: int, run_id: str, events: list[dict]) -> list[dict]:
    url = f"{DIALECTS[dialect]}://postgres@127.0.0.1:{port}/postgres"
    out: list[dict] = []
    if dialect == "asyncpg":
        async def go():
            engine = create_async_engine(url)
            try:
                for e in events:
                    async with engine.begin() as conn:
                        await conn.execute(LOCK, {"run": run_id})
                        out.extend(as_row(r) for r in (await conn.execute(APPEND, _params(run_id, e))).mappings())
            finally:
                await engine.dispose()
        asyncio.run(go())
        return out
    engine = create_engine(url)
    try:
        for e in events:
            with engine.begin() as conn:
                conn.execute(LOCK, {"run": run_id})
                out.extend(as_row(r) for r in conn.execute(APPEND, _params(run_id, e)).mappings())
    finally:
        engine.dispose()
    return out


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_host_append(pg, seat, dialect):
    run_id = drivers.new_append_run(pg, f"drv-sqlalchemy-{dialect}")
    sent = drivers.append_events(run_id)
    drivers.check_append(pg, run_id, sent, append(dialect, seat.port, run_id, sent), f"sqlalchemy {dialect} append")
