-- Plain inserts where a conflict cannot happen or is ruled out beforehand (issue 35).
--
-- `INSERT ... ON CONFLICT DO NOTHING` inserts each row speculatively: it probes the arbiter index,
-- inserts the heap tuple and its index entries under a speculative token, then confirms it (one
-- more WAL record). Measured on this machine, 10,000 rows a statement: a charge_lines insert 1.5
-- -> 2.7 us a row with the clause, the same with `WHERE NOT EXISTS` on the key 1.5-1.8. Every
-- metered request paid it three times: the shipper's usage_events insert, the rating queue's, the
-- live run's charge lines.
--
-- * rating_queue: a row is queued only from the insert's transition table, which holds only the
--   events that statement stored, and events are never deleted (usage_events_immutable) while a
--   queued row lives only until its event is rated, so a new event cannot already be queued. The
--   plain insert runs in a block that falls back to the old one on a unique violation: the same
--   outcome as before if that reasoning ever failed, at the cost of one subtransaction a statement.
-- * charge_lines: the lines already there are skipped by `NOT EXISTS` on the line's key (a
--   re-rate's catch-up walks over them on purpose; the live run's queue holds an event once).
--   What ON CONFLICT also covered, two batches of one re-rate inserting the same line at once (a
--   draft built while the re-rate drains), is ruled out by taking the re-rate's cursor row first.
--   (The cursor's own `INSERT ... ON CONFLICT DO NOTHING` already waited on a running batch that
--   had moved the cursor; the lock says so instead of leaning on that.)
-- * usage_events: the shipper inserts plainly and repeats the insert with ON CONFLICT only when
--   it fails on a unique key (a batch replayed after a crash; core/src/db/usage.rs).
--
-- Tests: rating_plan::batch_pricing_equals_pricing_each_event, billing's re-rate and catch-up
-- tests, the journal's replay tests (a batch inserted twice counts once).

CREATE OR REPLACE FUNCTION rating_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    BEGIN
        INSERT INTO rating_queue (request_id, tenant_id, price_key, started_at, provenance, fresh,
                                  cached, output, served_name, adapter)
        SELECT request_id, tenant_id, price_key, started_at, provenance,
               prompt_tokens - cached_tokens, cached_tokens, completion_tokens, served_name,
               adapter IS NOT NULL
        FROM inserted WHERE status <> 'rejected';
    EXCEPTION WHEN unique_violation THEN
        INSERT INTO rating_queue (request_id, tenant_id, price_key, started_at, provenance, fresh,
                                  cached, output, served_name, adapter)
        SELECT request_id, tenant_id, price_key, started_at, provenance,
               prompt_tokens - cached_tokens, cached_tokens, completion_tokens, served_name,
               adapter IS NOT NULL
        FROM inserted WHERE status <> 'rejected'
        ON CONFLICT DO NOTHING;
    END;
    RETURN NULL;
END $$;

-- The rater of 20261222100000_price_once_per_key.sql with its lines inserted plainly (above).
-- Restated with the attributes a replace resets: a custom plan per call, running as the owner
-- with a fixed search_path.
CREATE OR REPLACE FUNCTION billing_rate_batch(p_run bigint, p_limit integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    r     rating_runs%ROWTYPE;
    taken integer;
BEGIN
    SELECT * INTO STRICT r FROM rating_runs WHERE id = p_run;
    IF r.kind <> 'live' THEN
        INSERT INTO rating_cursor (run_id) VALUES (p_run) ON CONFLICT DO NOTHING;
        -- One batch of a re-rate at a time: the next one waits here, then its statement (a new
        -- snapshot) sees this one's lines and cursor, so the NOT EXISTS below never races.
        PERFORM 1 FROM rating_cursor WHERE run_id = p_run FOR UPDATE;
    END IF;

    WITH queued AS (
        DELETE FROM rating_queue WHERE r.kind = 'live' AND ctid = ANY (ARRAY(
            SELECT ctid FROM rating_queue ORDER BY request_id LIMIT p_limit
            FOR UPDATE SKIP LOCKED))
        RETURNING request_id, tenant_id, price_key, started_at, provenance, fresh, cached, output,
                  'ok'::text AS status, served_name, adapter
    ), walked AS (
        SELECT e.request_id, e.tenant_id, e.price_key, e.started_at, e.provenance,
               e.prompt_tokens - e.cached_tokens AS fresh, e.cached_tokens AS cached,
               e.completion_tokens AS output, e.status, e.served_name,
               e.adapter IS NOT NULL AS adapter
        FROM usage_events e, rating_cursor c
        WHERE r.kind <> 'live' AND c.run_id = p_run AND e.tenant_id = r.tenant_id
          AND e.started_at >= r.period_start AND e.started_at < r.period_end
          AND (e.started_at, e.request_id) > (c.after_started, c.after_request)
        ORDER BY e.started_at, e.request_id LIMIT p_limit
    ), src AS (
        SELECT * FROM queued UNION ALL SELECT * FROM walked
    ), moved AS (
        UPDATE rating_cursor c SET after_started = w.started_at, after_request = w.request_id
        FROM (SELECT started_at, request_id FROM walked
              ORDER BY started_at DESC, request_id DESC LIMIT 1) w
        WHERE c.run_id = p_run
    ), versions AS MATERIALIZED (
        -- A live run's versions over the batch's span, as intervals (a re-rate has its own).
        SELECT v.id, v.since, v.until
        FROM (SELECT pv.id, pv.effective_from AS since,
                     lead(pv.effective_from, 1, 'infinity') OVER (ORDER BY pv.effective_from)
                         AS until
              FROM price_versions pv WHERE r.kind = 'live' AND pv.book = 'default') v,
             (SELECT min(started_at) AS lo, max(started_at) AS hi FROM src) span
        WHERE v.until > span.lo AND v.since <= span.hi
    ), ev AS (
        SELECT s.*,
               CASE WHEN r.kind = 'live' THEN v.id ELSE r.price_version_id END AS version_id,
               COALESCE(t.tier, 'standard') AS tier,
               adapter_price_key(t.name, s.served_name, s.adapter) AS own_key
        FROM src s
             LEFT JOIN tenants t ON t.id = s.tenant_id
             LEFT JOIN versions v ON s.started_at >= v.since AND s.started_at < v.until
        WHERE s.status <> 'rejected'
    ), by_key AS MATERIALIZED (
        -- NULLs as sentinels so the join back can hash: versions are positive, and an own key
        -- is NULL or starts with 'adapter:'.
        SELECT COALESCE(k.version_id, -1) AS version_key, k.tier, COALESCE(k.own_key, '') AS own,
               k.price_key, p.version_id AS priced_by, p.fresh_input_per_m,
               p.cached_input_per_m, p.output_per_m
        FROM (SELECT DISTINCT version_id, tier, own_key, price_key FROM ev) k
             LEFT JOIN LATERAL price_by_keys(k.version_id, k.tier, k.own_key, k.price_key) p
             ON true
    ), priced AS (
        SELECT ev.*, b.priced_by, b.fresh_input_per_m, b.cached_input_per_m, b.output_per_m
        FROM ev JOIN by_key b
             ON b.version_key = COALESCE(ev.version_id, -1) AND b.tier = ev.tier
            AND b.own = COALESCE(ev.own_key, '') AND b.price_key = ev.price_key
    ), lines AS (
        INSERT INTO charge_lines (run_id, request_id, tenant_id, price_key, started_at,
                                  price_version_id, fresh_tokens, cached_tokens, output_tokens,
                                  amount_micros, flag, served_name)
        SELECT p_run, request_id, tenant_id, price_key, started_at, version_id,
               fresh, cached, output,
               COALESCE((fresh * fresh_input_per_m + cached * cached_input_per_m
                         + output * output_per_m + 500000) / 1000000, 0),
               CASE WHEN priced_by IS NULL THEN 'unpriced'
                    WHEN provenance = 'engine' THEN '' ELSE provenance END,
               served_name
        FROM priced
        WHERE NOT EXISTS (SELECT 1 FROM charge_lines x
                          WHERE x.run_id = p_run AND x.request_id = priced.request_id)
        RETURNING run_id, tenant_id, started_at, price_key, price_version_id, fresh_tokens,
                  cached_tokens, output_tokens, amount_micros, served_name
    ), rolled AS (
        INSERT INTO rated_daily AS d (run_id, tenant_id, day, price_key, price_version_id,
                                      served_name, events, fresh_tokens, cached_tokens,
                                      output_tokens, amount_micros)
        SELECT run_id, tenant_id, (started_at AT TIME ZONE 'UTC')::date, price_key,
               COALESCE(price_version_id, 0), served_name, count(*), sum(fresh_tokens),
               sum(cached_tokens), sum(output_tokens), sum(amount_micros)
        FROM lines GROUP BY 1, 2, 3, 4, 5, 6
        ORDER BY 1, 2, 3, 4, 5, 6
        ON CONFLICT (run_id, tenant_id, day, price_key, price_version_id, served_name)
        DO UPDATE SET
            events = d.events + EXCLUDED.events,
            fresh_tokens = d.fresh_tokens + EXCLUDED.fresh_tokens,
            cached_tokens = d.cached_tokens + EXCLUDED.cached_tokens,
            output_tokens = d.output_tokens + EXCLUDED.output_tokens,
            amount_micros = d.amount_micros + EXCLUDED.amount_micros
    )
    SELECT count(*) INTO taken FROM src;
    RETURN taken;
END $$;
