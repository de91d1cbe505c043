-- Tenant settings (issue 15): whether the tenant's request bodies (prompt and completion) may be
-- stored, and for how long. Off by default: nothing a tenant sends is kept unless an owner opts
-- in. Changes are audit-logged by the portal.
ALTER TABLE tenants
    ADD COLUMN body_logging boolean NOT NULL DEFAULT false,
    -- Stored bodies older than this are deleted by a background job.
    ADD COLUMN body_retention_days integer NOT NULL DEFAULT 30
        CHECK (body_retention_days BETWEEN 1 AND 365);
