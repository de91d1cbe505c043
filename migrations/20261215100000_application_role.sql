-- Two database roles (issue 31): the role that runs the migrations owns every table, and `serve`
-- connects as a role that owns nothing and holds the privileges of `tokenfactory_app`. An owner
-- can `ALTER TABLE .. DISABLE TRIGGER` and then rewrite an issued invoice; a role that owns
-- nothing cannot, so the immutability triggers bind it, and on the money tables it is granted
-- no UPDATE or DELETE where no code path needs one (usage, charge lines, rollups, grants,
-- prices, closes, the audit log). `serve` refuses to start as an owner or superuser unless
-- `--allow-owner-role` (the single-machine demo) says so.
--
-- Roles are cluster-wide, grants are per database: every database migrated on a cluster (each
-- `#[sqlx::test]` database, staging next to production) shares the one role and grants it
-- privileges on its own tables. The role is created only when missing, so a DBA may create it
-- beforehand and the owner needs no CREATEROLE; two migrations racing to create it (tests
-- migrate their databases in parallel) both succeed: the loser sees the winner's row as a
-- duplicate, which is what it wanted. The role cannot log in; a login role is made a member of
-- it (`CREATE ROLE tf_serve LOGIN PASSWORD '…' IN ROLE tokenfactory_app`, or `tokenfactory
-- migrate --grant-app-role tf_serve`).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tokenfactory_app') THEN
        BEGIN
            CREATE ROLE tokenfactory_app NOLOGIN;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN NULL;
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'the role tokenfactory_app does not exist and % may not create it',
                    current_user
                    USING HINT = 'create it once as a superuser: CREATE ROLE tokenfactory_app NOLOGIN';
        END;
    END IF;
END $$;

-- Everything the process reads and writes, to start with (sessions, keys, limits, catalog,
-- fleet state, drafts): what follows takes back what it must not do.
GRANT USAGE ON SCHEMA public, tower_sessions TO tokenfactory_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public, tower_sessions
    TO tokenfactory_app;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO tokenfactory_app;
-- Tables later migrations create (as this same owner) start the same way; a later migration
-- that adds a money table revokes what the process must not do, as below.
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO tokenfactory_app;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO tokenfactory_app;

-- Facts and history: appended, never changed. (TRUNCATE, TRIGGER and REFERENCES were never
-- granted, and ALTER needs ownership.)
REVOKE UPDATE, DELETE ON usage_events, audit_log, credit_grants, price_versions, prices,
    period_closes, rating_runs, charge_lines, rated_daily, billing_tiers
    FROM tokenfactory_app;
-- Drafts are rebuilt (their entries and sources deleted and written again) and issued (the one
-- UPDATE of invoices); the triggers refuse both on an issued invoice, and this role cannot
-- disable them. Entries are never updated; an invoice is never deleted.
REVOKE UPDATE ON invoice_entries, invoice_sources FROM tokenfactory_app;
REVOKE DELETE ON invoices FROM tokenfactory_app;
-- Charge lines and the daily rollup are written only by the rater's function, which runs as the
-- owner (below): the process may call it but not insert a line of its own.
REVOKE INSERT ON charge_lines, rated_daily FROM tokenfactory_app;
-- The process reads which migrations are applied (readiness, and `serve` refusing to run on a
-- schema older than its binary) and applies none.
GRANT SELECT ON _sqlx_migrations TO tokenfactory_app;
REVOKE INSERT, UPDATE, DELETE ON _sqlx_migrations FROM tokenfactory_app;

-- The rater writes lines and the rollup (an upsert, which needs UPDATE) as the owner, with a
-- fixed search_path so a caller cannot substitute its own tables. A later CREATE OR REPLACE of
-- this function must restate SECURITY DEFINER and the search_path (the replace resets them).
ALTER FUNCTION billing_rate_batch(bigint, integer) SECURITY DEFINER SET search_path = public, pg_temp;
