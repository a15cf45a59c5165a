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

-- Push notifications are outbox deliveries (0027) to a config's URL: the row names its
-- config, whose token and `authentication` become the request's headers when it is sent,
-- and goes when the config does.
ALTER TABLE webhook_deliveries
    ADD COLUMN push_turn   uuid,
    ADD COLUMN push_config text,
    ADD FOREIGN KEY (team_id, push_turn, push_config)
        REFERENCES a2a_push_configs (team_id, turn_id, id) ON DELETE CASCADE,
    ADD CHECK ((push_config IS NULL) = (target_url IS NULL));

-- Records the notification of a task's state, if it has ended (or waits for a person),
-- for each of its configs (`config` NULL) or for one: the A2A `StreamResponse` a push
-- carries, ids and state only (never text, X4), keyed so a state goes once per config.
-- The states are `a2a::task::state_of`'s. A volatile function: under READ COMMITTED each
-- call reads what committed before it, not the snapshot of the statement that fired it.
CREATE FUNCTION a2a_notify(team uuid, turn uuid, config text) RETURNS void
LANGUAGE sql VOLATILE AS $$
    INSERT INTO webhook_deliveries
        (id, team_id, target_url, push_turn, push_config, event, event_key, payload)
    SELECT gen_random_uuid(), c.team_id, c.url, c.turn_id, c.id, 'a2a.task',
           c.turn_id || ':' || c.id || ':' || s.state,
           jsonb_build_object('statusUpdate', jsonb_build_object(
               'taskId', t.id::text,
               'contextId', t.chat_id::text,
               'status', jsonb_build_object(
                   'state', s.state,
                   'timestamp', to_char(coalesce(t.finished_at, now()) AT TIME ZONE 'UTC',
                                        'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'))))
    FROM turns t
    CROSS JOIN LATERAL (SELECT CASE t.status
        WHEN 'completed' THEN CASE WHEN EXISTS (
                SELECT 1 FROM approvals p WHERE p.team_id = t.team_id AND p.chat_id = t.chat_id
                  AND p.turn_id = t.id AND p.state = 'pending')
            THEN 'TASK_STATE_INPUT_REQUIRED' ELSE 'TASK_STATE_COMPLETED' END
        WHEN 'failed' THEN 'TASK_STATE_FAILED'
        WHEN 'interrupted' THEN 'TASK_STATE_CANCELED'
        WHEN 'withdrawn' THEN 'TASK_STATE_CANCELED'
        END AS state) s
    JOIN a2a_push_configs c ON c.team_id = t.team_id AND c.turn_id = t.id
        AND (config IS NULL OR c.id = config)
    WHERE t.team_id = team AND t.id = turn AND s.state IS NOT NULL
    ON CONFLICT DO NOTHING
$$;

-- Every path that ends a turn (its end state, a failure, a stop, a dead replica's turns
-- marked interrupted, a queued turn withdrawn) notifies in its own transaction. A config
-- kept while the turn ends is not missed: keeping one locks the turn's row first, so
-- either the end waits for the config (and this trigger, running after, sees it) or the
-- config waits for the end (and notifies itself, `Store::put_push_config`).
CREATE FUNCTION a2a_turn_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM a2a_notify(NEW.team_id, NEW.id, NULL);
    RETURN NULL;
END
$$;

CREATE TRIGGER a2a_turn_ended AFTER UPDATE OF status ON turns FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status NOT IN ('queued', 'running'))
    EXECUTE FUNCTION a2a_turn_ended();
