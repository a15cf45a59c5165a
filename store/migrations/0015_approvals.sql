-- A2: an agent's approval policy, `{"ask": [classes or tool names], "deny": [tool names]}`;
-- validated in brain/src/approvals/policy.rs. By default nothing asks.
ALTER TABLE agents
    ADD COLUMN approval_policy jsonb NOT NULL DEFAULT '{"ask": [], "deny": []}';

-- A continuation turn runs the loop on after an approval was answered.
ALTER TABLE turns DROP CONSTRAINT turns_trigger_check;
ALTER TABLE turns ADD CONSTRAINT turns_trigger_check
    CHECK (trigger IN ('user', 'autostart', 'approval'));

-- A3: one row per tool call that waits for a person. `message_id` and `part_index` name the
-- stored tool part the answer rewrites, so the history always holds a result for the call.
-- `state` leaves `pending` once, by a conditional UPDATE (answered at most once).
CREATE TABLE approvals (
    id                 uuid PRIMARY KEY,
    team_id            uuid NOT NULL REFERENCES teams (id),
    agent_id           uuid NOT NULL,
    chat_id            uuid NOT NULL,
    turn_id            uuid NOT NULL,
    message_id         uuid NOT NULL,
    part_index         integer NOT NULL CHECK (part_index >= 0),
    tool_call_id       text NOT NULL,
    tool               text NOT NULL,
    input              jsonb NOT NULL,
    state              text NOT NULL CHECK (state IN
                           ('pending', 'approved', 'denied', 'expired', 'superseded')),
    reason             text,
    expires_at         timestamptz NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    answered_at        timestamptz,
    -- The turn that ran the loop on after the last answer of its turn.
    continuation_turn  uuid
);
CREATE INDEX approvals_chat ON approvals (team_id, chat_id, created_at);
CREATE INDEX approvals_pending ON approvals (team_id, chat_id) WHERE state = 'pending';
