-- T13 (issue 27): what a message to a busy agent does: `reject` (409 agent_busy, as
-- before), `enqueue` (a queued turn, started when the agent is free) or `interrupt` (the
-- running turn is stopped and the message's turn starts).
ALTER TABLE agents ADD COLUMN busy_policy text NOT NULL DEFAULT 'reject'
    CHECK (busy_policy IN ('reject', 'enqueue', 'interrupt'));

-- A queued turn is a row with its user message, written when accepted; its composition is
-- frozen when it starts (T3), so it has none while queued. `withdrawn`: stopped while
-- queued, it never ran.
ALTER TABLE turns DROP CONSTRAINT turns_status_check;
ALTER TABLE turns ADD CONSTRAINT turns_status_check
    CHECK (status IN ('queued', 'running', 'completed', 'interrupted', 'failed', 'withdrawn'));
ALTER TABLE turns ALTER COLUMN composition_hash DROP NOT NULL;
-- The order an agent's queued turns run in: accepted first, started first.
ALTER TABLE turns ADD COLUMN queued_at timestamptz;
CREATE INDEX turns_queued ON turns (agent_id, queued_at, id) WHERE status = 'queued';

-- A queued turn's user message is `queued` until its turn starts (then `complete`, moved to
-- the end of the transcript), or `withdrawn` if it never ran; neither reaches a model.
ALTER TABLE messages DROP CONSTRAINT messages_status_check;
ALTER TABLE messages ADD CONSTRAINT messages_status_check
    CHECK (status IN ('complete', 'interrupted', 'queued', 'withdrawn'));
