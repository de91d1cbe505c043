-- Rating in linear time, whatever the plan cache holds (issue 35).
--
-- 1. billing_rate_batch ran with a cached generic plan once a pooled connection had called it a
--    few times on an empty queue: `r.kind = 'live'` stayed a parameter, and the live DELETE by
--    `ctid = ANY(array)` became a sequential scan of the whole queue filtered by a 20,000-element
--    array (queue size x 20,000 comparisons a batch: 31 s a batch with 200,000 queued, measured).
--    With a custom plan each call, the run's kind is a constant and the DELETE is a TID scan of
--    just the batch's rows (0.75 s a batch at any queue size, same machine, same run). Planning a
--    custom plan costs well under a millisecond against a batch of 20,000 events.
ALTER FUNCTION billing_rate_batch(bigint, integer) SET plan_cache_mode = force_custom_plan;

-- 2. charge_lines' two foreign keys were checked row by row: 40,000 index probes a batch (two per
--    line), about two thirds of a batch's time (0.79 s -> 0.27 s a batch without them, measured
--    in one run). Their guarantee stays, checked once per statement over the inserted rows (one
--    anti-join against two small tables), and the rows they point at can no longer go away.
ALTER TABLE charge_lines DROP CONSTRAINT charge_lines_run_id_fkey,
                         DROP CONSTRAINT charge_lines_price_version_id_fkey;

CREATE FUNCTION charge_lines_refs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted i
               WHERE NOT EXISTS (SELECT 1 FROM rating_runs r WHERE r.id = i.run_id)
                  OR (i.price_version_id IS NOT NULL
                      AND NOT EXISTS (SELECT 1 FROM price_versions v
                                      WHERE v.id = i.price_version_id))) THEN
        RAISE EXCEPTION 'charge_lines: a line names a rating run or price version that does not exist'
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER charge_lines_refs AFTER INSERT ON charge_lines
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION charge_lines_refs();

-- What the foreign key also kept: a rating run a line names is never deleted or renumbered
-- (price_versions is append-only already).
CREATE FUNCTION rating_runs_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR NEW.id <> OLD.id THEN
        RAISE EXCEPTION 'rating_runs are kept (% refused)', TG_OP
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER rating_runs_keep BEFORE UPDATE OR DELETE ON rating_runs
    FOR EACH ROW EXECUTE FUNCTION rating_runs_keep();
