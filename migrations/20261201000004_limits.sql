-- Limits: fast, approximate enforcement (requests and tokens per minute, spend per period,
-- concurrency caps), kept apart from billing. Every replica caches these rows for at most one
-- second and drops its cache when PostgreSQL notifies `tf_limits_changed`, so a change reaches
-- all replicas within a second. A NULL column means "no limit of that kind".

-- Limits of a whole tenant (all its keys together). The caps apply per graph: a tenant may run at
-- most max_in_flight requests, and at most max_long_prompts prompts of long_prompt_tokens or more,
-- on each serving graph at once, so one tenant's long prefills cannot monopolise a shared GPU.
CREATE TABLE tenant_limits (
    tenant_id          uuid PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    requests_per_minute bigint CHECK (requests_per_minute >= 0),
    -- Prompt + completion tokens, estimated at admission, corrected from real usage at completion.
    tokens_per_minute  bigint CHECK (tokens_per_minute >= 0),
    -- Spend per calendar month (UTC) in integer micro-units of currency.
    spend_limit_micros bigint CHECK (spend_limit_micros >= 0),
    max_in_flight      bigint CHECK (max_in_flight >= 0),
    max_long_prompts   bigint CHECK (max_long_prompts >= 0),
    -- Prompt estimate (tokens) from which a request counts as long; NULL: the server's default.
    long_prompt_tokens bigint CHECK (long_prompt_tokens > 0),
    updated_at         timestamptz NOT NULL DEFAULT now()
);

-- Limits of one API key, enforced in addition to its tenant's (the tighter one wins). Caps are
-- per tenant only. tenant_id is repeated so every query can be scoped by tenant.
CREATE TABLE key_limits (
    api_key_id         uuid PRIMARY KEY REFERENCES api_keys (id) ON DELETE CASCADE,
    tenant_id          uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    requests_per_minute bigint CHECK (requests_per_minute >= 0),
    tokens_per_minute  bigint CHECK (tokens_per_minute >= 0),
    spend_limit_micros bigint CHECK (spend_limit_micros >= 0),
    updated_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX key_limits_tenant_idx ON key_limits (tenant_id);

-- PLACEHOLDER until the billing issue lands versioned prices: a flat price per 1000 tokens
-- (prompt + completion) per base model, in micro-units, used only to estimate and count spend
-- for the spend limit. 0 means requests on this base cost nothing against the limit.
ALTER TABLE base_models ADD COLUMN micros_per_1k_tokens bigint NOT NULL DEFAULT 0
    CHECK (micros_per_1k_tokens >= 0);

-- Spend counted per key for the reconciler (which sums usage by key within the month).
CREATE INDEX usage_events_key_time_idx ON usage_events (api_key_id, started_at);

CREATE FUNCTION notify_limits_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tf_limits_changed', TG_TABLE_NAME);
    RETURN NULL;
END $$;
CREATE TRIGGER tenant_limits_changed AFTER INSERT OR UPDATE OR DELETE ON tenant_limits
    FOR EACH STATEMENT EXECUTE FUNCTION notify_limits_changed();
CREATE TRIGGER key_limits_changed AFTER INSERT OR UPDATE OR DELETE ON key_limits
    FOR EACH STATEMENT EXECUTE FUNCTION notify_limits_changed();
