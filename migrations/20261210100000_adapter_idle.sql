-- Idle adapters on a warm base are unloaded and reloaded on demand (issue 18). The graph keeps
-- running for its other models; only the one adapter leaves the engines' LoRA slots.

-- NULL: a base's adapters stay loaded while its graph is up; otherwise each adapter is unloaded
-- after this many seconds without a request of its own (the graph's own policy is apart).
ALTER TABLE base_templates ADD COLUMN adapter_idle_after_secs integer
    CHECK (adapter_idle_after_secs > 0);

-- 'unloading': idle; its routes hold new requests, and it leaves the engines after a grace
-- (a request forwarded just before the routes changed puts it back to 'ready' instead);
-- 'unloaded': not on any engine, requests are held and ask for a reload;
-- 'reloading': being loaded again for held requests.
ALTER TABLE adapters DROP CONSTRAINT adapters_state_check;
ALTER TABLE adapters ADD CONSTRAINT adapters_state_check CHECK (state IN
    ('uploading', 'validating', 'rejected', 'stopped', 'starting', 'ready', 'stopping', 'failed',
     'unloading', 'unloaded', 'reloading'));
-- Reloads started, and reloads that failed (a held request that sees this grow answers 503).
ALTER TABLE adapters ADD COLUMN reloads bigint NOT NULL DEFAULT 0;
ALTER TABLE adapters ADD COLUMN reload_failures bigint NOT NULL DEFAULT 0;

-- Each adapter's use, as the gateways flush it, and a held request's reload request. A table of
-- its own: every write to `adapters` notifies the gateways to rebuild their routes, and these
-- are written every second by every gateway that served the adapter.
CREATE TABLE adapter_use (
    adapter_id        uuid PRIMARY KEY REFERENCES adapters (id) ON DELETE CASCADE,
    -- When a request for it last arrived or was in flight on any gateway replica.
    last_active_at    timestamptz,
    -- Set by the first held request (one reload whatever the number of requests and replicas);
    -- cleared by the controller when the reload ends.
    reload_requested_at timestamptz
);
