-- Engine controls inside `nvext` (issue 32). Dynamo's frontend reads a nested `nvext` object:
-- worker pins (`backend_instance_id`, `prefill_worker_id`, `decode_worker_id`) that bypass its
-- router, `agent_hints` (scheduler priority, latency sensitivity, speculative prefill),
-- `token_data` (token ids used instead of the prompt), `cache_salt`, and sampling extras. Only
-- top-level fields were filtered before. The gateway now keeps only the `nvext` keys a base
-- allows: NULL means the gateway's documented default allow-list (sampling and guided-decoding
-- extras, `token_data`, which admission counts; never the worker pins or `agent_hints`); an
-- operator may list others for a base (a trusted tenant fleet that may pin workers).
-- `cache_salt` is always the gateway's on a per-tenant-cache base, whatever is listed.
ALTER TABLE base_models ADD COLUMN nvext_allowed text[];
