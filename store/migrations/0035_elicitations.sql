-- P5: an MCP server's `elicitation/create` during an interactive turn's tool call is a
-- pending approval of kind `elicitation`, answered by a person through the approvals path
-- while the call waits. `elicitation` holds the connector, the server's message and its
-- requested schema; `content` the accepted form's values. An elicitation names no stored
-- tool part (the call is still running), so it has no message or part index.
ALTER TABLE approvals
    ADD COLUMN kind text NOT NULL DEFAULT 'tool' CHECK (kind IN ('tool', 'elicitation')),
    ADD COLUMN elicitation jsonb,
    ADD COLUMN content jsonb,
    ALTER COLUMN message_id DROP NOT NULL,
    ALTER COLUMN part_index DROP NOT NULL,
    ADD CONSTRAINT approvals_kind_shape CHECK (
        (kind = 'tool' AND message_id IS NOT NULL AND part_index IS NOT NULL
            AND elicitation IS NULL AND content IS NULL)
        OR (kind = 'elicitation' AND elicitation IS NOT NULL));

-- `cancelled`: an elicitation the turn gave up (stopped, or the server withdrew it).
ALTER TABLE approvals DROP CONSTRAINT approvals_state_check;
ALTER TABLE approvals ADD CONSTRAINT approvals_state_check CHECK (state IN
    ('pending', 'approved', 'denied', 'expired', 'superseded', 'cancelled'));
