-- Foundation schema: who may use Token Factory and how they prove it.
-- Later issues add their own tables (models, usage, prices, invoices) in new migrations.

-- A tenant is the unit of isolation and billing. Suspended tenants keep their data but every
-- API key and portal login of theirs is refused (403) until an admin reactivates them.
CREATE TABLE tenants (
    id          uuid PRIMARY KEY,
    -- Short unique handle used in the CLI, logs and as the default cache salt seed.
    name        text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    display_name text NOT NULL,
    status      text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended')),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Portal users. Admins operate the whole platform and belong to no tenant; tenant members
-- belong to exactly one tenant, and every query they trigger is scoped by it.
CREATE TABLE users (
    id            uuid PRIMARY KEY,
    -- Stored lower-cased so the unique index is case-insensitive without citext.
    email         text NOT NULL UNIQUE CHECK (email = lower(email) AND position('@' IN email) > 1),
    -- argon2id PHC string; passwords are low-entropy secrets and need a slow hash.
    password_hash text NOT NULL,
    role          text NOT NULL CHECK (role IN ('tenant_member', 'admin')),
    tenant_id     uuid REFERENCES tenants (id),
    created_at    timestamptz NOT NULL DEFAULT now(),
    CHECK ((role = 'admin') = (tenant_id IS NULL))
);
CREATE INDEX users_tenant_idx ON users (tenant_id);

-- API keys. The secret is 32 random bytes shown once; only its SHA-256 is kept (a fast hash is
-- right for a high-entropy secret and keeps the per-request lookup cheap). The visible prefix
-- lets a person tell keys apart in the portal without revealing them.
CREATE TABLE api_keys (
    id           uuid PRIMARY KEY,
    tenant_id    uuid NOT NULL REFERENCES tenants (id),
    name         text NOT NULL DEFAULT '',
    prefix       text NOT NULL UNIQUE,
    secret_sha256 bytea NOT NULL UNIQUE CHECK (octet_length(secret_sha256) = 32),
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- Updated in batches off the request path; approximate by design.
    last_used_at timestamptz,
    -- Non-null means refused; kept rather than deleted so usage keeps its key reference.
    revoked_at   timestamptz
);
CREATE INDEX api_keys_tenant_idx ON api_keys (tenant_id);

-- Portal sessions, in the shape tower-sessions' PostgreSQL store expects (schema and table
-- names are that crate's), so sessions survive restarts and are shared by every replica.
CREATE SCHEMA IF NOT EXISTS tower_sessions;
CREATE TABLE tower_sessions.session (
    id          text PRIMARY KEY NOT NULL,
    data        bytea NOT NULL,
    expiry_date timestamptz NOT NULL
);
CREATE INDEX session_expiry_idx ON tower_sessions.session (expiry_date);

-- Every replica keeps in-memory caches of keys and tenants; this trigger tells them what changed
-- (LISTEN tf_auth_changed) so a revoked key or a suspended tenant is refused within a second.
CREATE FUNCTION notify_auth_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tf_auth_changed', TG_TABLE_NAME);
    RETURN NULL;
END $$;
CREATE TRIGGER api_keys_changed AFTER UPDATE OF revoked_at OR DELETE ON api_keys
    FOR EACH STATEMENT EXECUTE FUNCTION notify_auth_changed();
CREATE TRIGGER tenants_changed AFTER INSERT OR UPDATE OF status OR DELETE ON tenants
    FOR EACH STATEMENT EXECUTE FUNCTION notify_auth_changed();
