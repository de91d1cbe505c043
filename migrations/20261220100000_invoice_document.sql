-- The invoice as a document (issue 31): a number, who issues it, who it is billed to, and when it
-- is due, fixed when it is issued.
--
-- Numbers are gapless per series and year of issue: `INV-2026-000001` for invoices,
-- `CN-2026-000001` for credit notes. They are assigned by a trigger on the one UPDATE that issues
-- (draft -> issued), inside the issuing transaction: a rolled-back issue gives its number back, and
-- no code path can issue without one (the CHECK below). The trigger runs as the owner, so the
-- application role needs (and has) no privilege on the counters.
--
-- The issuer's and the tenant's details are copied onto the invoice at issue (later edits never
-- change an issued document); a draft shows them as they are now.

-- Who issues invoices: one row, edited by admins (audited).
CREATE TABLE invoice_issuer (
    only_row   boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    name       text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    address    text NOT NULL DEFAULT '' CHECK (length(address) <= 1000),
    -- Days from issue to due date (payment terms).
    due_days   integer NOT NULL DEFAULT 30 CHECK (due_days BETWEEN 0 AND 365),
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO invoice_issuer (name) VALUES ('Token Factory');
REVOKE DELETE, INSERT ON invoice_issuer FROM tokenfactory_app;

-- Where a tenant's invoices are addressed (its owners edit it, audited).
ALTER TABLE tenants ADD COLUMN billing_address text NOT NULL DEFAULT ''
    CHECK (length(billing_address) <= 1000);

-- The last number given per series and year.
CREATE TABLE invoice_counters (
    series text NOT NULL CHECK (series IN ('INV', 'CN')),
    year   integer NOT NULL,
    last   integer NOT NULL CHECK (last > 0),
    PRIMARY KEY (series, year)
);
REVOKE ALL ON invoice_counters FROM tokenfactory_app;

ALTER TABLE invoices
    ADD COLUMN number  text UNIQUE,
    ADD COLUMN issuer  text,
    ADD COLUMN bill_to text,
    ADD COLUMN due_at  timestamptz;

-- The tenant's name and address as an invoice's "Bill to".
CREATE FUNCTION invoice_bill_to(p_tenant uuid) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT concat_ws(E'\n', COALESCE(NULLIF(t.display_name, ''), t.name) || ' (' || t.name || ')',
                     NULLIF(t.billing_address, ''))
    FROM tenants t WHERE t.id = p_tenant
$$;

-- The issuer's name and address as an invoice's "From".
CREATE FUNCTION invoice_issuer_text() RETURNS text LANGUAGE sql STABLE AS $$
    SELECT concat_ws(E'\n', name, NULLIF(address, '')) FROM invoice_issuer
$$;

-- Numbers, parties and due date, on the transition to issued.
CREATE FUNCTION invoices_document() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    s text := CASE WHEN NEW.kind = 'credit_note' THEN 'CN' ELSE 'INV' END;
    y integer := extract(year FROM NEW.issued_at AT TIME ZONE 'UTC')::integer;
    n integer;
BEGIN
    IF NEW.status = 'issued' AND OLD.status = 'draft' THEN
        INSERT INTO invoice_counters AS c (series, year, last) VALUES (s, y, 1)
        ON CONFLICT (series, year) DO UPDATE SET last = c.last + 1
        RETURNING last INTO n;
        NEW.number := s || '-' || y || '-' || lpad(n::text, 6, '0');
        NEW.issuer := invoice_issuer_text();
        NEW.bill_to := invoice_bill_to(NEW.tenant_id);
        NEW.due_at := NEW.issued_at
            + make_interval(days => (SELECT due_days FROM invoice_issuer));
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER invoices_number BEFORE UPDATE ON invoices
    FOR EACH ROW EXECUTE FUNCTION invoices_document();

-- Invoices issued before this migration get their numbers in the order they were issued.
ALTER TABLE invoices DISABLE TRIGGER invoices_immutable;
WITH numbered AS (
    SELECT i.id,
           CASE WHEN i.kind = 'credit_note' THEN 'CN' ELSE 'INV' END AS series,
           extract(year FROM i.issued_at AT TIME ZONE 'UTC')::integer AS year,
           row_number() OVER (PARTITION BY i.kind, extract(year FROM i.issued_at AT TIME ZONE 'UTC')
                              ORDER BY i.issued_at, i.id) AS n
    FROM invoices i WHERE i.status = 'issued'
)
UPDATE invoices i
SET number = x.series || '-' || x.year || '-' || lpad(x.n::text, 6, '0'),
    issuer = invoice_issuer_text(),
    bill_to = invoice_bill_to(i.tenant_id),
    due_at = i.issued_at + interval '30 days'
FROM numbered x WHERE x.id = i.id;
ALTER TABLE invoices ENABLE TRIGGER invoices_immutable;
INSERT INTO invoice_counters (series, year, last)
SELECT split_part(number, '-', 1), split_part(number, '-', 2)::integer,
       max(split_part(number, '-', 3)::integer)
FROM invoices WHERE number IS NOT NULL
GROUP BY 1, 2;

-- Every issued invoice is a numbered document; a draft has none.
ALTER TABLE invoices ADD CONSTRAINT invoices_numbered_when_issued
    CHECK ((status = 'issued') = (number IS NOT NULL AND issuer IS NOT NULL
                                  AND bill_to IS NOT NULL AND due_at IS NOT NULL));
