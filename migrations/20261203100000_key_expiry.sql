-- Key rotation with a grace period (issue 15): the old key keeps working until `expires_at`, then
-- is refused like a revoked one. Separate from `revoked_at` (which still means "refused since"),
-- so every existing `revoked_at IS NULL` check keeps its meaning for replicas of the previous
-- release during a rollout; this release's gateway refuses a key once either is reached.
ALTER TABLE api_keys ADD COLUMN expires_at timestamptz;

-- A deadline set or moved must reach every replica's key cache at once (the cache also checks the
-- deadline itself on every request, so the key is refused at the deadline without a notification).
CREATE TRIGGER api_keys_expiry_changed AFTER UPDATE OF expires_at ON api_keys
    FOR EACH STATEMENT EXECUTE FUNCTION notify_auth_changed();
