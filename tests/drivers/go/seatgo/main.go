// Go driver reads and appends for tests/integration/test_drivers_go.py: pgx v4 and lib/pq (database/sql),
// Debian's packages, built offline in GOPATH mode (GO111MODULE=off, GOPATH=/usr/share/gocode).
//
//	seatgo < request.json
//
// The request: {"driver": "pgx" | "pq", "mode": "read" | "append", "url": ..., "table": ..., "runId": ...,
// "pageSize": n, "prepared": bool (pq: a prepared *sql.Stmt instead of db.Query), "events": [...]}.
//
// read: the host's page statement on one connection, page after page until a short page (pgx prepares and
// caches it on its defaults, statement_cache_mode=describe caches its description and sends unnamed
// statements). append: the host's append path for each event (BEGIN; pg_advisory_xact_lock; the
// next-sequence CTE INSERT ... RETURNING *; COMMIT), payload bound as a string, timestamp as a time.Time.
//
// Output: {"applicationName": ..., "rows": [...]}: each row an object of the events columns, sequence a
// number, timestamp epoch microseconds, payload the jsonb's text (a string, or null). Errors exit 1.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v4"
	_ "github.com/lib/pq"
)

type event struct {
	EventID     string  `json:"eventId"`
	Type        string  `json:"type"`
	NodeID      *string `json:"nodeId"`
	Payload     *string `json:"payload"`
	Timestamp   string  `json:"timestamp"`
	CausationID *string `json:"causationId"`
}

type request struct {
	Driver   string  `json:"driver"`
	Mode     string  `json:"mode"`
	URL      string  `json:"url"`
	Table    string  `json:"table"`
	RunID    string  `json:"runId"`
	PageSize int     `json:"pageSize"`
	Prepared bool    `json:"prepared"`
	Events   []event `json:"events"`
}

type row map[string]interface{}

var columns = []string{"event_id", "run_id", "sequence", "type", "node_id", "payload", "timestamp", "causation_id"}

const appendSQL = `WITH next AS (SELECT COALESCE(MAX(sequence),0)+1 AS seq FROM events WHERE run_id = $1)
INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id)
SELECT $2, $1, next.seq, $3, $4, $5, $6, $7 FROM next RETURNING *`

const lockSQL = `SELECT pg_advisory_xact_lock(hashtext($1), 1)`

func pageSQL(table string) string {
	return "SELECT * FROM " + table + " WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3"
}

// scanned holds one row's destinations, scanned in the events table's column order.
type scanned struct {
	eventID, runID, typ          string
	sequence                     int32
	nodeID, causationID, payload *string
	ts                           time.Time
}

func (s *scanned) dest() []interface{} {
	return []interface{}{&s.eventID, &s.runID, &s.sequence, &s.typ, &s.nodeID, &s.payload, &s.ts, &s.causationID}
}

func (s *scanned) row() row {
	return row{"event_id": s.eventID, "run_id": s.runID, "sequence": s.sequence, "type": s.typ,
		"node_id": s.nodeID, "payload": s.payload, "timestamp": s.ts.UnixMicro(), "causation_id": s.causationID}
}

func checkNames(names []string) {
	if fmt.Sprint(names) != fmt.Sprint(columns) {
		fail(fmt.Errorf("columns %v", names))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

func must(err error) {
	if err != nil {
		fail(err)
	}
}

func parseTS(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	must(err)
	return t
}

func runPgx(ctx context.Context, req request) (string, []row) {
	conn, err := pgx.Connect(ctx, req.URL)
	must(err)
	defer conn.Close(ctx)
	var out []row
	collect := func(rows pgx.Rows) int {
		defer rows.Close()
		var names []string
		for _, f := range rows.FieldDescriptions() {
			names = append(names, string(f.Name))
		}
		checkNames(names)
		n := 0
		for rows.Next() {
			var s scanned
			must(rows.Scan(s.dest()...))
			out = append(out, s.row())
			n++
		}
		must(rows.Err())
		return n
	}
	switch req.Mode {
	case "read":
		after := int32(-1)
		for {
			rows, err := conn.Query(ctx, pageSQL(req.Table), req.RunID, after, req.PageSize)
			must(err)
			if n := collect(rows); n < req.PageSize {
				break
			}
			after = out[len(out)-1]["sequence"].(int32)
		}
	case "append":
		for _, e := range req.Events {
			tx, err := conn.Begin(ctx)
			must(err)
			_, err = tx.Exec(ctx, lockSQL, req.RunID)
			must(err)
			rows, err := tx.Query(ctx, appendSQL, req.RunID, e.EventID, e.Type, e.NodeID, e.Payload,
				parseTS(e.Timestamp), e.CausationID)
			must(err)
			collect(rows)
			must(tx.Commit(ctx))
		}
	default:
		fail(fmt.Errorf("unknown mode %q", req.Mode))
	}
	var app string
	must(conn.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&app))
	return app, out
}

func runPq(ctx context.Context, req request) (string, []row) {
	db, err := sql.Open("postgres", req.URL)
	must(err)
	defer db.Close()
	db.SetMaxOpenConns(1) // one session, as a host's pooled connection
	conn, err := db.Conn(ctx)
	must(err)
	defer conn.Close()
	var out []row
	collect := func(rows *sql.Rows) int {
		defer rows.Close()
		names, err := rows.Columns()
		must(err)
		checkNames(names)
		n := 0
		for rows.Next() {
			var s scanned
			var payload []byte
			var nodeID, causationID sql.NullString
			must(rows.Scan(&s.eventID, &s.runID, &s.sequence, &s.typ, &nodeID, &payload, &s.ts, &causationID))
			if payload != nil {
				p := string(payload)
				s.payload = &p
			}
			if nodeID.Valid {
				s.nodeID = &nodeID.String
			}
			if causationID.Valid {
				s.causationID = &causationID.String
			}
			out = append(out, s.row())
			n++
		}
		must(rows.Err())
		return n
	}
	switch req.Mode {
	case "read":
		var stmt *sql.Stmt
		if req.Prepared {
			stmt, err = conn.PrepareContext(ctx, pageSQL(req.Table))
			must(err)
			defer stmt.Close()
		}
		after := int32(-1)
		for {
			var rows *sql.Rows
			if stmt != nil {
				rows, err = stmt.QueryContext(ctx, req.RunID, after, req.PageSize)
			} else {
				rows, err = conn.QueryContext(ctx, pageSQL(req.Table), req.RunID, after, req.PageSize)
			}
			must(err)
			if n := collect(rows); n < req.PageSize {
				break
			}
			after = out[len(out)-1]["sequence"].(int32)
		}
	case "append":
		for _, e := range req.Events {
			tx, err := conn.BeginTx(ctx, nil)
			must(err)
			_, err = tx.ExecContext(ctx, lockSQL, req.RunID)
			must(err)
			rows, err := tx.QueryContext(ctx, appendSQL, req.RunID, e.EventID, e.Type, e.NodeID, e.Payload,
				parseTS(e.Timestamp), e.CausationID)
			must(err)
			collect(rows)
			must(tx.Commit())
		}
	default:
		fail(fmt.Errorf("unknown mode %q", req.Mode))
	}
	var app string
	must(conn.QueryRowContext(ctx, "SELECT current_setting('application_name')").Scan(&app))
	return app, out
}

func main() {
	var req request
	must(json.NewDecoder(os.Stdin).Decode(&req))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var app string
	var rows []row
	switch req.Driver {
	case "pgx":
		app, rows = runPgx(ctx, req)
	case "pq":
		app, rows = runPq(ctx, req)
	default:
		fail(fmt.Errorf("unknown driver %q", req.Driver))
	}
	if rows == nil {
		rows = []row{}
	}
	must(json.NewEncoder(os.Stdout).Encode(map[string]interface{}{"applicationName": app, "rows": rows}))
}
