#!/usr/bin/env node
// node-postgres reads of the golden reader-rule fixtures, driven by tests/test_golden.py.
//
//   node golden.js < request.json
//
// The request is one JSON document:
//   {"mode": "page", "url": ..., "applicationName": ... | null, "runs": [runId, ...], "sql"?: ...}
//     reads each run with the host's page shape (an unnamed prepared statement:
//     Parse/Bind/Describe/Execute/Sync), all on one connection, and prints
//     {runId: {"fields": [name, ...], "rows": [[text, ...], ...]} | {"error": {...}}}.
//     "sql" (optional) replaces the page statement (PAGE_SQL); it takes the same
//     three parameters (run id, sequence after, limit).
//   {"mode": "append", "url": ..., "applicationName": ..., "runId": ..., "events": [ev, ...]}
//     appends each event with the host's append path (BEGIN; advisory lock;
//     the next-sequence CTE with RETURNING *; COMMIT), and prints
//     [{"fields": [...], "row": [...]} | {"error": {...}}, ...].
//
// Every value is returned as the server's text, unparsed (a raw type parser),
// so the test compares bytes rather than what node-postgres makes of them
// (its Date would drop the microseconds). Rows are arrays, in column order.
// A server error is printed as {code, message, detail}; anything else exits 1.

'use strict';

const pg = require('pg');

const PAGE_SQL = 'SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3';

// The host's append path, verbatim in shape.
const APPEND_SQL = `WITH next AS (SELECT COALESCE(MAX(sequence),0)+1 AS seq FROM events WHERE run_id = $1)
INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id)
SELECT $2, $1, next.seq, $3, $4, $5, $6, $7 FROM next RETURNING *`;

const RAW = { getTypeParser: () => (value) => value };

function errorShape(err) {
  if (!err || !err.code) throw err; // not a server error: a real failure
  return { code: err.code, message: err.message, detail: err.detail === undefined ? null : err.detail };
}

function result(res) {
  return { fields: res.fields.map((f) => f.name), rows: res.rows };
}

async function withClient(req, fn) {
  const config = { connectionString: req.url };
  if (req.applicationName) config.application_name = req.applicationName;
  const client = new pg.Client(config);
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

async function page(req) {
  return withClient(req, async (client) => {
    const out = {};
    for (const runId of req.runs) {
      try {
        const res = await client.query({ text: req.sql || PAGE_SQL, values: [runId, -1, 1000], types: RAW, rowMode: 'array' });
        out[runId] = result(res);
      } catch (err) {
        out[runId] = { error: errorShape(err) };
      }
    }
    return out;
  });
}

async function append(req) {
  return withClient(req, async (client) => {
    const out = [];
    for (const ev of req.events) {
      await client.query('BEGIN');
      try {
        await client.query('SELECT pg_advisory_xact_lock(hashtext($1), 1)', [req.runId]);
        const res = await client.query({
          text: APPEND_SQL,
          values: [req.runId, ev.eventId, ev.type, ev.nodeId, ev.payload === null ? null : JSON.stringify(ev.payload),
            ev.timestamp, ev.causationId],
          types: RAW,
          rowMode: 'array',
        });
        await client.query('COMMIT');
        const r = result(res);
        out.push({ fields: r.fields, row: r.rows.length === 1 ? r.rows[0] : r.rows });
      } catch (err) {
        await client.query('ROLLBACK');
        out.push({ error: errorShape(err) });
      }
    }
    return out;
  });
}

async function main() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  const req = JSON.parse(Buffer.concat(chunks).toString('utf8'));
  const modes = { page, append };
  if (!modes[req.mode]) throw new Error(`unknown mode ${req.mode}`);
  process.stdout.write(JSON.stringify(await modes[req.mode](req)));
}

main().catch((err) => {
  process.stderr.write(`${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
