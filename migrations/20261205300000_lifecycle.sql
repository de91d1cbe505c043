-- Model lifecycle (issue 14): the desired state the fleet controller reconciles, the state it
-- observes, and the history of both. Expands the catalog: rows written before this migration (a
-- static fleet file, the old demo) have no template and no stored files, and the controller
-- leaves them alone.

-- How a base is served, set by an operator. A base with a template is the controller's: it
-- creates the base's graph from it; a base without one is registered by a backend that runs
-- engines it does not start (`static`).
CREATE TABLE base_templates (
    base_model_id        uuid PRIMARY KEY REFERENCES base_models (id) ON DELETE CASCADE,
    -- The model id the engine loads (`--model`), and what adapters must name as their base.
    model                text NOT NULL CHECK (length(model) BETWEEN 1 AND 400),
    -- The runtime image on Kubernetes (unused by local backends).
    image                text NOT NULL DEFAULT '',
    -- Passed through to the engine: `--tensor-parallel-size`, `--quantization`, `--max-loras`,
    -- `--max-lora-rank` (one of vLLM's accepted ranks), and any further flags.
    tensor_parallel_size integer NOT NULL DEFAULT 1 CHECK (tensor_parallel_size > 0),
    quantization         text,
    max_loras            integer NOT NULL DEFAULT 8 CHECK (max_loras > 0),
    max_lora_rank        integer NOT NULL DEFAULT 64
        CHECK (max_lora_rank IN (1, 8, 16, 32, 64, 128, 256, 320, 512)),
    extra_args           text[] NOT NULL DEFAULT '{}',
    -- GPUs one replica takes (>= tensor parallel size), and the autoscaling bounds: the floor is
    -- at least one (Dynamo's planner cannot scale to zero).
    gpus_per_replica     integer NOT NULL DEFAULT 1 CHECK (gpus_per_replica >= tensor_parallel_size),
    replicas_min         integer NOT NULL DEFAULT 1 CHECK (replicas_min >= 1),
    replicas_max         integer NOT NULL DEFAULT 1 CHECK (replicas_max >= replicas_min),
    -- A Secret whose keys become the worker's environment (Kubernetes only).
    env_from_secret      text,
    -- The base's Hugging Face `config.json`: the dimensions every adapter is checked against.
    config_json          jsonb NOT NULL,
    -- The base's `tokenizer.json` (prompt estimates); NULL until an operator provides it.
    tokenizer_json       jsonb,
    -- Whether adapters with `use_dora` may be registered on this base.
    allow_dora           boolean NOT NULL DEFAULT false,
    updated_at           timestamptz NOT NULL DEFAULT now()
);

-- One graph per base, as the controller last observed it in its backend. The row exists while
-- the graph should exist or still exists.
CREATE TABLE graphs (
    base_model_id    uuid PRIMARY KEY REFERENCES base_models (id) ON DELETE CASCADE,
    -- The graph's name in the backend.
    name             text NOT NULL UNIQUE,
    -- 'pending' (being created), 'ready', 'deleting', 'failed'.
    state            text NOT NULL CHECK (state IN ('pending', 'ready', 'deleting', 'failed')),
    reason           text,
    replicas_ready   integer NOT NULL DEFAULT 0,
    replicas_desired integer NOT NULL DEFAULT 0,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- Adapters: what their owner asked for, and where the files are.
-- What the owner wants: 'running' (start), 'stopped', or 'deleted' (the controller deregisters,
-- removes the files and then the row). Legacy rows are 'running' and already 'ready'.
ALTER TABLE adapters ADD COLUMN desired text NOT NULL DEFAULT 'running'
    CHECK (desired IN ('running', 'stopped', 'deleted'));
-- The observed state; the old rows are all 'ready'.
ALTER TABLE adapters ADD CONSTRAINT adapters_state_check CHECK (state IN
    ('uploading', 'validating', 'rejected', 'stopped', 'starting', 'ready', 'stopping', 'failed'));
-- Why it is rejected or failed, for its owner.
ALTER TABLE adapters ADD COLUMN reason text;
-- Where the validated files are (`file:///dir/` or `s3://bucket/prefix/`); NULL for adapters a
-- backend registered itself (the controller does not manage those).
ALTER TABLE adapters ADD COLUMN storage_uri text;
-- What validation found: rank, target modules, sizes (shown on the model page).
ALTER TABLE adapters ADD COLUMN validation jsonb;
ALTER TABLE adapters ADD COLUMN size_bytes bigint;
ALTER TABLE adapters ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX adapters_managed_idx ON adapters (base_model_id) WHERE storage_uri IS NOT NULL;

-- Every state change of a graph or an adapter, with its reason and (for graphs) the replica
-- count from then on: replica-hours are the integral of `replicas` over a graph's rows. Rows
-- outlive their entity (no foreign keys), so a deleted model's history stays for billing.
CREATE TABLE lifecycle_history (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    entity      text NOT NULL CHECK (entity IN ('graph', 'adapter')),
    -- The base (graph) or adapter id.
    entity_id   uuid NOT NULL,
    -- The owner, for adapters (scopes what a tenant may read).
    tenant_id   uuid,
    -- Graph name or adapter served name at the time.
    name        text NOT NULL,
    from_state  text,
    to_state    text NOT NULL,
    reason      text,
    -- Graphs: replicas desired from this row on (0 once deleted).
    replicas    integer,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX lifecycle_history_entity_idx ON lifecycle_history (entity_id, id);

-- A starting adapter is in the resolution table too (503 with retry-after), so its state
-- changes already notify through `adapters_changed`.
