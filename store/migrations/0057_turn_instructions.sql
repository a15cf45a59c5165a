-- P9: the caller's own instructions for one turn (OpenAI's `instructions`, a chat
-- completion's system messages), appended to the agent's prompt, never replacing it.
-- Part of the turn's frozen basis (T3): written with the turn row before its first model
-- request, read again by its continuation after an approval (A3), by a takeover (D3),
-- and by a queued turn when it starts (T13). Bounded as the brain bounds them
-- (`turn::MAX_INSTRUCTIONS_CHARS`), so no writer can store more.
ALTER TABLE turns ADD COLUMN instructions text
    CHECK (instructions IS NULL OR char_length(instructions) BETWEEN 1 AND 16384);
