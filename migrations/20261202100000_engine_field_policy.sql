-- What a client may tell an engine, per base (issue 13: hardening).
--
-- Pass-through of unknown request fields stays the rule, but some fields are engine controls a
-- tenant must not hold (vLLM `priority` jumps the scheduler and defeats fairness,
-- `kv_transfer_params`, `vllm_xargs`, the simulator's `sim` block sets its own token counts).
-- NULL means the gateway's documented default deny-list; an operator may set another list for a
-- base (the test fleet lets `sim` through to drive its simulator).
ALTER TABLE base_models ADD COLUMN denied_fields text[];

-- How the gateway estimates a prompt's tokens before the engine has counted them, until the
-- lifecycle work brings each base's own tokenizer: 'byte-bound' (one token per UTF-8 byte plus
-- the chat template's markers, never below the real count for byte-level BPE tokenizers) or
-- 'sim-words' (the engine simulator's exact whitespace tokenizer, for simulated bases).
ALTER TABLE base_models ADD COLUMN prompt_estimator text NOT NULL DEFAULT 'byte-bound'
    CHECK (prompt_estimator IN ('byte-bound', 'sim-words'));
