-- Adapter prices and invoice lines per model (issue 31).
--
-- A price may name an adapter as well as a base: its key is `adapter:<tenant>/<adapter>` (the
-- tenant's handle and the adapter's served name; served names are unique only within a tenant, and
-- no base's key is expected to start with `adapter:`). An adapter's request is priced by its own key
-- where the version holds it, else by its base's (the event's price key), in the tenant's tier
-- before 'standard', own key first. Every reader prices that way through one function,
-- price_by_keys (the rater directly, with the tenant hash-joined per batch; the usage rollup the
-- spend limit reconciles from, the request log and the models page through price_in_version and
-- price_of_event), so an invoice, the usage page and a log entry agree.
--
-- Charge lines and the daily rollup also keep the served name, so an invoice has one usage line
-- per model (adapters as their own lines after their base's key), row for row with the usage
-- page. Lines rated before this migration have served_name '' and are shown under their price
-- key, as before.

-- The price of `p_own_key` (an adapter's own key, NULL for a base's request), else of
-- `p_price_key`, in `p_version` for tier `p_tier` (else 'standard'): at most one row. Two probes
-- of prices' primary key, own key first; the first that finds a row wins. A SQL set-returning
-- function of one SELECT, inlined into the callers' LATERAL joins (no per-row call).
CREATE FUNCTION price_by_keys(p_version bigint, p_tier text, p_own_key text, p_price_key text)
RETURNS TABLE (version_id bigint, price_key text, fresh_input_per_m bigint,
               cached_input_per_m bigint, output_per_m bigint)
LANGUAGE sql STABLE AS $$
    SELECT x.* FROM ((SELECT p.version_id, p.price_key, p.fresh_input_per_m,
                             p.cached_input_per_m, p.output_per_m
                      FROM prices p
                      WHERE p.version_id = p_version AND p.price_key = p_own_key
                        AND p.tier IN (p_tier, 'standard')
                      ORDER BY p.tier = p_tier DESC LIMIT 1)
                     UNION ALL
                     (SELECT p.version_id, p.price_key, p.fresh_input_per_m,
                             p.cached_input_per_m, p.output_per_m
                      FROM prices p
                      WHERE p.version_id = p_version AND p.price_key = p_price_key
                        AND p.tier IN (p_tier, 'standard')
                      ORDER BY p.tier = p_tier DESC LIMIT 1)) x
    LIMIT 1
$$;

-- An adapter's own price key, `adapter:<tenant>/<served name>` (NULL for a base's request or an
-- unknown tenant).
CREATE FUNCTION adapter_price_key(p_tenant_name text, p_served text, p_adapter boolean)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_adapter THEN 'adapter:' || p_tenant_name || '/' || p_served END
$$;

-- The price of an event of (tenant, price key, served name, adapter or not) in `p_version`: the
-- tenant's tier and handle looked up, then price_by_keys.
CREATE FUNCTION price_in_version(p_version bigint, p_tenant uuid, p_price_key text,
                                 p_served text, p_adapter boolean)
RETURNS TABLE (version_id bigint, price_key text, fresh_input_per_m bigint,
               cached_input_per_m bigint, output_per_m bigint)
LANGUAGE sql STABLE AS $$
    SELECT p.*
    FROM (SELECT 1) one LEFT JOIN tenants t ON t.id = p_tenant,
         price_by_keys(p_version, COALESCE(t.tier, 'standard'),
                       adapter_price_key(t.name, p_served, p_adapter), p_price_key) p
$$;

-- The same, in the default book's version in effect at `p_at` (an event's start).
CREATE FUNCTION price_of_event(p_tenant uuid, p_price_key text, p_served text, p_adapter boolean,
                               p_at timestamptz)
RETURNS TABLE (version_id bigint, price_key text, fresh_input_per_m bigint,
               cached_input_per_m bigint, output_per_m bigint)
LANGUAGE sql STABLE AS $$
    SELECT p.* FROM (SELECT pv.id FROM price_versions pv
                     WHERE pv.book = 'default' AND pv.effective_from <= p_at
                     ORDER BY pv.effective_from DESC LIMIT 1) v,
                    price_in_version(v.id, p_tenant, p_price_key, p_served, p_adapter) p
$$;

-- What one event costs (0 without a price): the request log's figure.
CREATE FUNCTION charge_micros_of_event(p_tenant uuid, p_price_key text, p_served text,
                                       p_adapter boolean, p_at timestamptz, p_fresh bigint,
                                       p_cached bigint, p_output bigint)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT COALESCE((SELECT line_amount(p_fresh, p_cached, p_output, p.fresh_input_per_m,
                                        p.cached_input_per_m, p.output_per_m)
                     FROM price_of_event(p_tenant, p_price_key, p_served, p_adapter, p_at) p), 0)
$$;

-- The rater's queue carries what pricing by model needs (queued events are filled in from their
-- stored rows).
ALTER TABLE rating_queue ADD COLUMN served_name text NOT NULL DEFAULT '',
                         ADD COLUMN adapter boolean NOT NULL DEFAULT false;
UPDATE rating_queue q SET served_name = e.served_name, adapter = e.adapter IS NOT NULL
FROM usage_events e WHERE e.request_id = q.request_id;

CREATE OR REPLACE FUNCTION rating_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rating_queue (request_id, tenant_id, price_key, started_at, provenance, fresh,
                              cached, output, served_name, adapter)
    SELECT request_id, tenant_id, price_key, started_at, provenance,
           prompt_tokens - cached_tokens, cached_tokens, completion_tokens, served_name,
           adapter IS NOT NULL
    FROM inserted WHERE status <> 'rejected'
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;

-- Lines and the rollup by model. ADD COLUMN with a constant default rewrites nothing.
ALTER TABLE charge_lines ADD COLUMN served_name text NOT NULL DEFAULT '';
ALTER TABLE rated_daily ADD COLUMN served_name text NOT NULL DEFAULT '';
ALTER TABLE rated_daily DROP CONSTRAINT rated_daily_pkey,
    ADD PRIMARY KEY (run_id, tenant_id, day, price_key, price_version_id, served_name);

-- The rater of 20261206100000_billing.sql, pricing through price_in_version and keeping the
-- served name (the tenant's tier and handle hash-joined once per batch, then price_by_keys, the
-- body of price_in_version). Restated with the attributes a replace resets: a custom plan per call
-- (20261213100000_rating_linear.sql) and running as the owner with a fixed search_path
-- (20261215100000_application_role.sql).
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
    ), ev AS (
        SELECT s.*,
               CASE WHEN r.kind = 'live' THEN v.id ELSE r.price_version_id END AS version_id,
               COALESCE(t.tier, 'standard') AS tier,
               adapter_price_key(t.name, s.served_name, s.adapter) AS own_key
        FROM src s
             LEFT JOIN tenants t ON t.id = s.tenant_id
             LEFT JOIN LATERAL (
                 SELECT pv.id FROM price_versions pv
                 WHERE r.kind = 'live' AND pv.book = 'default' AND pv.effective_from <= s.started_at
                 ORDER BY pv.effective_from DESC LIMIT 1) v ON true
        WHERE s.status <> 'rejected'
    ), priced AS (
        SELECT ev.*, p.version_id AS priced_by, p.fresh_input_per_m, p.cached_input_per_m,
               p.output_per_m
        FROM ev LEFT JOIN LATERAL price_by_keys(ev.version_id, ev.tier, ev.own_key,
                                                ev.price_key) p ON true
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

-- The usage rollup (what the usage page shows and the spend limit reconciles from) prices by
-- model too. From here on; stored days keep the figures they were stored with (no adapter had a
-- price of its own before this migration, so they are the same).
CREATE OR REPLACE FUNCTION usage_daily_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
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
    FROM inserted e
         LEFT JOIN LATERAL price_of_event(e.tenant_id, e.price_key, e.served_name,
                                          e.adapter IS NOT NULL, e.started_at) p ON true
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
