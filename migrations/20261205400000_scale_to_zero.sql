-- Scale to zero (issue 18): an idle graph is put to sleep (zero replicas, frontend and adapters
-- kept) and woken by the first request for it, which the gateway holds meanwhile.

-- NULL: always on (the template's replica floor); otherwise the graph sleeps after this many
-- seconds without a request in flight or arriving.
ALTER TABLE base_templates ADD COLUMN idle_after_secs integer CHECK (idle_after_secs > 0);

-- 'asleep': zero replicas, requests are held and ask for a wake; 'waking': scaling back up.
ALTER TABLE graphs DROP CONSTRAINT graphs_state_check;
ALTER TABLE graphs ADD CONSTRAINT graphs_state_check
    CHECK (state IN ('pending', 'ready', 'deleting', 'failed', 'asleep', 'waking'));
-- When a request last arrived or was in flight on any gateway replica (flushed every second or
-- so, off the request path); NULL: none since the graph was created.
ALTER TABLE graphs ADD COLUMN last_active_at timestamptz;
-- Set by the first held request (a conditional UPDATE, so one wake per graph across replicas);
-- cleared by the controller when the wake ends.
ALTER TABLE graphs ADD COLUMN wake_requested_at timestamptz;
-- Wakes started, and wakes that failed (a held request that sees this grow answers 503).
ALTER TABLE graphs ADD COLUMN wakes bigint NOT NULL DEFAULT 0;
ALTER TABLE graphs ADD COLUMN wake_failures bigint NOT NULL DEFAULT 0;

-- A graph's state is part of the resolution table (asleep routes hold their requests): its
-- changes notify the gateways like the catalog's own. Activity and wake requests do not.
CREATE TRIGGER graphs_catalog_changed AFTER INSERT OR DELETE OR UPDATE OF state, wake_failures
    ON graphs FOR EACH STATEMENT EXECUTE FUNCTION notify_catalog_changed();
-- When the graph entered its current state (`updated_at` moves with every replica count).
ALTER TABLE graphs ADD COLUMN state_since timestamptz NOT NULL DEFAULT now();
