-- One cost function (issue 16). The spend limit, quota's settlements, the usage pages and the
-- invoices price an event the same way: the default book's version in effect at the event's
-- start, the price of its price key in the tenant's tier (else 'standard'), fresh input, cached
-- input and output each at its rate per million, the sum rounded once, half-up to the micro-unit
-- (tf_core::money::line_micros is the same rule; the rater's billing_rate_batch applies it
-- set-based, and a test proves the usage rollup equals the rated amounts). An event with no
-- price costs 0 (the rater flags it 'unpriced'); a refused event costs 0. The placeholder flat
-- price base_models.micros_per_1k_tokens prices nothing any more.

-- The price of (tenant, key) in effect at `p_at`: at most one row. A SQL set-returning function
-- of one SELECT, so PostgreSQL inlines it into a LATERAL join (no per-row function call).
CREATE FUNCTION price_in_effect(p_tenant uuid, p_price_key text, p_at timestamptz)
RETURNS TABLE (version_id bigint, fresh_input_per_m bigint, cached_input_per_m bigint,
               output_per_m bigint)
LANGUAGE sql STABLE AS $$
    SELECT p.version_id, p.fresh_input_per_m, p.cached_input_per_m, p.output_per_m
    FROM (SELECT pv.id FROM price_versions pv
          WHERE pv.book = 'default' AND pv.effective_from <= p_at
          ORDER BY pv.effective_from DESC LIMIT 1) v
         CROSS JOIN (SELECT COALESCE((SELECT t.tier FROM tenants t WHERE t.id = p_tenant),
                                     'standard') AS tier) t
         JOIN prices p ON p.version_id = v.id AND p.price_key = p_price_key
                      AND p.tier IN (t.tier, 'standard')
    ORDER BY p.tier = t.tier DESC
    LIMIT 1
$$;

-- One line's amount: rounded once, half-up, in numeric so a huge count saturates instead of
-- raising (this runs inside the usage shipper's INSERT, which must never fail on arithmetic).
-- No price (NULL rates, from a LEFT JOIN that found none): 0.
CREATE FUNCTION line_amount(p_fresh bigint, p_cached bigint, p_output bigint, p_fresh_rate bigint,
                            p_cached_rate bigint, p_output_rate bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT LEAST(div(GREATEST(p_fresh, 0)::numeric * COALESCE(p_fresh_rate, 0)
                     + GREATEST(p_cached, 0)::numeric * COALESCE(p_cached_rate, 0)
                     + GREATEST(p_output, 0)::numeric * COALESCE(p_output_rate, 0) + 500000,
                     1000000),
                 9223372036854775807)::bigint
$$;

-- What one event costs (0 without a price).
CREATE FUNCTION charge_micros(p_tenant uuid, p_price_key text, p_at timestamptz, p_fresh bigint,
                              p_cached bigint, p_output bigint)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT COALESCE((SELECT line_amount(p_fresh, p_cached, p_output, p.fresh_input_per_m,
                                        p.cached_input_per_m, p.output_per_m)
                     FROM price_in_effect(p_tenant, p_price_key, p_at) p), 0)
$$;

-- The usage rollup prices with the price book (set-based over the inserted rows).
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
         LEFT JOIN LATERAL price_in_effect(e.tenant_id, e.price_key, e.started_at) p ON true
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

-- The flat price no longer prices anything, so changing it re-prices nothing. Price versions are
-- append-only and only go forward, so a stored day's cost stays right (as a rated line does).
DROP TRIGGER usage_daily_reprice_update ON base_models;
DROP TRIGGER usage_daily_reprice_insert_delete ON base_models;
DROP FUNCTION usage_daily_reprice();

-- A new price reaches every replica's quota cache at once (it is also re-read every second).
CREATE FUNCTION prices_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tf_limits_changed', TG_TABLE_NAME);
    RETURN NULL;
END $$;
CREATE TRIGGER prices_notify AFTER INSERT ON prices
    FOR EACH STATEMENT EXECUTE FUNCTION prices_notify();

-- The stored days, priced again under the book. SHARE holds new events until this commits, so
-- every event is counted once: here or by the trigger.
LOCK TABLE usage_events IN SHARE MODE;
DELETE FROM usage_daily;
INSERT INTO usage_daily (tenant_id, day, api_key_id, served_name, base_model, requests,
                         prompt_tokens, cached_tokens, completion_tokens, cost_micros)
SELECT e.tenant_id, (e.started_at AT TIME ZONE 'UTC')::date,
       COALESCE(e.api_key_id, '00000000-0000-0000-0000-000000000000'::uuid),
       e.served_name, e.base_model, count(*), SUM(e.prompt_tokens), SUM(e.cached_tokens),
       SUM(e.completion_tokens),
       COALESCE(SUM(CASE WHEN e.status = 'rejected' THEN 0 ELSE
           line_amount(e.prompt_tokens - e.cached_tokens, e.cached_tokens, e.completion_tokens,
                       p.fresh_input_per_m, p.cached_input_per_m, p.output_per_m) END), 0)
FROM usage_events e
     LEFT JOIN LATERAL price_in_effect(e.tenant_id, e.price_key, e.started_at) p ON true
GROUP BY 1, 2, 3, 4, 5;
