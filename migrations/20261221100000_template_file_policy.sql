-- The serving policy (floor and graph idle-after) the template file gave at the last start-up
-- (issue 36). Start-up upserts every template again; a policy an operator applied since
-- (`operator::set_serving_policy`, `operator::set_idle_policy`) must survive that, or a restart
-- silently undoes it. So the upsert compares the file's policy with the one recorded here: the
-- same (the file did not change) keeps the row's `replicas_min` and `idle_after_secs` as the
-- operator left them; different (an edited file is the operator's newer word) writes the file's.
-- NULL: not recorded yet (rows from before this column), so the next start-up writes the file's.
-- Shape: {"floor": <int>, "idle_after_secs": <int or null>}.
ALTER TABLE base_templates ADD COLUMN file_policy jsonb;
