-- Prepaid credit left, in one place (issue 16): the portal, the admin pages and the spend limit
-- (which counts a tenant's charges net of its credit) all read it through this function, so
-- the rule is written once. A grant counts until it expires; what is left of it is its amount
-- plus the (negative) credit entries of issued invoices and the (positive) ones of issued credit
-- notes that name it. Drafts burn nothing until issued.
CREATE FUNCTION credit_balance(p_tenant uuid, p_at timestamptz) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT COALESCE(sum(c.amount_micros + COALESCE((
               SELECT sum(x.amount_micros) FROM invoice_entries x
               JOIN invoices i ON i.id = x.invoice_id
               WHERE x.grant_id = c.id AND i.status = 'issued'), 0)), 0)::bigint
    FROM credit_grants c
    WHERE c.tenant_id = p_tenant AND (c.expires_at IS NULL OR c.expires_at > p_at)
$$;

-- The entries that burn a grant, found without reading every invoice's entries: the spend
-- limit asks for a tenant's balance each time a replica refreshes its limits (about once a
-- second per active key).
CREATE INDEX invoice_entries_grant_idx ON invoice_entries (grant_id) WHERE grant_id IS NOT NULL;
