#!/usr/bin/env node
// node-postgres scenarios driven by tests/test_node_pg.py.
//
//   node scenarios.js <scenario> <connection-url>
//
// Runs one scenario with node-postgres (the driver the host service uses) and
// prints what it observed as one JSON document on stdout; exits non-zero on
// any unexpected error. The test runs every scenario once directly against
// PostgreSQL and once through the seat and compares the two documents, so the
// output holds only deterministic values: table names (passed in the
// environment, one set per target) are replaced by placeholders, and
// per-connection values (backend pids, now()) are reduced to facts about them.
//
// Environment: EVENTS_TABLE, RUNS_TABLE, COPY_TABLE name the tables to use.
// PEER_URL is a second connection url (the test passes the database's own
// port) for sessions that watch or contend with the one under test. PG_SSL, a
// JSON object, is passed as node-postgres' `ssl` option (a "caFile" key is
// read into `ca`); PG_CHANNEL_BINDING=1 sets `enableChannelBinding`.
// Except in the `prepared` scenario, queries are never given a `name`: like
// the host, they go out as unnamed prepared statements
// (Parse/Bind/Describe/Execute/Sync).

'use strict';

const crypto = require('crypto');
const fs = require('fs');
const { pipeline } = require('stream/promises');
const { Readable, Writable } = require('stream');
const pg = require('pg');
const { to: copyTo, from: copyFrom } = require('pg-copy-streams');

const EVENTS = process.env.EVENTS_TABLE || 'events';
const RUNS = process.env.RUNS_TABLE || 'runs';
const COPY = process.env.COPY_TABLE || 'copy_target';

// Fixed, deterministic timestamps: 2024-01-02T03:04:05.000Z plus i seconds.
const BASE_MS = Date.UTC(2024, 0, 2, 3, 4, 5);
const ts = (i) => new Date(BASE_MS + i * 1000).toISOString();

const md5 = (s) => crypto.createHash('md5').update(s).digest('hex');

// What a result looks like to the application: command tag, row count, the
// column descriptions (name, type oid, format) and the parsed rows.
function shape(res) {
  return {
    command: res.command,
    rowCount: res.rowCount,
    fields: res.fields.map((f) => [f.name, f.dataTypeID, f.format]),
    rows: res.rows,
  };
}

function errorShape(err) {
  if (!err || !err.code) throw err; // not a server error: a real failure
  return {
    code: err.code,
    severity: err.severity,
    message: err.message,
    detail: err.detail,
    constraint: err.constraint,
    table: err.table,
  };
}

async function expectError(promise) {
  try {
    await promise;
  } catch (err) {
    return errorShape(err);
  }
  throw new Error('statement was expected to fail but succeeded');
}

// The client options for a url: the url itself plus PG_SSL / PG_CHANNEL_BINDING.
function clientConfig(url) {
  const config = { connectionString: url };
  if (process.env.PG_SSL) {
    const { caFile, ...ssl } = JSON.parse(process.env.PG_SSL);
    if (caFile) ssl.ca = fs.readFileSync(caFile, 'utf8');
    config.ssl = ssl;
  }
  if (process.env.PG_CHANNEL_BINDING === '1') config.enableChannelBinding = true;
  return config;
}

async function withClient(url, fn) {
  const client = new pg.Client(clientConfig(url));
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

// The host's append path, verbatim in shape.
const APPEND_SQL = `WITH next AS (SELECT COALESCE(MAX(sequence),0)+1 AS seq FROM ${EVENTS} WHERE run_id = $1)
INSERT INTO ${EVENTS} (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id)
SELECT $2, $1, next.seq, $3, $4, $5, $6, $7 FROM next RETURNING *`;

async function append(client, runId, ev) {
  await client.query('BEGIN');
  try {
    const lock = await client.query('SELECT pg_advisory_xact_lock(hashtext($1), 1)', [runId]);
    const res = await client.query(APPEND_SQL, [
      runId, ev.eventId, ev.type, ev.nodeId, JSON.stringify(ev.payload), ev.timestamp, ev.causationId,
    ]);
    await client.query('COMMIT');
    return { lock: shape(lock), insert: shape(res) };
  } catch (err) {
    await client.query('ROLLBACK');
    throw err;
  }
}

const scenarios = {
  // 1. authentication (the user is in the url) + a simple and a parameterised query
  async auth(url) {
    return withClient(url, async (c) => {
      const simple = await c.query('select current_user');
      const param = await c.query('select $1::int + 1 as n', [41]);
      const textParam = await c.query('select $1::text || $2::text as s, $3::int is null as isnull', ['ab', 'cd', null]);
      return { simple: shape(simple), param: shape(param), textParam: shape(textParam) };
    });
  },

  // 2./3. the append hot path, then the log page and the head sequence
  async append(url) {
    return withClient(url, async (c) => {
      const runId = 'run-append-1';
      const appends = [];
      const types = ['run.started', 'node.started', 'node.completed', 'node.started', 'node.failed', 'run.completed'];
      for (let i = 0; i < types.length; i++) {
        appends.push(await append(c, runId, {
          eventId: `evt-${i + 1}`,
          type: types[i],
          nodeId: i === 0 || i === types.length - 1 ? null : `node-${(i % 2) + 1}`,
          payload: { i, note: `event ${i + 1} \u00e9\u00e8 \u2713`, nested: { ok: i % 2 === 0, list: [i, i * 2] } },
          timestamp: ts(i),
          causationId: i === 0 ? null : `evt-${i}`,
        }));
      }
      // another run interleaved: its sequence starts at 1 again
      const other = await append(c, 'run-append-2', {
        eventId: 'evt-other-1', type: 'run.started', nodeId: null, payload: {}, timestamp: ts(100), causationId: null,
      });
      const page = await c.query(`SELECT * FROM ${EVENTS} WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3`,
        [runId, 2, 3]);
      const fullPage = await c.query(`SELECT * FROM ${EVENTS} WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3`,
        [runId, 0, 100]);
      const head = await c.query(`SELECT COALESCE(MAX(sequence), 0) FROM ${EVENTS} WHERE run_id = $1`, [runId]);
      const emptyHead = await c.query(`SELECT COALESCE(MAX(sequence), 0) FROM ${EVENTS} WHERE run_id = $1`, ['no-such-run']);
      return { appends, other, page: shape(page), fullPage: shape(fullPage), head: shape(head), emptyHead: shape(emptyHead) };
    });
  },

  // 4. one INSERT with 24,000 bind parameters (3,000 rows x 8 columns)
  async bulk(url) {
    const ROWS = 3000;
    const runId = 'run-bulk-1';
    const values = [];
    const params = [];
    let expected = [];
    for (let i = 1; i <= ROWS; i++) {
      const b = params.length;
      values.push(`($${b + 1},$${b + 2},$${b + 3}::int,$${b + 4},$${b + 5},$${b + 6}::jsonb,$${b + 7}::timestamptz,$${b + 8})`);
      const row = [`bulk-${i}`, runId, i, 'node.output', `node-${i % 7}`, JSON.stringify({ n: i }), ts(i), i > 1 ? `bulk-${i - 1}` : null];
      params.push(...row);
      expected.push([row[0], i, row[3], row[4], `{"n": ${i}}`, String(BASE_MS / 1000 + i), row[7] === null ? '-' : row[7]].join('|'));
    }
    expected = md5(expected.join('\n'));
    return withClient(url, async (c) => {
      const ins = await c.query(
        `INSERT INTO ${EVENTS} (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id) VALUES ${values.join(',')}`,
        params);
      const check = await c.query(
        `SELECT count(*)::int AS n, min(sequence) AS lo, max(sequence) AS hi,
                md5(string_agg(concat_ws('|', event_id, sequence, type, node_id, payload::text,
                                         extract(epoch from timestamp)::bigint, coalesce(causation_id, '-')),
                               E'\\n' ORDER BY sequence)) AS checksum
           FROM ${EVENTS} WHERE run_id = $1`, [runId]);
      return { paramCount: params.length, insert: shape(ins), check: shape(check), expectedChecksum: expected };
    });
  },

  // 5. the runs table: insert, lookup, status update, and the sweeper
  async runs(url) {
    const RUN_COLS = 'run_id, tenant_id, status, inputs, metadata, parent_run_id';
    // created_at is now(): keep only the fact that it is a timestamp.
    const strip = (res) => {
      const s = shape(res);
      s.rows = s.rows.map((r) => {
        const { created_at: createdAt, ...rest } = r;
        return { ...rest, created_at_is_date: createdAt instanceof Date };
      }).sort((a, b) => (a.run_id < b.run_id ? -1 : a.run_id > b.run_id ? 1 : 0));
      return s;
    };
    return withClient(url, async (c) => {
      const inserts = [];
      for (let i = 1; i <= 5; i++) {
        inserts.push(strip(await c.query(
          `INSERT INTO ${RUNS} (${RUN_COLS}) VALUES ($1, $2, $3, $4, $5, $6) RETURNING *`,
          [`run-${i}`, `tenant-${i % 2}`, 'queued', JSON.stringify({ x: i, s: 'in\u00fcts' }),
            JSON.stringify({ attempt: 0, tags: ['a', 'b'] }), i > 1 ? 'run-1' : null])));
      }
      const lookup = strip(await c.query(`SELECT * FROM ${RUNS} WHERE run_id = $1`, ['run-3']));
      const missing = strip(await c.query(`SELECT * FROM ${RUNS} WHERE run_id = $1`, ['run-404']));
      const update = shape(await c.query(`UPDATE ${RUNS} SET status = $2 WHERE run_id = $1`, ['run-1', 'running']));

      // a second session holds run-2's row lock; the sweeper must skip it
      const SWEEP = `UPDATE ${RUNS} SET status = 'claimed', metadata = metadata || $2::jsonb
        WHERE run_id IN (SELECT run_id FROM ${RUNS} WHERE status = 'queued'
                         ORDER BY run_id LIMIT $1 FOR UPDATE SKIP LOCKED)
        RETURNING *`;
      const holder = new pg.Client({ connectionString: url });
      await holder.connect();
      let sweep1;
      let sweep2;
      try {
        await holder.query('BEGIN');
        const held = await holder.query(`SELECT run_id FROM ${RUNS} WHERE run_id = $1 FOR UPDATE`, ['run-2']);
        sweep1 = strip(await c.query(SWEEP, [2, JSON.stringify({ claimedBy: 'sweeper-1' })]));
        await holder.query('ROLLBACK');
        sweep2 = strip(await c.query(SWEEP, [10, JSON.stringify({ claimedBy: 'sweeper-2' })]));
        sweep1.held = held.rows;
      } finally {
        await holder.end();
      }
      const all = strip(await c.query(`SELECT * FROM ${RUNS} ORDER BY run_id`));
      return { inserts, lookup, missing, update, sweep1, sweep2, all };
    });
  },

  // 6. errors keep their SQLSTATE and the connection stays usable
  async errors(url) {
    return withClient(url, async (c) => {
      const out = {};
      const ev = { eventId: 'dup-1', type: 't', nodeId: null, payload: { a: 1 }, timestamp: ts(0), causationId: null };
      out.first = await append(c, 'run-err-1', ev);
      // the same event id again, through the host's own append path (BEGIN .. ROLLBACK)
      out.duplicateAppend = await expectError(append(c, 'run-err-1', ev));
      out.afterDuplicate = shape(await c.query('select $1::int + 1 as n', [1]));
      // a unique (run_id, sequence) violation in autocommit, extended protocol
      out.duplicateSequence = await expectError(c.query(
        `INSERT INTO ${EVENTS} (event_id, run_id, sequence, type, timestamp) VALUES ($1, $2, $3, $4, $5)`,
        ['dup-2', 'run-err-1', 1, 't', ts(1)]));
      out.afterSequence = shape(await c.query('select current_user = $1 as same', ['nobody']));
      // inside an explicit transaction: later statements fail until ROLLBACK
      await c.query('BEGIN');
      out.inTx = await expectError(c.query(`INSERT INTO ${EVENTS} (event_id, run_id, sequence, type, timestamp) VALUES ($1, $2, $3, $4, $5)`,
        ['dup-1', 'run-err-1', 9, 't', ts(2)]));
      out.aborted = await expectError(c.query('select 1'));
      out.rollback = shape(await c.query('ROLLBACK'));
      // simple-protocol errors: syntax, bad cast, division by zero, unknown table
      out.syntax = await expectError(c.query('selec 1'));
      out.badCast = await expectError(c.query('select $1::int', ['not-a-number']));
      out.divByZero = await expectError(c.query('select 1/0'));
      out.noTable = await expectError(c.query('select * from no_such_table_xyz'));
      // a multi-statement simple query failing in the middle
      out.multi = await expectError(c.query('select 1; select 1/0; select 3'));
      out.final = shape(await c.query(`SELECT count(*)::int AS n FROM ${EVENTS} WHERE run_id = $1`, ['run-err-1']));
      return out;
    });
  },

  // 7. COPY TO STDOUT and COPY FROM STDIN through pg-copy-streams
  async copy(url) {
    return withClient(url, async (c) => {
      const hash = crypto.createHash('sha256');
      let bytes = 0;
      let lines = 0;
      await pipeline(
        c.query(copyTo('COPY (SELECT g, md5(g::text) FROM generate_series(1,100000) g) TO STDOUT')),
        new Writable({
          write(chunk, _enc, cb) {
            hash.update(chunk);
            bytes += chunk.length;
            for (const b of chunk) if (b === 10) lines++;
            cb();
          },
        }));
      const copyOut = { sha256: hash.digest('hex'), bytes, lines };

      const N = 100000;
      const expected = crypto.createHash('md5');
      function* rows() {
        for (let i = 1; i <= N; i++) {
          const line = `${i}\tline ${i} \u00e5\u00e6\u00f8\t${i % 3 === 0 ? '\\N' : `{"k": ${i}}`}\n`;
          expected.update(`${i}|line ${i} \u00e5\u00e6\u00f8|${i % 3 === 0 ? '-' : `{"k": ${i}}`}\n`);
          yield line;
        }
      }
      // batch lines into ~64 KiB chunks, the way a real producer writes
      async function* chunks() {
        let buf = '';
        for (const line of rows()) {
          buf += line;
          if (buf.length >= 65536) { yield Buffer.from(buf); buf = ''; }
        }
        if (buf) yield Buffer.from(buf);
      }
      const stream = c.query(copyFrom(`COPY ${COPY} (id, label, doc) FROM STDIN`));
      await pipeline(Readable.from(chunks()), stream);
      const copied = stream.rowCount;
      const check = await c.query(
        `SELECT count(*)::int AS n,
                md5(string_agg(id || '|' || label || '|' || coalesce(doc::text, '-') || E'\\n', '' ORDER BY id)) AS checksum
           FROM ${COPY}`);
      // a failing COPY FROM (bad data) reports the error and leaves the connection usable
      const bad = c.query(copyFrom(`COPY ${COPY} (id, label, doc) FROM STDIN`));
      let badError;
      try {
        await pipeline(Readable.from([Buffer.from('1\tdup-ok\t\\N\nnot-an-int\tx\t\\N\n')]), bad);
      } catch (err) {
        badError = errorShape(err);
      }
      const after = shape(await c.query(`SELECT count(*)::int AS n FROM ${COPY}`));
      return {
        copyOut, copyIn: { rowCount: copied, check: shape(check), expectedChecksum: expected.digest('hex') },
        badError: badError && { code: badError.code, message: badError.message }, after,
      };
    });
  },

  // 8. a pool of 10 running 200 concurrent small queries
  async pool(url) {
    const pool = new pg.Pool({ connectionString: url, max: 10 });
    try {
      const jobs = [];
      for (let i = 0; i < 200; i++) {
        jobs.push(pool.query('select $1::int * 2 as v, $2::text as tag, pg_backend_pid() as pid, pg_sleep(0.001)',
          [i, `q${i}`]));
      }
      const results = await Promise.all(jobs);
      const pids = new Set(results.map((r) => r.rows[0].pid));
      return {
        values: results.map((r) => [r.rows[0].v, r.rows[0].tag]),
        fields: results[0].fields.map((f) => [f.name, f.dataTypeID]),
        distinctBackends: pids.size,
        totalCount: pool.totalCount,
      };
    } finally {
      await pool.end();
    }
  },

  // 9. one named prepared statement executed 200 times on one client: parsed once
  async prepared(url) {
    const PREPARED = `SELECT name, statement, parameter_types::text AS types, from_sql,
                             (generic_plans + custom_plans)::int AS executions, prepare_time
                        FROM pg_prepared_statements ORDER BY name`;
    return withClient(url, async (c) => {
      const con = c.connection;
      // what goes out (Parse) and what comes back (ParseComplete, BindComplete, ...) for the 200 runs only
      const sent = { parse: 0, bind: 0, execute: 0 };
      const received = {};
      let counting = false;
      for (const m of Object.keys(sent)) {
        const orig = con[m].bind(con);
        con[m] = (...args) => { if (counting) sent[m]++; return orig(...args); };
      }
      con.on('message', (msg) => { if (counting) received[msg.name] = (received[msg.name] || 0) + 1; });
      const values = [];
      let last;
      const prepTimes = [];
      const statements = [];
      for (let i = 0; i < 200; i++) {
        counting = true;
        last = await c.query({ name: 'get-one', text: 'select $1::int * 2 as v', values: [i] });
        counting = false;
        values.push(last.rows[0].v);
        if (i === 0 || i === 199) {
          const rows = (await c.query(PREPARED)).rows;
          prepTimes.push(rows.map((r) => r.prepare_time.getTime()));
          statements.push(rows.map(({ prepare_time: _, ...rest }) => rest));
        }
      }
      // a prepared statement belongs to its session: another one does not see it
      const other = await withClient(url, async (o) => (await o.query(PREPARED)).rows);
      return {
        values, last: shape(last), sent, received, afterFirst: statements[0], afterLast: statements[1],
        prepareTimeUnchanged: prepTimes[0].length === 1 && prepTimes[0][0] === prepTimes[1][0],
        otherSession: other,
      };
    });
  },

  // 10. LISTEN/NOTIFY between two clients: delivered while idle, in order, with payloads
  async notify(url) {
    const a = new pg.Client(clientConfig(url));
    const b = new pg.Client(clientConfig(url));
    await a.connect();
    await b.connect();
    try {
      const got = [];
      let wake = () => {};
      a.on('notification', (n) => { got.push(n); wake(); });
      const waitFor = (count) => new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(
          `timed out waiting for ${count} notifications, have ${JSON.stringify(got.map((n) => n.payload))}`)), 5000);
        wake = () => { if (got.length >= count) { clearTimeout(timer); resolve(); } };
        wake();
      });
      const pidOf = async (cl) => (await cl.query('select pg_backend_pid() as pid')).rows[0].pid;
      const aPid = await pidOf(a);
      const bPid = await pidOf(b);
      const listen = shape(await a.query('LISTEN chan'));
      // A is idle (no query in flight) while each of these arrives
      await b.query("NOTIFY chan, 'x'");
      await waitFor(1);
      await b.query("select pg_notify('chan', $1)", ['y \u00e9\u2713 ' + 'z'.repeat(2000)]);
      await waitFor(2);
      // inside a transaction: nothing until COMMIT, then all of it in order, duplicates folded
      await b.query('BEGIN');
      await b.query("NOTIFY chan, 'tx-1'");
      await b.query("select pg_notify('chan', 'tx-2')");
      await b.query("NOTIFY chan, 'tx-1'");
      await b.query("NOTIFY chan, 'tx-3'");
      await a.query('select 1');
      await new Promise((r) => setTimeout(r, 50));
      const beforeCommit = got.length;
      await b.query('COMMIT');
      await waitFor(5);
      // A's own notification arrives during its own statement
      await a.query("NOTIFY chan, 'self'");
      const afterSelf = got.length;
      // after UNLISTEN nothing more on chan; a marker on a second channel shows the order
      await a.query('UNLISTEN chan');
      await a.query('LISTEN other');
      await b.query("NOTIFY chan, 'ignored'");
      await b.query("NOTIFY other, 'end'");
      await waitFor(7);
      await a.query('select 1');
      const who = (pid) => (pid === aPid ? 'A' : pid === bPid ? 'B' : `pid ${pid}`);
      return {
        listen,
        beforeCommit,
        afterSelf,
        notifications: got.map((n) => [n.channel, n.payload, who(n.processId)]),
      };
    } finally {
      await a.end();
      await b.end();
    }
  },

  // 11. a session-level advisory lock held across statements of one session
  //     (B, the contender, connects to PEER_URL: the database itself)
  async advisory(url) {
    const key = String(7700000000 + process.pid);
    const a = new pg.Client(clientConfig(url));
    const b = new pg.Client(clientConfig(process.env.PEER_URL));
    await a.connect();
    await b.connect();
    try {
      const aPid = (await a.query('select pg_backend_pid() as pid')).rows[0].pid;
      await b.query("SET lock_timeout = '5s'");
      const tryB = async () => {
        const got = (await b.query('select pg_try_advisory_lock($1::bigint) as got', [key])).rows[0].got;
        if (got) await b.query('select pg_advisory_unlock($1::bigint)', [key]);
        return got;
      };
      const HOLDERS = `SELECT pid, granted FROM pg_locks
                        WHERE locktype = 'advisory' AND (classid::bigint << 32) + objid::bigint = $1::bigint
                        ORDER BY granted DESC`;
      const trials = [];
      trials.push(['before', await tryB()]);
      const lock = shape(await a.query('select pg_advisory_lock($1::bigint)', [key]));
      trials.push(['afterLock', await tryB()]);
      await a.query('select 1');
      trials.push(['afterSimple', await tryB()]);
      await a.query('select $1::int + 1 as n', [1]);
      trials.push(['afterExtended', await tryB()]);
      await a.query('BEGIN');
      await a.query('select now()');
      await a.query('COMMIT');
      trials.push(['afterTransaction', await tryB()]);
      const err = await expectError(a.query('select 1/0'));
      trials.push(['afterError', await tryB()]);
      const holders = (await b.query(HOLDERS, [key])).rows.map((r) => [r.pid === aPid ? 'A' : 'other', r.granted]);
      // B blocks on the lock; A releases it; B gets it
      const order = [];
      const blocked = b.query('select pg_advisory_lock($1::bigint)', [key]).then(() => order.push('B acquired'));
      let waiting;
      for (let i = 0; i < 250; i++) {
        waiting = (await a.query(HOLDERS, [key])).rows.map((r) => [r.pid === aPid ? 'A' : 'other', r.granted]);
        if (waiting.length === 2) break;
        await new Promise((r) => setTimeout(r, 20));
      }
      const samePid = (await a.query('select pg_backend_pid() as pid')).rows[0].pid === aPid;
      order.push('A unlocking');
      const unlock = shape(await a.query('select pg_advisory_unlock($1::bigint) as released', [key]));
      await blocked;
      await b.query('select pg_advisory_unlock($1::bigint)', [key]);
      trials.push(['afterUnlock', await tryB()]);
      return { lock, trials, error: err.code, holders, waiting, order, samePid, unlock };
    } finally {
      await a.end();
      await b.end();
    }
  },

  // 12. cancel a running pg_sleep(30) (simple and extended protocol) with the
  //     driver's own Client#cancel, which opens a second connection to `url`
  async cancel(url) {
    return withClient(url, async (c) => {
      const monitor = new pg.Client(clientConfig(process.env.PEER_URL));
      await monitor.connect();
      try {
        const pid = (await c.query('select pg_backend_pid() as pid')).rows[0].pid;
        const out = { runs: {}, _elapsedMs: {} };
        for (const [label, text, values] of [['simple', 'SELECT pg_sleep(30)', undefined],
          ['extended', 'SELECT pg_sleep($1::float8)', [30]]]) {
          const q = new pg.Query(text, values);
          const done = new Promise((resolve) => {
            q.on('error', (err) => resolve({ err }));
            q.on('end', () => resolve({ err: null }));
          });
          const started = Date.now();
          c.query(q);
          // cancel only once the backend is really sleeping (a deadline, not a count of polls: on a loaded
          // machine each poll can take long)
          let state;
          for (const deadline = Date.now() + 15000; Date.now() < deadline;) {
            state = (await monitor.query('select state, wait_event from pg_stat_activity where pid = $1', [pid])).rows[0];
            if (state && state.state === 'active' && state.wait_event === 'PgSleep') break;
            await new Promise((r) => setTimeout(r, 10));
          }
          const canceller = new pg.Client(clientConfig(url));
          const cancelErrors = [];
          canceller.connection.on('error', (e) => cancelErrors.push(e.message));
          const cancelledAt = Date.now();
          canceller.cancel(c, q);
          const { err } = await done;
          const ended = Date.now();
          out._elapsedMs[label] = { total: ended - started, sinceCancel: ended - cancelledAt };
          out.runs[label] = {
            sleeping: state,
            error: err && { code: err.code, message: err.message, severity: err.severity },
            under2s: ended - cancelledAt < 2000, // the cancel's effect, not the wait for the sleep to start
            cancelErrors,
            after: shape(await c.query('select $1::int as still_usable', [1])),
          };
        }
        out.samePid = (await c.query('select pg_backend_pid() as pid')).rows[0].pid === pid;
        return out;
      } finally {
        await monitor.end();
      }
    });
  },

  // 13. one connection as configured by PG_SSL / PG_CHANNEL_BINDING: what the
  //     driver sees of TLS and authentication, and whether the server's leg is TLS
  async tls(url) {
    const c = new pg.Client(clientConfig(url));
    const auth = { offered: null, chosen: null };
    c.connection.on('authenticationSASL', (msg) => { auth.offered = msg.mechanisms; });
    c.connection.on('authenticationMD5Password', () => { auth.chosen = 'md5'; });
    const orig = c.connection.sendSASLInitialResponseMessage.bind(c.connection);
    c.connection.sendSASLInitialResponseMessage = (mechanism, response) => {
      auth.chosen = mechanism;
      return orig(mechanism, response);
    };
    await c.connect();
    try {
      const s = c.connection.stream;
      const row = (await c.query(`SELECT current_user::text AS user, ssl AS upstream_ssl, version
                                    FROM pg_stat_ssl WHERE pid = pg_backend_pid()`)).rows[0];
      const peer = typeof s.getPeerCertificate === 'function' ? s.getPeerCertificate() : null;
      return {
        encrypted: s.encrypted === true,
        protocol: typeof s.getProtocol === 'function' ? s.getProtocol() : null,
        authorized: s.authorized === undefined ? null : s.authorized,
        peerCN: peer && peer.subject ? peer.subject.CN : null,
        user: row.user,
        upstreamSsl: row.upstream_ssl,
        upstreamVersion: row.version,
        auth,
        roundTrip: (await c.query('select $1::text as echo', ['over tls \u2713'])).rows,
      };
    } finally {
      await c.end();
    }
  },
};

async function main() {
  const [name, url] = process.argv.slice(2);
  const fn = scenarios[name];
  if (!fn || !url) {
    process.stderr.write(`usage: node scenarios.js <${Object.keys(scenarios).join('|')}> <connection-url>\n`);
    process.exit(2);
  }
  const result = await fn(url);
  let text = JSON.stringify(result);
  // table names differ per target; the rest must not
  for (const [table, placeholder] of [[EVENTS, '<events>'], [RUNS, '<runs>'], [COPY, '<copy>']]) {
    text = text.split(table).join(placeholder);
  }
  process.stdout.write(text + '\n');
}

main().catch((err) => {
  process.stderr.write(`scenario failed: ${err && err.stack ? err.stack : err}\n`);
  if (err && err.code) process.stderr.write(`sqlstate ${err.code}\n`);
  process.exit(1);
});
