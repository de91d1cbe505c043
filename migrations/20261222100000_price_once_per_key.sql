-- Price once per distinct key of a batch, not once per event (issue 35).
--
-- The usage rollup's trigger and the rater priced every event through a LATERAL call of
-- price_of_event / price_by_keys: two or three index probes (tenant, version, prices) per event,
-- about 4.5 us of the rollup's 5 us per event and 3 us of the rater's, on a machine where
-- PostgreSQL's share of a metered request was a quarter of the CPU. An event's price depends
-- only on (tenant, price key, served name, adapter or not, version) for the rollup and on
-- (version, tier, own key, price key) for the rater, and a batch holds few of those; the version
-- in effect changes rarely. Both now read the default book's versions once per batch as
-- intervals [effective_from, next effective_from), keep those that meet the batch's span, join
-- each event to its interval (the latest version effective at its start, as before), price each
-- distinct key once through the same functions, and join the prices back. Measured on a batch of
-- 700 (rollup) and 5,000 (rater) events without prices: 3.7 -> 1.6 us and 3.0 -> 1.55 us an event.
-- Test: `rating_plan::batch_pricing_equals_pricing_each_event`.
--
-- The version intervals are written out in both functions on purpose: as a set-returning function
-- of their own, the default estimate of 1,000 rows raised the rollup's planned cost past
-- jit_above_cost, and every shipper insert paid a JIT compile (about 50 ms; 88-120 us an event
-- against 19-28 inline). Inline, the rollup reaches that cost at about 22,000 events a statement
-- (the per-event pricing before it did at about 3,500); the shipper inserts at most 2,000.

-- The rater of 20261215100001_adapter_prices.sql with `ev` priced per distinct key. Restated with
-- the attributes a replace resets: a custom plan per call (20261213100000_rating_linear.sql) and
-- running as the owner with a fixed search_path (20261215100000_application_role.sql).
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
        ON CONFLICT (run_id, request_id) DO NOTHING
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

-- The usage rollup of 20261215100001_adapter_prices.sql, each event priced as price_of_event
-- prices it (the version in effect at its start, then price_in_version), once per distinct key.
-- MATERIALIZED: inlined, the planner may call the pricing per event again after the join.
CREATE OR REPLACE FUNCTION usage_daily_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH versions AS MATERIALIZED (
        SELECT v.id, v.since, v.until
        FROM (SELECT pv.id, pv.effective_from AS since,
                     lead(pv.effective_from, 1, 'infinity') OVER (ORDER BY pv.effective_from)
                         AS until
              FROM price_versions pv WHERE pv.book = 'default') v,
             (SELECT min(started_at) AS lo, max(started_at) AS hi FROM inserted) span
        WHERE v.until > span.lo AND v.since <= span.hi
    ), ev AS MATERIALIZED (
        SELECT e.tenant_id, e.started_at, e.api_key_id, e.served_name, e.base_model, e.status,
               e.prompt_tokens, e.cached_tokens, e.completion_tokens, e.price_key,
               e.adapter IS NOT NULL AS adapter, v.id AS version_id
        FROM inserted e
             LEFT JOIN versions v ON e.started_at >= v.since AND e.started_at < v.until
    ), priced AS MATERIALIZED (
        -- Rejected events cost nothing and an event without a version has no price: neither
        -- is looked up (their rates stay NULL, which line_amount reads as 0).
        SELECT k.tenant_id, k.price_key, k.served_name, k.adapter, k.version_id,
               p.fresh_input_per_m, p.cached_input_per_m, p.output_per_m
        FROM (SELECT DISTINCT tenant_id, price_key, served_name, adapter, version_id FROM ev
              WHERE status <> 'rejected' AND version_id IS NOT NULL) k,
             price_in_version(k.version_id, k.tenant_id, k.price_key, k.served_name,
                              k.adapter) p
    )
    INSERT INTO usage_daily AS d (tenant_id, day, api_key_id, served_name, base_model, requests,
                                  prompt_tokens, cached_tokens, completion_tokens, cost_micros)
    SELECT e.tenant_id, (e.started_at AT TIME ZONE 'UTC')::date,
           COALESCE(e.api_key_id, '00000000-0000-0000-0000-000000000000'::uuid),
           e.served_name, e.base_model, count(*), SUM(e.prompt_tokens), SUM(e.cached_tokens),
           SUM(e.completion_tokens),
           COALESCE(SUM(CASE WHEN e.status = 'rejected' THEN 0 ELSE
               line_amount(e.prompt_tokens - e.cached_tokens, e.cached_tokens,
                           e.completion_tokens, p.fresh_input_per_m, p.cached_input_per_m,
                           p.output_per_m) END), 0)
    FROM ev e
         LEFT JOIN priced p ON p.tenant_id = e.tenant_id AND p.price_key = e.price_key
                           AND p.served_name = e.served_name AND p.adapter = e.adapter
                           AND p.version_id = e.version_id
    GROUP BY 1, 2, 3, 4, 5
    -- One order for every writer, so two shippers updating the same rows cannot deadlock.
    ORDER BY 1, 2, 3, 4, 5
    ON CONFLICT (tenant_id, day, api_key_id, served_name, base_model) DO UPDATE SET
        requests = d.requests + EXCLUDED.requests,
        prompt_tokens = d.prompt_tokens + EXCLUDED.prompt_tokens,
        cached_tokens = d.cached_tokens + EXCLUDED.cached_tokens,
        completion_tokens = d.completion_tokens + EXCLUDED.completion_tokens,
        cost_micros = d.cost_micros + EXCLUDED.cost_micros;
    RETURN NULL;
END $$;
