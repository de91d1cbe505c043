-- Portal sessions move out of tower_sessions.session (issue 13):
-- * the id is kept only as its SHA-256 (the cookie holds the id itself), so a copy of this table
--   (a backup, a dump, a read replica) signs nobody in;
-- * every row names its user, so an operator ends a user's sessions after a password reset, or a
--   tenant's users' sessions on suspension, with one DELETE;
-- * only signed-in sessions are stored (anonymous visitors keep their CSRF token in a cookie), so
--   anonymous page loads add no rows.
-- tower_sessions.session is left in place for replicas of the previous release during a rollout
-- (their sessions are not carried over: those users sign in again); a later migration drops it.
CREATE TABLE portal_sessions (
    id_sha256   bytea PRIMARY KEY CHECK (octet_length(id_sha256) = 32),
    -- Deleting a user deletes their sessions.
    user_id     uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    -- tower-sessions' record data (a JSON object of session keys).
    data        jsonb NOT NULL,
    expiry_date timestamptz NOT NULL
);
-- "End every session of this user / of this tenant's users".
CREATE INDEX portal_sessions_user_idx ON portal_sessions (user_id);
-- The periodic purge of expired sessions.
CREATE INDEX portal_sessions_expiry_idx ON portal_sessions (expiry_date);
