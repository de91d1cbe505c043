-- Billing (issue 16), the exact side of money: versioned prices, rating runs with charge lines,
-- a per-day rollup the invoices sum, invoices that are immutable once issued, and credit grants.
-- Usage events are never touched; every amount is integer micro-units of one currency.

-- Tenants belong to a tier; a price names a tier.
CREATE TABLE billing_tiers (
    name       text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO billing_tiers (name) VALUES ('standard');
ALTER TABLE tenants ADD COLUMN tier text NOT NULL DEFAULT 'standard' REFERENCES billing_tiers (name);

-- A price book holds versions; a price change is a new version with its effective-from time,
-- never an edit (the trigger below refuses UPDATE and DELETE).
CREATE TABLE price_books (
    name       text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO price_books (name) VALUES ('default');

CREATE TABLE price_versions (
    id             bigserial PRIMARY KEY,
    book           text NOT NULL REFERENCES price_books (name),
    effective_from timestamptz NOT NULL,
    note           text NOT NULL DEFAULT '',
    created_by     text NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (book, effective_from)
);

-- Rates per million tokens, keyed by the event's price key (a model or its base) and tier.
CREATE TABLE prices (
    version_id          bigint NOT NULL REFERENCES price_versions (id),
    price_key           text NOT NULL,
    tier                text NOT NULL REFERENCES billing_tiers (name),
    fresh_input_per_m   bigint NOT NULL CHECK (fresh_input_per_m >= 0),
    cached_input_per_m  bigint NOT NULL CHECK (cached_input_per_m >= 0),
    output_per_m        bigint NOT NULL CHECK (output_per_m >= 0),
    PRIMARY KEY (version_id, price_key, tier)
);

CREATE FUNCTION billing_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only (% refused)', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END $$;
CREATE TRIGGER price_versions_append_only BEFORE UPDATE OR DELETE ON price_versions
    FOR EACH ROW EXECUTE FUNCTION billing_refuse_change();
CREATE TRIGGER prices_append_only BEFORE UPDATE OR DELETE ON prices
    FOR EACH ROW EXECUTE FUNCTION billing_refuse_change();

-- The placeholder flat prices of base_models (per 1,000 tokens, one rate for every token) become
-- the first version of the default book, effective since 1970 (before any event): rate per million = 1000 x it.
INSERT INTO price_versions (book, effective_from, note, created_by)
VALUES ('default', '1970-01-01 00:00:00+00', 'from base_models.micros_per_1k_tokens', 'migration');
INSERT INTO prices (version_id, price_key, tier, fresh_input_per_m, cached_input_per_m, output_per_m)
SELECT DISTINCT ON (b.price_key) v.id, b.price_key, 'standard', b.micros_per_1k_tokens * 1000,
       b.micros_per_1k_tokens * 1000, b.micros_per_1k_tokens * 1000
FROM base_models b, price_versions v
WHERE b.micros_per_1k_tokens > 0
ORDER BY b.price_key, b.micros_per_1k_tokens DESC;

-- A rating run: the continuous run (one, kind 'live', uses the version in effect at each event's
-- start) or an admin's re-rate of one tenant and period under a chosen version. Old runs are kept.
CREATE TABLE rating_runs (
    id               bigserial PRIMARY KEY,
    kind             text NOT NULL CHECK (kind IN ('live', 'rerate')),
    tenant_id        uuid REFERENCES tenants (id),
    period_start     timestamptz,
    period_end       timestamptz,
    price_version_id bigint REFERENCES price_versions (id),
    created_by       text NOT NULL DEFAULT '',
    created_at       timestamptz NOT NULL DEFAULT now(),
    CHECK ((kind = 'live') = (tenant_id IS NULL)),
    CHECK (kind = 'live' OR (period_start IS NOT NULL AND period_end > period_start
                             AND price_version_id IS NOT NULL))
);
CREATE UNIQUE INDEX rating_runs_one_live ON rating_runs ((kind)) WHERE kind = 'live';
INSERT INTO rating_runs (kind) VALUES ('live');

-- The live run's work list: every stored event not yet rated (rejected ones are never queued).
-- Filled in the shipper's own INSERT statement (a statement trigger with the inserted rows, as
-- usage_daily), so an event that commits late is never skipped (a time cursor could pass it);
-- the rater deletes what it rates in the same statement as the lines, so a crash loses or doubles
-- nothing.
CREATE TABLE rating_queue (
    request_id  uuid PRIMARY KEY,
    -- What rating needs, copied from the event so a batch never reads usage_events.
    tenant_id   uuid NOT NULL,
    price_key   text NOT NULL,
    started_at  timestamptz NOT NULL,
    provenance  text NOT NULL,
    fresh       bigint NOT NULL,
    cached      bigint NOT NULL,
    output      bigint NOT NULL
);
CREATE FUNCTION rating_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rating_queue (request_id, tenant_id, price_key, started_at, provenance, fresh,
                              cached, output)
    SELECT request_id, tenant_id, price_key, started_at, provenance,
           prompt_tokens - cached_tokens, cached_tokens, completion_tokens
    FROM inserted WHERE status <> 'rejected'
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER rating_enqueue AFTER INSERT ON usage_events
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION rating_enqueue();
INSERT INTO rating_queue (request_id, tenant_id, price_key, started_at, provenance, fresh, cached,
                          output)
SELECT request_id, tenant_id, price_key, started_at, provenance, prompt_tokens - cached_tokens,
       cached_tokens, completion_tokens
FROM usage_events WHERE status <> 'rejected';

-- A re-rate's position: its tenant's events in (started_at, request_id) order up to here.
CREATE TABLE rating_cursor (
    run_id        bigint PRIMARY KEY REFERENCES rating_runs (id),
    after_started timestamptz NOT NULL DEFAULT '-infinity',
    after_request uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000'
);

-- One line per (run, event): the event, the price version and the three quantities. The amount
-- is rounded once per line, half-up to the micro-unit:
--   (fresh * fresh_rate + cached * cached_rate + output * output_rate + 500000) / 1000000
-- (tf_core::money::line_micros is the same rule; bigint arithmetic raises on overflow, never
-- wraps). No price for the key (in the tenant's tier, else 'standard'): amount 0 and flag
-- 'unpriced', so every event still has exactly one line per run.
CREATE TABLE charge_lines (
    run_id           bigint NOT NULL REFERENCES rating_runs (id),
    request_id       uuid NOT NULL,
    tenant_id        uuid NOT NULL,
    price_key        text NOT NULL,
    started_at       timestamptz NOT NULL,
    price_version_id bigint REFERENCES price_versions (id),
    fresh_tokens     bigint NOT NULL,
    cached_tokens    bigint NOT NULL,
    output_tokens    bigint NOT NULL,
    amount_micros    bigint NOT NULL,
    -- '' for engine counts, else 'partial', 'estimated' or 'unpriced'.
    flag             text NOT NULL DEFAULT '',
    PRIMARY KEY (run_id, request_id)
);
-- No other index: every insert pays for each, and the readers (an invoice's lines, exports) walk
-- usage_events' time indexes and join here by the key.

-- Per run, tenant, UTC day, price key and price version: what a month's invoice sums (at most
-- ~31 x keys rows), kept by the rater in the same statement as the lines it inserts.
CREATE TABLE rated_daily (
    run_id           bigint NOT NULL REFERENCES rating_runs (id),
    tenant_id        uuid NOT NULL,
    day              date NOT NULL,
    price_key        text NOT NULL,
    price_version_id bigint NOT NULL DEFAULT 0,
    events           bigint NOT NULL,
    fresh_tokens     bigint NOT NULL,
    cached_tokens    bigint NOT NULL,
    output_tokens    bigint NOT NULL,
    amount_micros    bigint NOT NULL,
    PRIMARY KEY (run_id, tenant_id, day, price_key, price_version_id)
);

-- Rates up to `p_limit` events of run `p_run` in one set-based statement (lines and rollup
-- together) and returns how many events it took up (0: nothing left). The live run takes them
-- from rating_queue under the version in effect at each event's start; a re-rate walks its
-- tenant's period under its one version. Rejected events are never charged; an event already
-- rated in the run is skipped (ON CONFLICT), so re-running changes nothing.
CREATE FUNCTION billing_rate_batch(p_run bigint, p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    r     rating_runs%ROWTYPE;
    taken integer;
BEGIN
    SELECT * INTO STRICT r FROM rating_runs WHERE id = p_run;
    IF r.kind <> 'live' THEN
        INSERT INTO rating_cursor (run_id) VALUES (p_run) ON CONFLICT DO NOTHING;
    END IF;

    WITH queued AS (
        -- The live run: the oldest queued events, removed in this same transaction.
        -- (by ctid: a TID scan of just these rows, not a join with the whole queue)
        DELETE FROM rating_queue WHERE r.kind = 'live' AND ctid = ANY (ARRAY(
            SELECT ctid FROM rating_queue ORDER BY request_id LIMIT p_limit
            FOR UPDATE SKIP LOCKED))
        RETURNING request_id, tenant_id, price_key, started_at, provenance, fresh, cached, output,
                  'ok'::text AS status
    ), walked AS (
        -- A re-rate: its tenant's period in (started_at, request_id) order after its cursor.
        SELECT e.request_id, e.tenant_id, e.price_key, e.started_at, e.provenance,
               e.prompt_tokens - e.cached_tokens AS fresh, e.cached_tokens AS cached,
               e.completion_tokens AS output, e.status
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
               COALESCE(t.tier, 'standard') AS tier
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
        FROM ev LEFT JOIN LATERAL (
            SELECT * FROM prices p
            WHERE p.version_id = ev.version_id AND p.price_key = ev.price_key
              AND p.tier IN (ev.tier, 'standard')
            ORDER BY p.tier = ev.tier DESC LIMIT 1) p ON true
    ), lines AS (
        INSERT INTO charge_lines (run_id, request_id, tenant_id, price_key, started_at,
                                  price_version_id, fresh_tokens, cached_tokens, output_tokens,
                                  amount_micros, flag)
        SELECT p_run, request_id, tenant_id, price_key, started_at, version_id,
               fresh, cached, output,
               COALESCE((fresh * fresh_input_per_m + cached * cached_input_per_m
                         + output * output_per_m + 500000) / 1000000, 0),
               CASE WHEN priced_by IS NULL THEN 'unpriced'
                    WHEN provenance = 'engine' THEN '' ELSE provenance END
        FROM priced
        ON CONFLICT (run_id, request_id) DO NOTHING
        RETURNING run_id, tenant_id, started_at, price_key, price_version_id, fresh_tokens,
                  cached_tokens, output_tokens, amount_micros
    ), rolled AS (
        INSERT INTO rated_daily AS d (run_id, tenant_id, day, price_key, price_version_id, events,
                                      fresh_tokens, cached_tokens, output_tokens, amount_micros)
        SELECT run_id, tenant_id, (started_at AT TIME ZONE 'UTC')::date, price_key,
               COALESCE(price_version_id, 0), count(*), sum(fresh_tokens), sum(cached_tokens),
               sum(output_tokens), sum(amount_micros)
        FROM lines GROUP BY 1, 2, 3, 4, 5
        ORDER BY 1, 2, 3, 4, 5
        ON CONFLICT (run_id, tenant_id, day, price_key, price_version_id) DO UPDATE SET
            events = d.events + EXCLUDED.events,
            fresh_tokens = d.fresh_tokens + EXCLUDED.fresh_tokens,
            cached_tokens = d.cached_tokens + EXCLUDED.cached_tokens,
            output_tokens = d.output_tokens + EXCLUDED.output_tokens,
            amount_micros = d.amount_micros + EXCLUDED.amount_micros
    )
    SELECT count(*) INTO taken FROM src;
    RETURN taken;
END $$;

-- Prepaid credit: grants with expiry and priority that burn down before charges are invoiced
-- (lowest priority number first, then earliest expiry).
CREATE TABLE credit_grants (
    id            uuid PRIMARY KEY,
    tenant_id     uuid NOT NULL REFERENCES tenants (id),
    amount_micros bigint NOT NULL CHECK (amount_micros > 0),
    priority      integer NOT NULL DEFAULT 0,
    expires_at    timestamptz,
    note          text NOT NULL DEFAULT '',
    granted_by    text NOT NULL DEFAULT '',
    granted_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX credit_grants_tenant_idx ON credit_grants (tenant_id);

-- Invoices per tenant and UTC calendar month: a draft while open, issued and immutable after.
CREATE TABLE invoices (
    id            uuid PRIMARY KEY,
    tenant_id     uuid NOT NULL REFERENCES tenants (id),
    period_start  date NOT NULL CHECK (extract(day FROM period_start) = 1),
    kind          text NOT NULL DEFAULT 'invoice' CHECK (kind IN ('invoice', 'credit_note')),
    -- The invoice a credit note corrects, or the one a corrected invoice replaces.
    corrects      uuid REFERENCES invoices (id),
    status        text NOT NULL DEFAULT 'draft' CHECK (status IN ('draft', 'issued')),
    run_id        bigint NOT NULL REFERENCES rating_runs (id),
    total_micros  bigint NOT NULL DEFAULT 0,
    issued_at     timestamptz,
    issued_by     text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'issued') = (issued_at IS NOT NULL))
);
CREATE UNIQUE INDEX invoices_one_draft ON invoices (tenant_id, period_start, kind)
    WHERE status = 'draft';

-- Lines per price key with quantities and amounts; credits and adjustments are their own entries.
CREATE TABLE invoice_entries (
    invoice_id    uuid NOT NULL REFERENCES invoices (id),
    position      integer NOT NULL,
    kind          text NOT NULL CHECK (kind IN ('usage', 'credit', 'adjustment')),
    description   text NOT NULL,
    price_key     text,
    events        bigint NOT NULL DEFAULT 0,
    fresh_tokens  bigint NOT NULL DEFAULT 0,
    cached_tokens bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    amount_micros bigint NOT NULL,
    -- The grant a 'credit' entry burns.
    grant_id      uuid REFERENCES credit_grants (id),
    PRIMARY KEY (invoice_id, position)
);

-- Immutability in the database, whatever role connects: an issued invoice and its entries can be
-- neither updated nor deleted; a draft may be rebuilt or issued (draft -> issued is the one
-- update allowed, and it may not change the figures the entries sum to).
CREATE FUNCTION invoices_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'issued' THEN
        RAISE EXCEPTION 'invoice % is issued and immutable (% refused)', OLD.id, TG_OP
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END $$;
CREATE TRIGGER invoices_immutable BEFORE UPDATE OR DELETE ON invoices
    FOR EACH ROW EXECUTE FUNCTION invoices_guard();

CREATE FUNCTION invoice_entries_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    inv uuid := CASE WHEN TG_OP = 'INSERT' THEN NEW.invoice_id ELSE OLD.invoice_id END;
BEGIN
    IF EXISTS (SELECT 1 FROM invoices WHERE id = inv AND status = 'issued') THEN
        RAISE EXCEPTION 'invoice % is issued and immutable (% on entries refused)', inv, TG_OP
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END $$;
CREATE TRIGGER invoice_entries_immutable BEFORE INSERT OR UPDATE OR DELETE ON invoice_entries
    FOR EACH ROW EXECUTE FUNCTION invoice_entries_guard();
-- TRUNCATE bypasses row triggers; refuse it outright.
CREATE TRIGGER invoices_no_truncate BEFORE TRUNCATE ON invoices
    FOR EACH STATEMENT EXECUTE FUNCTION billing_refuse_change();
CREATE TRIGGER invoice_entries_no_truncate BEFORE TRUNCATE ON invoice_entries
    FOR EACH STATEMENT EXECUTE FUNCTION billing_refuse_change();
