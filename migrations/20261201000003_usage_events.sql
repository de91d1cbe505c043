-- Usage events: the metered facts billing is derived from. One row per request id, immutable.
-- request_id is the idempotency key: a replayed or retried emission is absorbed by the primary
-- key (INSERT ... ON CONFLICT DO NOTHING), so nothing is ever counted twice.
CREATE TABLE usage_events (
    request_id        uuid PRIMARY KEY,
    tenant_id         uuid NOT NULL REFERENCES tenants (id),
    api_key_id        uuid REFERENCES api_keys (id),
    -- What the client asked for and what served it, as resolved at request time (names are kept,
    -- not foreign keys, so deleting a model never rewrites history).
    served_name       text NOT NULL,
    base_model        text NOT NULL,
    adapter           text,
    graph             text NOT NULL,
    price_key         text NOT NULL,
    -- Token counts; bigint so sums never overflow.
    prompt_tokens     bigint NOT NULL CHECK (prompt_tokens >= 0),
    cached_tokens     bigint NOT NULL CHECK (cached_tokens >= 0 AND cached_tokens <= prompt_tokens),
    completion_tokens bigint NOT NULL CHECK (completion_tokens >= 0),
    -- How the counts were obtained: the engine's final usage, its last running usage before an
    -- abort, or counted by the gateway from what it delivered (prompt from the base's tokenizer).
    provenance        text NOT NULL CHECK (provenance IN ('engine', 'partial', 'estimated')),
    -- interrupted: the gateway cut the stream at its shutdown deadline (still billed).
    status            text NOT NULL CHECK (status IN ('ok', 'client_abort', 'upstream_error', 'interrupted', 'rejected')),
    stream            boolean NOT NULL,
    ttft_ms           integer,
    duration_ms       integer NOT NULL,
    started_at        timestamptz NOT NULL,
    -- When the row reached PostgreSQL (differs from started_at + duration when replayed later).
    recorded_at       timestamptz NOT NULL DEFAULT now()
);
-- Per-tenant usage over time: the portal's charts, invoices and `admin usage --tenant`.
CREATE INDEX usage_events_tenant_time_idx ON usage_events (tenant_id, started_at);
CREATE INDEX usage_events_time_idx ON usage_events (started_at);
