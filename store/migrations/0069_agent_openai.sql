-- P13: an agent's options for the OpenAI-compatible front end, `{"tool_activity": "none" |
-- "text"}` (domain::openai::OpenAiOptions). Only that front end reads them, when it
-- answers: no turn does, so the column is not among those of the agent's basis-version
-- trigger.
ALTER TABLE agents ADD COLUMN openai jsonb NOT NULL DEFAULT '{}'
    CHECK (jsonb_typeof(openai) = 'object'
        AND coalesce(openai->>'tool_activity', 'none') IN ('none', 'text'));
