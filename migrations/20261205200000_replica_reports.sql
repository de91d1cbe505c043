-- Replicas report their health here every few seconds, so the admin ops page shows every
-- replica's journal and shipping, not only those of the replica that renders it. One row per
-- replica process (a restart is a new row); rows not refreshed for a day are deleted by the
-- replicas themselves.
CREATE TABLE replica_reports (
    -- Made at start-up by the process; a restarted replica is a new one.
    replica_id        uuid PRIMARY KEY,
    -- The host (or Kubernetes pod) name, so an operator can find the process.
    hostname          text NOT NULL,
    started_at        timestamptz NOT NULL,
    -- When the replica last reported; the page marks a replica stale when this is old.
    seen_at           timestamptz NOT NULL DEFAULT now(),
    -- Journal bytes PostgreSQL has not acknowledged (0 without a journal).
    backlog_bytes     bigint NOT NULL DEFAULT 0,
    -- Age of the oldest unshipped usage event at the shipper's last pass, in milliseconds.
    ship_lag_ms       bigint NOT NULL DEFAULT 0,
    -- When the shipper last moved events to PostgreSQL (NULL: never, or no journal).
    last_shipped_at   timestamptz,
    -- Counters since start-up: events journaled, shipped, failed shipping attempts.
    journaled         bigint NOT NULL DEFAULT 0,
    shipped           bigint NOT NULL DEFAULT 0,
    ship_failures     bigint NOT NULL DEFAULT 0,
    -- Client connections open at the report (portal and API; a stream holds one).
    open_connections  bigint NOT NULL DEFAULT 0
);
-- The page lists the most recently seen first; the clean-up deletes the oldest.
CREATE INDEX replica_reports_seen_idx ON replica_reports (seen_at DESC);
