-- P10, P11 (issue 57): chat channels (Telegram, Slack) of an agent, and their replies
-- delivered through the webhooks' outbox (0027): the same claim, lease and attempts, one
-- more kind of destination.
--
-- A channel: the platform, the API base it calls (held to the connector address rule),
-- who may talk to it, and two sealed values under BRAIN_SECRETS_KEY (bound to team,
-- channel and use, as webhook secrets are): the bot token, and what authenticates the
-- platform's calls to us (Telegram's `secret_token`, which the brain generates; Slack's
-- signing secret).
CREATE TABLE agent_channels (
    id               uuid PRIMARY KEY,
    team_id          uuid NOT NULL,
    agent_id         uuid NOT NULL,
    kind             text NOT NULL CHECK (kind IN ('telegram', 'slack')),
    api_base         text NOT NULL CHECK (length(api_base) BETWEEN 1 AND 2048),
    allowed_users    text[] NOT NULL CHECK (cardinality(allowed_users) <= 1000),
    allowed_channels text[] NOT NULL CHECK (cardinality(allowed_channels) <= 1000),
    token_nonce      bytea NOT NULL,
    token_sealed     bytea NOT NULL,
    secret_nonce     bytea NOT NULL,
    secret_sealed    bytea NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id) ON DELETE CASCADE
);
CREATE INDEX agent_channels_agent ON agent_channels (team_id, agent_id, created_at, id);

-- A conversation of a channel (a Telegram chat; a Slack channel thread or DM) is one chat
-- of the agent, opened by the person who first wrote there (its end user, L4).
CREATE TABLE channel_chats (
    channel_id   uuid NOT NULL REFERENCES agent_channels (id) ON DELETE CASCADE,
    conversation text NOT NULL CHECK (length(conversation) BETWEEN 1 AND 256),
    team_id      uuid NOT NULL,
    chat_id      uuid NOT NULL,
    PRIMARY KEY (channel_id, conversation),
    FOREIGN KEY (team_id, chat_id) REFERENCES chats (team_id, id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX channel_chats_chat ON channel_chats (team_id, chat_id);

-- When a person not allowed was last told so: at most once an hour each.
CREATE TABLE channel_refusals (
    channel_id    uuid NOT NULL REFERENCES agent_channels (id) ON DELETE CASCADE,
    platform_user text NOT NULL CHECK (length(platform_user) BETWEEN 1 AND 256),
    refused_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (channel_id, platform_user)
);

-- An outbox row goes to exactly one of: a webhook, a URL of its own (A2A), a channel.
ALTER TABLE webhook_deliveries
    ADD COLUMN channel_id uuid REFERENCES agent_channels (id) ON DELETE CASCADE,
    DROP CONSTRAINT webhook_deliveries_check,
    DROP CONSTRAINT webhook_deliveries_check1,
    ADD CONSTRAINT webhook_deliveries_destination
        CHECK (num_nonnulls(webhook_id, target_url, channel_id) = 1),
    ADD CONSTRAINT webhook_deliveries_push_target
        CHECK ((push_config IS NULL) = (target_url IS NULL));

-- The reply of a turn in a channel's chat is written by the turn's end itself, in that
-- write's transaction, whichever path ended it (as A2A pushes are, 0028): one row per turn
-- (keyed by it), holding ids only; the text is read from the turn's message when it is
-- sent, so the outbox holds no message text. A turn of a chat without a channel pays one
-- probe of `channel_chats_chat`.
CREATE FUNCTION channel_turn_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_deliveries (id, team_id, channel_id, event, event_key, payload)
    SELECT gen_random_uuid(), c.team_id, c.channel_id, 'channel.reply', NEW.id::text,
           jsonb_build_object('turn_id', NEW.id, 'chat_id', NEW.chat_id,
                              'conversation', c.conversation, 'sent', 0)
    FROM channel_chats c WHERE c.team_id = NEW.team_id AND c.chat_id = NEW.chat_id
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

CREATE TRIGGER channel_turn_ended AFTER UPDATE OF status ON turns FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status IN ('completed', 'failed'))
    EXECUTE FUNCTION channel_turn_ended();
