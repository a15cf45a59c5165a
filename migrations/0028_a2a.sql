-- P1 (issue 28): the A2A push notification configs of a task (a turn). Delivery goes
-- through the signed-webhooks outbox; this table only says where a task's state changes go.
CREATE TABLE a2a_push_configs (
    team_id     uuid NOT NULL,
    turn_id     uuid NOT NULL,
    -- The client's id for the config, or one the server made.
    id          text NOT NULL,
    url         text NOT NULL,
    -- Echoed to the receiver so it can tell the notification is its own.
    token       text,
    -- `authentication`: the scheme (`Bearer`, ...) and credentials the receiver asked for.
    auth_scheme text,
    auth_credentials text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, turn_id, id),
    FOREIGN KEY (team_id, turn_id) REFERENCES turns (team_id, id) ON DELETE CASCADE
);

-- ListTasks without a context: an agent's turns, newest first.
CREATE INDEX turns_agent_started ON turns (team_id, agent_id, started_at DESC, id DESC);
