// pgjdbc reads and appends for tests/integration/test_drivers_pgjdbc.py, run as a single-file program:
//
//   java -cp postgresql.jar SeatJdbc.java read   JDBC_URL TABLE RUN_ID PAGE_SIZE
//   java -cp postgresql.jar SeatJdbc.java append JDBC_URL RUN_ID  < events
//
// read: the host's page statement (SELECT * FROM TABLE WHERE run_id = ? AND sequence > ? ORDER BY sequence
//   LIMIT ?) on one PreparedStatement, executed page after page until a short page, so that pgjdbc's
//   prepareThreshold switch (to a named server statement, and binary results where binaryTransfer allows)
//   happens in the middle of the read.
// append: the host's append path for each event (autocommit off; pg_advisory_xact_lock; the next-sequence
//   CTE INSERT ... RETURNING *; commit). The events come on stdin, one a line, seven tab-separated fields
//   (event_id, type, node_id, payload JSON, timestamp ISO 8601, causation_id; \N is NULL); payload and
//   timestamp are bound as Types.OTHER (sent untyped, the server infers jsonb and timestamptz).
//
// Output, on stdout: one JSON document {"applicationName": ..., "serverVersion": ..., "rows": [...]}, each row
// an object of the events columns: sequence a number, timestamp epoch microseconds, payload the jsonb's text
// (a JSON string, or null), the others strings or null. A SQLException exits 1 with its SQLSTATE on stderr.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.sql.Types;
import java.time.OffsetDateTime;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.List;

public class SeatJdbc {
    static final String APPEND_SQL = "WITH next AS (SELECT COALESCE(MAX(sequence),0)+1 AS seq FROM events WHERE run_id = ?)\n"
        + "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id)\n"
        + "SELECT ?, ?, next.seq, ?, ?, ?, ?, ? FROM next RETURNING *";

    static String str(String s) {
        if (s == null) return "null";
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) b.append(String.format("\\u%04x", (int) c)); else b.append(c);
            }
        }
        return b.append('"').toString();
    }

    static String row(ResultSet rs) throws SQLException {
        ResultSetMetaData md = rs.getMetaData();
        StringBuilder b = new StringBuilder("{");
        for (int i = 1; i <= md.getColumnCount(); i++) {
            String name = md.getColumnName(i);
            if (i > 1) b.append(',');
            b.append(str(name)).append(':');
            switch (name) {
                case "sequence": b.append(rs.getInt(i)); break;
                case "timestamp": {
                    OffsetDateTime t = rs.getObject(i, OffsetDateTime.class);
                    b.append(t == null ? "null" : Long.toString(ChronoUnit.MICROS.between(OffsetDateTime.parse("1970-01-01T00:00:00Z"), t)));
                    break;
                }
                default: b.append(str(rs.getString(i)));
            }
        }
        return b.append('}').toString();
    }

    static String doc(Connection conn, List<String> rows) throws SQLException {
        String app;
        try (PreparedStatement st = conn.prepareStatement("SELECT current_setting('application_name')");
             ResultSet rs = st.executeQuery()) {
            rs.next();
            app = rs.getString(1);
        }
        return "{\"applicationName\":" + str(app) + ",\"serverVersion\":" + str(conn.getMetaData().getDatabaseProductVersion())
            + ",\"rows\":[" + String.join(",", rows) + "]}";
    }

    static String nul(String s) {
        return s.equals("\\N") ? null : s;
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0], url = args[1];
        List<String> rows = new ArrayList<>();
        try (Connection conn = DriverManager.getConnection(url)) {
            if (mode.equals("read")) {
                String table = args[2], runId = args[3];
                int pageSize = Integer.parseInt(args[4]);
                try (PreparedStatement st = conn.prepareStatement(
                        "SELECT * FROM " + table + " WHERE run_id = ? AND sequence > ? ORDER BY sequence LIMIT ?")) {
                    int after = -1;
                    while (true) {
                        st.setString(1, runId);
                        st.setInt(2, after);
                        st.setInt(3, pageSize);
                        int n = 0;
                        try (ResultSet rs = st.executeQuery()) {
                            while (rs.next()) {
                                rows.add(row(rs));
                                after = rs.getInt("sequence");
                                n++;
                            }
                        }
                        if (n < pageSize) break;
                    }
                }
            } else if (mode.equals("append")) {
                String runId = args[2];
                conn.setAutoCommit(false);
                BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
                try (PreparedStatement lock = conn.prepareStatement("SELECT pg_advisory_xact_lock(hashtext(?), 1)");
                     PreparedStatement ins = conn.prepareStatement(APPEND_SQL)) {
                    for (String line; (line = in.readLine()) != null; ) {
                        if (line.isEmpty()) continue;
                        String[] f = line.split("\t", -1);
                        lock.setString(1, runId);
                        lock.executeQuery().close();
                        ins.setString(1, runId);
                        ins.setString(2, nul(f[0]));
                        ins.setString(3, runId);
                        ins.setString(4, nul(f[1]));
                        ins.setString(5, nul(f[2]));
                        ins.setObject(6, nul(f[3]), Types.OTHER);
                        ins.setObject(7, nul(f[4]), Types.OTHER);
                        ins.setString(8, nul(f[5]));
                        try (ResultSet rs = ins.executeQuery()) {
                            while (rs.next()) rows.add(row(rs));
                        }
                        conn.commit();
                    }
                }
                conn.setAutoCommit(true);
            } else {
                throw new IllegalArgumentException("unknown mode " + mode);
            }
            System.out.println(doc(conn, rows));
        } catch (SQLException e) {
            System.err.println("SQLSTATE " + e.getSQLState() + ": " + e.getMessage());
            System.exit(1);
        }
    }
}
