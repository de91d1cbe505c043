-- Tenant roles (issue 15): what a tenant's portal user may do inside their tenant.
-- `users.role` stays `tenant_member` / `admin` (which side of the platform a user is on); the
-- role inside the tenant is its own column so code that only knows the old two roles keeps
-- working during a rollout.
--   owner:     everything a member may, plus members, settings, body logging.
--   member:    manages API keys and uses models.
--   read_only: reads the tenant's pages, changes nothing.
-- Existing tenant users become owners (the DEFAULT fills them in); so does a user inserted by a
-- replica of the previous release (those only create a tenant's first user). Meaningless for
-- admins, who belong to no tenant.
ALTER TABLE users
    ADD COLUMN tenant_role text NOT NULL DEFAULT 'owner'
        CHECK (tenant_role IN ('owner', 'member', 'read_only'));
-- The name the user chose to be shown by (settings page); empty shows the email.
ALTER TABLE users
    ADD COLUMN display_name text NOT NULL DEFAULT '' CHECK (length(display_name) <= 100);

-- Invitations into a tenant. The owner sends the one-time link themselves (no mail server); only
-- the token's SHA-256 is kept, so a copy of this table lets nobody join. A link works once
-- (accepted_at) and until expires_at.
CREATE TABLE invitations (
    id            uuid PRIMARY KEY,
    tenant_id     uuid NOT NULL REFERENCES tenants (id),
    -- The account the invitee gets; lower-cased like users.email.
    email         text NOT NULL CHECK (email = lower(email) AND position('@' IN email) > 1),
    tenant_role   text NOT NULL CHECK (tenant_role IN ('owner', 'member', 'read_only')),
    token_sha256  bytea NOT NULL UNIQUE CHECK (octet_length(token_sha256) = 32),
    -- Who invited (NULL once that user is removed); the audit log keeps the email.
    invited_by    uuid REFERENCES users (id) ON DELETE SET NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    -- Set when the link is used; a used link is refused.
    accepted_at   timestamptz
);
-- The members page lists a tenant's pending invitations.
CREATE INDEX invitations_tenant_idx ON invitations (tenant_id, created_at DESC);
