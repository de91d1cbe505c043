-- Measured peaks (issue 17): a cost version whose peak tokens per second per replica was measured
-- by `tokenfactory admin economics measure-peak` (a load against the graph's frontend, read from
-- the engine's own token counters) carries how: URL, concurrency, seconds, tokens counted,
-- replicas. NULL: the peak was configured by an operator. Versions stay append-only.
ALTER TABLE base_costs ADD COLUMN peak_measured jsonb;
