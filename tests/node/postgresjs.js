#!/usr/bin/env node
// postgres.js (npm `postgres`) reads and appends for tests/integration/test_drivers_postgresjs.py.
//
//   node postgresjs.js < request.json
//
// The request: {"mode": "read" | "append", "url": ..., "table": ..., "runId": ..., "pageSize": n,
//   "prepare": bool (the driver's `prepare` option: named statements, its default), "cursor": bool,
//   "events": [...]}.
// read: the host's page statement as a tagged template, page after page until a short page, on one
//   connection (max: 1); with "cursor", one statement over the whole run read with .cursor(pageSize)
//   (Execute with a row limit, PortalSuspended between batches).
// append: the host's append path for each event in sql.begin (BEGIN; pg_advisory_xact_lock; the
//   next-sequence CTE INSERT ... RETURNING * as sql.unsafe with its $n arguments; COMMIT); payload and
//   timestamp are sent as strings, typed by the server.
//
// Output: {"applicationName": ..., "rows": [...]}, rows as postgres.js gives them (jsonb parsed), except
// timestamptz, kept as the server's text (a Date would drop the microseconds). Errors exit 1.

'use strict';

const postgres = require('postgres').default; // an ES module, required from CommonJS (Node.js 20.19 or later)

const APPEND_SQL = `WITH next AS (SELECT COALESCE(MAX(sequence),0)+1 AS seq FROM events WHERE run_id = $1)
INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id)
SELECT $2, $1, next.seq, $3, $4, $5, $6, $7 FROM next RETURNING *`;

async function main() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  const req = JSON.parse(Buffer.concat(chunks).toString('utf8'));
  const sql = postgres(req.url, {
    max: 1,
    prepare: req.prepare !== false,
    onnotice: () => {},
    types: { timestamptzText: { to: 1184, from: [1184], serialize: (x) => x, parse: (x) => x } },
  });
  const rows = [];
  try {
    if (req.mode === 'read') {
      const page = (after, limit) => sql`SELECT * FROM ${sql.unsafe(req.table)}
        WHERE run_id = ${req.runId} AND sequence > ${after} ORDER BY sequence LIMIT ${limit}`;
      if (req.cursor) {
        for await (const batch of page(-1, 1000000).cursor(req.pageSize)) rows.push(...batch);
      } else {
        let after = -1;
        for (;;) {
          const got = await page(after, req.pageSize);
          rows.push(...got);
          if (got.length < req.pageSize) break;
          after = got[got.length - 1].sequence;
        }
      }
    } else if (req.mode === 'append') {
      for (const ev of req.events) {
        const got = await sql.begin(async (tx) => {
          await tx`SELECT pg_advisory_xact_lock(hashtext(${req.runId}), 1)`;
          return tx.unsafe(APPEND_SQL, [req.runId, ev.eventId, ev.type, ev.nodeId, ev.payload, ev.timestamp,
            ev.causationId], { prepare: req.prepare !== false });
        });
        rows.push(...got);
      }
    } else {
      throw new Error(`unknown mode ${req.mode}`);
    }
    const [{ app }] = await sql`SELECT current_setting('application_name') AS app`;
    process.stdout.write(JSON.stringify({ applicationName: app, rows: rows.map((r) => ({ ...r })) }));
  } finally {
    await sql.end({ timeout: 5 });
  }
}

main().catch((err) => {
  process.stderr.write(`${err && err.stack ? err.stack : err}\n${err && err.code ? `code ${err.code}` : ''}\n`);
  process.exit(1);
});
