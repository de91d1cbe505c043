-- Stored request bodies (issue 15): the prompt and completion of a request, kept only for tenants
-- that opted in (tenants.body_logging), each bounded by the gateway (truncated flags say when a
-- body was cut; the sizes are the original lengths in bytes). request_id is the usage event's
-- request id; it is not a foreign key because usage events reach PostgreSQL through the journal
-- shipper and may land after the body (the /logs detail page joins on it).
CREATE TABLE stored_bodies (
    request_id           uuid PRIMARY KEY,
    tenant_id            uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    prompt               text NOT NULL,
    prompt_truncated     boolean NOT NULL,
    prompt_bytes         integer NOT NULL CHECK (prompt_bytes >= 0),
    completion           text NOT NULL,
    completion_truncated boolean NOT NULL,
    completion_bytes     integer NOT NULL CHECK (completion_bytes >= 0),
    created_at           timestamptz NOT NULL DEFAULT now()
);

-- The retention job deletes per tenant by age; delete-all is per tenant.
CREATE INDEX stored_bodies_tenant_created_idx ON stored_bodies (tenant_id, created_at);

-- The gateway caches each key's tenant opt-in with the key (no I/O on the request path); an
-- opt-in or opt-out reaches every replica's cache the way a suspension does. Only a real change
-- notifies (row level, WHEN): saving the settings page with the flag as it was must not empty
-- every replica's key cache.
CREATE TRIGGER tenants_body_logging_changed AFTER UPDATE OF body_logging ON tenants
    FOR EACH ROW WHEN (OLD.body_logging IS DISTINCT FROM NEW.body_logging)
    EXECUTE FUNCTION notify_auth_changed();
