-- Issue 31: billing periods that close, and drafts that remember what they were built from.
--
-- A tenant's invoice for a UTC month covers an interval of event start times, [covers_from,
-- covers_until): normally the calendar month, shortened by an explicit early close, in which case
-- the next month's invoice starts at the close instead (what starts after a close is on the next
-- invoice, never on none). A draft is built from segments of that interval, each rated by one
-- run: a re-rate the admin chose for its part, the live run for the rest; the draft keeps the
-- segments (invoice_sources), so a scheduled rebuild builds from the same runs.

-- An explicit early close of a tenant's month, at a stated instant inside the month. One per
-- tenant and month, never changed.
CREATE TABLE period_closes (
    tenant_id    uuid NOT NULL REFERENCES tenants (id),
    period_start date NOT NULL CHECK (extract(day FROM period_start) = 1),
    closes_at    timestamptz NOT NULL,
    closed_by    text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, period_start),
    -- Inside the calendar month (a close at its end is no early close).
    CHECK (closes_at > (period_start::timestamp AT TIME ZONE 'UTC')
           AND closes_at < ((period_start + interval '1 month') AT TIME ZONE 'UTC'))
);
CREATE TRIGGER period_closes_append_only BEFORE UPDATE OR DELETE ON period_closes
    FOR EACH ROW EXECUTE FUNCTION billing_refuse_change();

-- What the invoice covers and when its figures were last computed: issuing needs the period
-- over (now >= covers_until) and a draft built after it (built_at >= covers_until), the final
-- one. NULL on invoices issued before this migration (they covered their calendar month).
ALTER TABLE invoices
    ADD COLUMN covers_from  timestamptz,
    ADD COLUMN covers_until timestamptz,
    ADD COLUMN built_at     timestamptz;
UPDATE invoices
SET covers_from = period_start::timestamp AT TIME ZONE 'UTC',
    covers_until = (period_start + interval '1 month') AT TIME ZONE 'UTC',
    built_at = created_at
WHERE status = 'draft';

-- The segments an invoice was built from: the run whose lines count for events started in
-- [covers_from, covers_until). Segments of one invoice never overlap and together make its
-- coverage.
CREATE TABLE invoice_sources (
    invoice_id   uuid NOT NULL REFERENCES invoices (id),
    run_id       bigint NOT NULL REFERENCES rating_runs (id),
    covers_from  timestamptz NOT NULL,
    covers_until timestamptz NOT NULL,
    PRIMARY KEY (invoice_id, covers_from),
    CHECK (covers_until > covers_from)
);
-- Every invoice so far was built from one run over its calendar month.
INSERT INTO invoice_sources (invoice_id, run_id, covers_from, covers_until)
SELECT id, run_id, period_start::timestamp AT TIME ZONE 'UTC',
       (period_start + interval '1 month') AT TIME ZONE 'UTC'
FROM invoices;
-- As its entries: frozen with an issued invoice.
CREATE TRIGGER invoice_sources_immutable BEFORE INSERT OR UPDATE OR DELETE ON invoice_sources
    FOR EACH ROW EXECUTE FUNCTION invoice_entries_guard();
CREATE TRIGGER invoice_sources_no_truncate BEFORE TRUNCATE ON invoice_sources
    FOR EACH STATEMENT EXECUTE FUNCTION billing_refuse_change();
