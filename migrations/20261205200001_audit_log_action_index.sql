-- /admin/audit filters by action (or a family: `tenant` is every `tenant.*`), newest first,
-- keyset-paginated by id; this index serves both without scanning the log.
CREATE INDEX audit_log_action_idx ON audit_log (action, id DESC);
