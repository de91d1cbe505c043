-- The audit log: every admin and owner action (who, what, when, from where). Append-only, and
-- enforced here rather than in code: UPDATE, DELETE and TRUNCATE raise, whoever sends them.
CREATE TABLE audit_log (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at            timestamptz NOT NULL DEFAULT now(),
    -- The signed-in user who acted; NULL for the CLI and background jobs.
    actor_user_id uuid,
    -- Who, readable without a join and kept if the user is removed: an email, `cli` or `system`.
    actor         text NOT NULL CHECK (length(actor) BETWEEN 1 AND 320),
    -- The tenant acted on (NULL for platform-wide actions); tenants see only their own rows.
    tenant_id     uuid,
    -- Dotted verb, e.g. `key.create`, `tenant.suspend`, `bodies.opt_in`.
    action        text NOT NULL CHECK (action ~ '^[a-z_]+(\.[a-z_]+)+$'),
    -- What was acted on: a key prefix, an email, a model name.
    target        text NOT NULL DEFAULT '',
    detail        jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- The client address the request came from, when there was a request.
    source_ip     text
);
CREATE INDEX audit_log_tenant_idx ON audit_log (tenant_id, id DESC);

CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER audit_log_no_update_or_delete BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();
