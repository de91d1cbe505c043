-- Issue 30: template changes roll out to running graphs. The controller stores the hash of what
-- it last applied for each graph (the rendered spec on Kubernetes), so an unchanged graph is not
-- applied again (no apply storm while an object is pending) and a changed template is: the
-- rollout's progress is shown on the admin fleet page.

-- The fingerprint of the spec last applied to the graph; NULL: none recorded yet (the next pass
-- applies and records it).
ALTER TABLE graphs ADD COLUMN spec_hash text;
-- Where that spec is: 'rolling' (applied, the backend not ready on it yet), 'rolled_out' (ready
-- on it), 'failed' (the backend refused it or failed on it; `rollout_reason` says why).
ALTER TABLE graphs ADD COLUMN rollout text
    CHECK (rollout IN ('rolling', 'rolled_out', 'failed'));
ALTER TABLE graphs ADD COLUMN rollout_reason text;
-- When `rollout` last changed.
ALTER TABLE graphs ADD COLUMN rollout_at timestamptz;
