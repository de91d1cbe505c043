-- What a base model does (issue 32): 'chat' generates text (chat, completions, Responses,
-- Anthropic Messages); 'embedding' embeds it (/v1/embeddings only). Each endpoint refuses the
-- other kind with a 400 before anything is forwarded, so a tenant never pays for an engine error.
-- It lives on base_models, beside the other facts the gateway's resolution reads
-- (denied_fields, prompt_estimator), because every base has a row there, also the ones a static
-- fleet registers without a template. Every base registered before this migration is a chat
-- model (embeddings were not served), hence the default.
ALTER TABLE base_models ADD COLUMN kind text NOT NULL DEFAULT 'chat'
    CHECK (kind IN ('chat', 'embedding'));
