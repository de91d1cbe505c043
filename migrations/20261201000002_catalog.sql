-- The catalog: every name a client may put in `model=`, and where it is served.
-- The gateway keeps an in-memory resolution table built from these rows and rebuilds it when
-- PostgreSQL notifies `tf_catalog_changed`, so no request does I/O to resolve a name.

-- One row per base model offered: one serving graph (a Dynamo graph, a vLLM server, a simulated
-- engine) per base. The fleet controller owns upstream_url; the lifecycle issue adds the
-- serving config (engine args, replicas) in its own migration.
CREATE TABLE base_models (
    id             uuid PRIMARY KEY,
    -- Public served name (what clients send as `model`).
    name           text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 200),
    -- The graph that serves this base; one per base here, named for operators.
    graph          text NOT NULL,
    -- Which fleet backend registered it: 'local-sim', 'static', later 'kubernetes'.
    fleet          text NOT NULL,
    -- OpenAI-compatible base URL of the graph's frontend, e.g. http://127.0.0.1:8180/v1.
    upstream_url   text NOT NULL,
    -- Name the upstream knows the base by.
    upstream_model text NOT NULL,
    -- Whether tenants may call the bare base (not only their adapters on it).
    offered        boolean NOT NULL DEFAULT true,
    -- Prefix-cache isolation: false (default) salts each request with its tenant, so tenants
    -- never share cached blocks; true is an admin's deliberate opt-out.
    shared_cache   boolean NOT NULL DEFAULT false,
    -- Whether the upstream accepts stream_options.continuous_usage_stats (so aborted streams
    -- are billed from engine counts).
    continuous_usage boolean NOT NULL DEFAULT true,
    -- Key into the price book (the billing issue adds prices); defaults to the name.
    price_key      text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- A tenant's model: a LoRA adapter served on a base. Only its owner may call it.
CREATE TABLE adapters (
    id             uuid PRIMARY KEY,
    tenant_id      uuid NOT NULL REFERENCES tenants (id),
    -- Served name, unique within the tenant (two tenants may both have "support-bot").
    name           text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    base_model_id  uuid NOT NULL REFERENCES base_models (id),
    -- Bumped when the weights change, so the engine's prefix cache (keyed by LoRA name) can
    -- never reuse KV computed with old weights.
    version        integer NOT NULL DEFAULT 1 CHECK (version > 0),
    -- The LoRA name the engine knows, globally unique and versioned.
    upstream_model text NOT NULL UNIQUE,
    -- 'ready' is routable; the lifecycle issue adds the other states.
    state          text NOT NULL DEFAULT 'ready',
    shared_cache   boolean NOT NULL DEFAULT false,
    price_key      text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);
CREATE INDEX adapters_base_idx ON adapters (base_model_id);

CREATE FUNCTION notify_catalog_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tf_catalog_changed', TG_TABLE_NAME);
    RETURN NULL;
END $$;
CREATE TRIGGER base_models_changed AFTER INSERT OR UPDATE OR DELETE ON base_models
    FOR EACH STATEMENT EXECUTE FUNCTION notify_catalog_changed();
CREATE TRIGGER adapters_changed AFTER INSERT OR UPDATE OR DELETE ON adapters
    FOR EACH STATEMENT EXECUTE FUNCTION notify_catalog_changed();
-- A suspended tenant's adapters disappear from the table too.
CREATE TRIGGER tenants_catalog_changed AFTER UPDATE OF status OR DELETE ON tenants
    FOR EACH STATEMENT EXECUTE FUNCTION notify_catalog_changed();
