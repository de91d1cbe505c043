-- The portal's usage page and request log.
--
-- usage_daily: usage events summed per tenant, UTC day, key and model, so the usage page reads a
-- few hundred rows instead of summing up to millions of events per render. It is kept exact:
-- the rows are added in the same transaction as the events (a statement-level trigger over the
-- inserted rows only), so every committed event is counted exactly once, and the migration
-- backfills the events stored before it.
CREATE TABLE usage_daily (
    tenant_id         uuid NOT NULL,
    -- (started_at AT TIME ZONE 'UTC')::date: the page's days are UTC days.
    day               date NOT NULL,
    -- The nil uuid for events without a key (api_key_id is nullable), so the key can be part of
    -- the primary key.
    api_key_id        uuid NOT NULL,
    served_name       text NOT NULL,
    -- What the placeholder price is looked up by (base_models.name), as in db::spend.
    base_model        text NOT NULL,
    requests          bigint NOT NULL,
    prompt_tokens     bigint NOT NULL,
    cached_tokens     bigint NOT NULL,
    completion_tokens bigint NOT NULL,
    -- Sum over the events of money::cost_micros(prompt + completion, price of base_model): each
    -- event rounded up on its own, exactly as db::spend counts it. Re-priced when the price
    -- changes (usage_daily_reprice below), so it always equals db::spend's figure.
    cost_micros       bigint NOT NULL,
    PRIMARY KEY (tenant_id, day, api_key_id, served_name, base_model)
);

-- Adds the rows of an INSERT into usage_events. The transition table holds only the rows that
-- were inserted: with ON CONFLICT (request_id) DO NOTHING a replayed event is not in it, so it is
-- never counted twice (test: server/tests/usage_portal.rs,
-- usage_figures_equal_the_stored_events_and_the_spend_limit).
CREATE FUNCTION usage_daily_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Waits for a re-pricing in progress (it holds EXCLUSIVE), so the price read below is the one
    -- it committed; re-pricing in turn waits for inserts that got here first.
    LOCK TABLE usage_daily IN ROW EXCLUSIVE MODE;
    INSERT INTO usage_daily AS d (tenant_id, day, api_key_id, served_name, base_model, requests,
                                  prompt_tokens, cached_tokens, completion_tokens, cost_micros)
    SELECT e.tenant_id, (e.started_at AT TIME ZONE 'UTC')::date,
           COALESCE(e.api_key_id, '00000000-0000-0000-0000-000000000000'::uuid),
           e.served_name, e.base_model, count(*), SUM(e.prompt_tokens), SUM(e.cached_tokens),
           SUM(e.completion_tokens),
           COALESCE(SUM(((e.prompt_tokens + e.completion_tokens) * b.micros_per_1k_tokens + 999) / 1000), 0)
    FROM inserted e LEFT JOIN base_models b ON b.name = e.base_model
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
CREATE TRIGGER usage_daily_add AFTER INSERT ON usage_events
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_add();

-- Usage events are immutable; an UPDATE or DELETE would leave the rollup stale, so both are
-- refused (nothing in the product does either).
CREATE FUNCTION usage_events_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'usage_events rows are immutable (usage_daily sums them)';
END $$;
CREATE TRIGGER usage_events_immutable BEFORE UPDATE OR DELETE ON usage_events
    FOR EACH STATEMENT EXECUTE FUNCTION usage_events_immutable();

-- A base's placeholder price changed (or the base appeared or went): its rows' cost is summed
-- again from the events at the new price. Rare (an operator's UPDATE), and a scan of that base's
-- events; EXCLUSIVE waits for inserts in flight and holds new ones until this commits.
CREATE FUNCTION usage_daily_reprice() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    names text[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        names := ARRAY[NEW.name];
    ELSIF TG_OP = 'DELETE' THEN
        names := ARRAY[OLD.name];
    ELSE
        names := ARRAY[OLD.name, NEW.name];
    END IF;
    LOCK TABLE usage_daily IN EXCLUSIVE MODE;
    UPDATE usage_daily d SET cost_micros = COALESCE((
        SELECT SUM(((e.prompt_tokens + e.completion_tokens) * b.micros_per_1k_tokens + 999) / 1000)
        FROM usage_events e LEFT JOIN base_models b ON b.name = e.base_model
        WHERE e.tenant_id = d.tenant_id
          AND e.started_at >= d.day::timestamp AT TIME ZONE 'UTC'
          AND e.started_at < (d.day + 1)::timestamp AT TIME ZONE 'UTC'
          AND COALESCE(e.api_key_id, '00000000-0000-0000-0000-000000000000'::uuid) = d.api_key_id
          AND e.served_name = d.served_name AND e.base_model = d.base_model), 0)
    WHERE d.base_model = ANY (names);
    RETURN NULL;
END $$;
CREATE TRIGGER usage_daily_reprice_update AFTER UPDATE OF name, micros_per_1k_tokens ON base_models
    FOR EACH ROW WHEN (OLD.name IS DISTINCT FROM NEW.name
                       OR OLD.micros_per_1k_tokens IS DISTINCT FROM NEW.micros_per_1k_tokens)
    EXECUTE FUNCTION usage_daily_reprice();
CREATE TRIGGER usage_daily_reprice_insert_delete AFTER INSERT OR DELETE ON base_models
    FOR EACH ROW EXECUTE FUNCTION usage_daily_reprice();

-- Backfill: the events stored before this migration. CREATE TRIGGER above waited for inserts in
-- flight and holds new ones until this transaction commits, so every event is counted once:
-- by this statement or by the trigger.
INSERT INTO usage_daily (tenant_id, day, api_key_id, served_name, base_model, requests,
                         prompt_tokens, cached_tokens, completion_tokens, cost_micros)
SELECT e.tenant_id, (e.started_at AT TIME ZONE 'UTC')::date,
       COALESCE(e.api_key_id, '00000000-0000-0000-0000-000000000000'::uuid),
       e.served_name, e.base_model, count(*), SUM(e.prompt_tokens), SUM(e.cached_tokens),
       SUM(e.completion_tokens),
       COALESCE(SUM(((e.prompt_tokens + e.completion_tokens) * b.micros_per_1k_tokens + 999) / 1000), 0)
FROM usage_events e LEFT JOIN base_models b ON b.name = e.base_model
GROUP BY 1, 2, 3, 4, 5;

-- The request log: newest first per tenant, keyset-paginated on (started_at, request_id).
-- Replaces usage_events_tenant_time_idx, which it covers (same leading columns).
CREATE INDEX usage_events_tenant_log_idx ON usage_events (tenant_id, started_at DESC, request_id DESC);
DROP INDEX usage_events_tenant_time_idx;
