-- Usage events name the endpoint that served them and the reasoning tokens (issue 32).
--
-- endpoint: which /v1 endpoint served the request, so usage, logs, invoices and exports can show
-- or filter by it. Rows written before this migration get 'chat': until now the gateway served
-- only chat and completions, which share price keys and rates, so the label changes no amount,
-- and which of the two served an old row cannot be recovered. The DEFAULT stays after the
-- backfill on purpose: during a rolling deploy an older replica's INSERT (which does not name the
-- column) must still succeed (expand, then contract). Adding a column with a constant default is
-- a catalog-only change in PostgreSQL 11+ (no table rewrite).
ALTER TABLE usage_events ADD COLUMN endpoint text NOT NULL DEFAULT 'chat'
    CHECK (endpoint IN ('chat', 'completions', 'responses', 'embeddings', 'messages'));

-- reasoning_tokens: of completion_tokens, the reasoning (thinking) tokens the engine reported
-- (Responses' output_tokens_details.reasoning_tokens, chat's completion_tokens_details). They are
-- billed as output (they are already inside completion_tokens) and shown as their own figure.
-- Old rows: 0 (not recorded then; their reasoning, if any, is still inside completion_tokens).
ALTER TABLE usage_events ADD COLUMN reasoning_tokens bigint NOT NULL DEFAULT 0
    CHECK (reasoning_tokens >= 0 AND reasoning_tokens <= completion_tokens);
