"""Django ORM reads and appends for tests/integration/test_drivers_django.py (its own process: Django's settings
are configured once per process, here in code).

    python django_driver.py < request.json

The request: {"mode": "read" | "append" | "lock", "port": n, "relation": "events" | "openwop_seat.events_m2",
"runId": ..., "pageSize": n, "how": "queryset-pages" | "iterator", "options": {...} (the database's
OPTIONS, e.g. server_side_binding), "events": [...]}.

read: an unmanaged model mapped onto the relation (``managed = False``), read page after page with a sliced
queryset (``filter(run_id=…, sequence__gt=…).order_by('sequence')[:n]``), or with ``QuerySet.iterator
(chunk_size=n)``, which on PostgreSQL reads through a server-side cursor (DECLARE … WITH HOLD, FETCH n).
append: the host's append path in ``transaction.atomic()`` with ``connection.cursor()``: the advisory lock,
then the next-sequence CTE INSERT … RETURNING * (payload as JSON text, timestamp as an aware datetime).

lock: ``select_for_update(**lock)`` in ``transaction.atomic()``; while it is open, a connection straight to
PostgreSQL (``probePort``) tries the first row ``FOR UPDATE NOWAIT``: ``held`` says it could not.

Output: {"rows": [...], "held": …}, each row the events columns (timestamp ISO 8601, payload parsed).
"""

from __future__ import annotations

import json
import sys
from datetime import datetime

import django
from django.conf import settings

COLUMNS = ["event_id", "run_id", "sequence", "type", "node_id", "payload", "timestamp", "causation_id"]
APPEND_SQL = """WITH next AS (SELECT COALESCE(MAX(sequence),0)+1 AS seq FROM events WHERE run_id = %s)
INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id)
SELECT %s, %s, next.seq, %s, %s, %s, %s, %s FROM next RETURNING *"""


def main() -> None:
    req = json.load(sys.stdin)
    settings.configure(
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "postgres", "USER": "postgres",
                               "HOST": "127.0.0.1", "PORT": str(req["port"]), "OPTIONS": req.get("options", {})}},
        INSTALLED_APPS=[], USE_TZ=True, TIME_ZONE="UTC", DEFAULT_AUTO_FIELD="django.db.models.AutoField")
    django.setup()
    from django.db import connection, models, transaction

    schema, _, name = req.get("relation", "events").rpartition(".")

    class Event(models.Model):
        event_id = models.TextField(primary_key=True)
        run_id = models.TextField()
        sequence = models.IntegerField()
        type = models.TextField()
        node_id = models.TextField(null=True)
        payload = models.JSONField(null=True)
        timestamp = models.DateTimeField()
        causation_id = models.TextField(null=True)

        class Meta:
            app_label = "seat_drivers"
            managed = False
            db_table = f'{schema}"."{name}' if schema else name  # quoted by Django as "schema"."name"

    def as_row(obj) -> dict:
        return {c: getattr(obj, c) for c in COLUMNS}

    rows: list[dict] = []
    if req["mode"] == "read":
        qs = Event.objects.filter(run_id=req["runId"]).order_by("sequence")
        if req["how"] == "iterator":
            rows = [as_row(o) for o in qs.iterator(chunk_size=req["pageSize"])]
        else:
            after = -1
            while True:
                page = [as_row(o) for o in qs.filter(sequence__gt=after)[:req["pageSize"]]]
                rows += page
                if len(page) < req["pageSize"]:
                    break
                after = page[-1]["sequence"]
    elif req["mode"] == "lock":
        # select_for_update() (FOR UPDATE, with skip_locked / nowait / of as asked) in transaction.atomic(); while the
        # transaction is open, another connection straight to PostgreSQL tries the first row with NOWAIT
        import psycopg

        held = None
        with transaction.atomic():
            qs = Event.objects.filter(run_id=req["runId"]).order_by("sequence").select_for_update(
                **req.get("lock", {}))
            rows = [as_row(o) for o in qs]
            with psycopg.connect(f"host=127.0.0.1 port={req['probePort']} dbname=postgres user=postgres",
                                 autocommit=True) as other:
                try:
                    other.execute("SELECT 1 FROM events WHERE run_id = %s AND sequence = %s FOR UPDATE NOWAIT",
                                  (req["runId"], rows[0]["sequence"]))
                    held = False
                except psycopg.errors.LockNotAvailable:
                    held = True
        rows = {"rows": rows, "held": held}
    elif req["mode"] == "append":
        run_id = req["runId"]
        for e in req["events"]:
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s), 1)", [run_id])
                cur.execute(APPEND_SQL, [run_id, e["eventId"], run_id, e["type"], e["nodeId"], e["payload"],
                                         datetime.fromisoformat(e["timestamp"]), e["causationId"]])
                names = [d.name for d in cur.description]
                assert names == COLUMNS, names
                rows += [dict(zip(names, r)) for r in cur.fetchall()]
    else:
        raise SystemExit(f"unknown mode {req['mode']}")

    def default(v):
        if isinstance(v, datetime):
            return v.isoformat()
        raise TypeError(type(v))

    held = None
    if isinstance(rows, dict):
        rows, held = rows["rows"], rows["held"]
    json.dump({"rows": rows, "held": held, "vendor": connection.vendor,
               "driver": type(connection.connection).__module__}, sys.stdout, default=default)


if __name__ == "__main__":
    main()
