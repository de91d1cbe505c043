-- Unit economics (issue 17): what a base's replicas cost, so /admin/economics and
-- `tokenfactory admin economics` can set a day's warm replica-hours against its served tokens.

-- A base's serving costs as an operator sets them, versioned like prices: a change is a new row
-- with the time it takes effect from, never an edit (the trigger below refuses UPDATE and
-- DELETE), so a past day is always computed with the costs in effect then.
CREATE TABLE base_costs (
    id                     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The base's name, as usage events and the catalog name it (no foreign key: a deleted base's
    -- past days keep their costs).
    base_model             text NOT NULL CHECK (length(base_model) BETWEEN 1 AND 200),
    effective_from         timestamptz NOT NULL,
    -- What one GPU costs per hour, in micro-units of the currency.
    gpu_micros_per_hour    bigint NOT NULL CHECK (gpu_micros_per_hour >= 0),
    -- GPUs one replica of the base's graph takes.
    gpus_per_replica       integer NOT NULL CHECK (gpus_per_replica > 0),
    -- Tokens (prompt + completion) one replica serves per second at full load: the capacity the
    -- duty cycle is measured against.
    peak_tokens_per_second bigint NOT NULL CHECK (peak_tokens_per_second > 0),
    created_by             text NOT NULL DEFAULT '',
    created_at             timestamptz NOT NULL DEFAULT now(),
    UNIQUE (base_model, effective_from)
);

CREATE FUNCTION base_costs_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'base_costs is append-only (% refused)', TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END $$;
CREATE TRIGGER base_costs_append_only BEFORE UPDATE OR DELETE ON base_costs
    FOR EACH ROW EXECUTE FUNCTION base_costs_append_only();

-- The graph's floor (its template's minimum replicas) when the row was written, so replica-hours
-- split into floor and scaled-up ones as they were then. NULL on rows written before this
-- migration (read as the template's current floor).
ALTER TABLE lifecycle_history ADD COLUMN floor integer;

-- The economics read a range of days of graph rows (and the last one before the range).
CREATE INDEX lifecycle_history_graph_at_idx ON lifecycle_history (at) WHERE entity = 'graph';
