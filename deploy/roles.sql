-- deploy/roles.sql
-- The recommended role layout (docs/host-database.md#recommended-role-layout), in one script. Run it once as a
-- superuser connected to the host database (psql -d openwop -f deploy/roles.sql), before the host creates its
-- tables; then set the passwords (\password openwop, \password openwop_seat_owner). The host's own migrations
-- create its tables as openwop_tables (SET ROLE openwop_tables, or ALTER TABLE … OWNER TO openwop_tables after).
-- tests/integration/test_roles.py applies it to a real cluster and runs migrate, serve, audit and backfill as
-- these roles.

-- Owns the host's tables; nobody logs in as it, so no session can switch the writer rule or the net off.
CREATE ROLE openwop_tables NOLOGIN;
-- The host: connects through the seat, reads and writes its rows, owns nothing and is a member of nothing here.
CREATE ROLE openwop LOGIN;
-- Runs migrate and backfill; owns the schema openwop_seat. A member of openwop_tables: the net (row-level
-- security on the events table) needs the table owner's rights, which also bring the TRIGGER (the writer rule's
-- triggers), SELECT (stamp_run reads a run's events), UPDATE (backfill rewrites type and payload; with
-- host.era_column the era column) and DELETE (a translated DELETE by run_id) it needs on runs and events.
CREATE ROLE openwop_seat_owner LOGIN;
GRANT openwop_tables TO openwop_seat_owner;
-- openwop_seat.claim tells a backend from a later one with the same pid by pg_stat_activity.
GRANT pg_read_all_stats TO openwop_seat_owner;
-- migrate creates the schema openwop_seat.
DO $$ BEGIN EXECUTE format('GRANT CREATE ON DATABASE %I TO openwop_seat_owner', current_database()); END $$;
-- Reads only: audit, the pinned-runs listing, adr (optional; the host role would do as well).
CREATE ROLE openwop_readonly LOGIN;

-- The host's tables, created by openwop_tables, are the host's to read and write, and readonly's to read.
GRANT USAGE, CREATE ON SCHEMA public TO openwop_tables;
ALTER DEFAULT PRIVILEGES FOR ROLE openwop_tables IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO openwop;
ALTER DEFAULT PRIVILEGES FOR ROLE openwop_tables IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO openwop;
ALTER DEFAULT PRIVILEGES FOR ROLE openwop_tables IN SCHEMA public GRANT SELECT ON TABLES TO openwop_readonly;
