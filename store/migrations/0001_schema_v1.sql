-- Schema v1: everything SPEC "What survives a turn" names. Every row carries team_id, and
-- child rows reference their parent through (team_id, id) so a row can never point at
-- another team's parent.

CREATE TABLE teams (
    id          uuid PRIMARY KEY,
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Keys are 256-bit random strings, so a plain SHA-256 is a sufficient hash: there is
-- nothing to brute-force that a slow hash would protect.
CREATE TABLE api_keys (
    id          uuid PRIMARY KEY,
    team_id     uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    key_hash    bytea NOT NULL UNIQUE,
    prefix      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

CREATE TABLE agents (
    id                uuid PRIMARY KEY,
    team_id           uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    name              text NOT NULL,
    system_prompt     text NOT NULL,
    model             text NOT NULL,
    fallback_models   text[] NOT NULL DEFAULT '{}',
    runtime_profile   text NOT NULL DEFAULT 'none',
    autostart_cron    text,
    autostart_prompt  text,
    archived_at       timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, id)
);
CREATE INDEX agents_team ON agents (team_id, created_at);

CREATE TABLE chats (
    id           uuid PRIMARY KEY,
    team_id      uuid NOT NULL,
    agent_id     uuid NOT NULL,
    title        text,
    -- M1: older messages folded into prose; summary_through is the seq of the last message
    -- the summary covers, so nothing is dropped without being summarized.
    summary          text NOT NULL DEFAULT '',
    summary_through  bigint NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, id),
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id) ON DELETE CASCADE
);
CREATE INDEX chats_agent ON chats (agent_id, created_at);

CREATE TABLE turns (
    id           uuid PRIMARY KEY,
    team_id      uuid NOT NULL,
    agent_id     uuid NOT NULL,
    chat_id      uuid NOT NULL,
    trigger      text NOT NULL CHECK (trigger IN ('user', 'autostart')),
    status       text NOT NULL CHECK (status IN ('running', 'completed', 'interrupted', 'failed')),
    -- T3: the run's frozen basis (system prompt, tool catalog, model route, options),
    -- written before the first provider request.
    composition  jsonb NOT NULL,
    error_code   text,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    UNIQUE (team_id, id),
    FOREIGN KEY (team_id, chat_id) REFERENCES chats (team_id, id) ON DELETE CASCADE,
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id) ON DELETE CASCADE
);
CREATE INDEX turns_chat ON turns (chat_id, started_at);
CREATE INDEX turns_running ON turns (started_at) WHERE status = 'running';

CREATE TABLE messages (
    id                 uuid PRIMARY KEY,
    seq                bigint GENERATED ALWAYS AS IDENTITY,
    team_id            uuid NOT NULL,
    chat_id            uuid NOT NULL,
    turn_id            uuid NOT NULL,
    role               text NOT NULL CHECK (role IN ('user', 'assistant')),
    -- UI message parts as the AI SDK shapes them: [{"type":"text","text":...}, ...].
    parts              jsonb NOT NULL,
    status             text NOT NULL CHECK (status IN ('complete', 'interrupted')),
    client_message_id  text CHECK (length(client_message_id) BETWEEN 1 AND 200),
    created_at         timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (team_id, chat_id) REFERENCES chats (team_id, id) ON DELETE CASCADE,
    FOREIGN KEY (team_id, turn_id) REFERENCES turns (team_id, id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX messages_seq ON messages (chat_id, seq);
-- T12: a client message id names one user message (and so one turn) per chat.
CREATE UNIQUE INDEX messages_client_id ON messages (chat_id, client_message_id)
    WHERE client_message_id IS NOT NULL;
CREATE INDEX messages_turn ON messages (turn_id);

CREATE TABLE agent_runtime_sessions (
    id              uuid PRIMARY KEY,
    team_id         uuid NOT NULL,
    agent_id        uuid NOT NULL,
    chat_id         uuid NOT NULL,
    profile         text NOT NULL,
    state           text NOT NULL CHECK (state IN
                        ('pending', 'provisioning', 'connecting', 'ready', 'idle',
                         'terminating', 'terminated', 'failed')),
    failure_reason  text,
    failure_detail  text,
    worker_ref      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    last_used_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, id),
    FOREIGN KEY (team_id, chat_id) REFERENCES chats (team_id, id) ON DELETE CASCADE,
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id) ON DELETE CASCADE
);
-- W1: at most one live session per (agent, chat).
CREATE UNIQUE INDEX sessions_live ON agent_runtime_sessions (agent_id, chat_id)
    WHERE state NOT IN ('terminated', 'failed');

-- T11: each autostart firing is one row, claimed once whichever replica sees it.
CREATE TABLE scheduled_tasks (
    id          uuid PRIMARY KEY,
    team_id     uuid NOT NULL,
    agent_id    uuid NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('autostart')),
    due_at      timestamptz NOT NULL,
    state       text NOT NULL CHECK (state IN ('pending', 'running', 'done', 'skipped', 'failed')),
    turn_id     uuid,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (agent_id, kind, due_at),
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id) ON DELETE CASCADE
);
CREATE INDEX scheduled_tasks_due ON scheduled_tasks (due_at) WHERE state = 'pending';

CREATE TABLE memories (
    id          uuid PRIMARY KEY,
    team_id     uuid NOT NULL,
    agent_id    uuid NOT NULL,
    content     text NOT NULL,
    search      tsvector GENERATED ALWAYS AS (to_tsvector('simple', content)) STORED,
    created_at  timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id) ON DELETE CASCADE
);
CREATE INDEX memories_search ON memories USING gin (search);
CREATE INDEX memories_agent ON memories (agent_id, created_at);

-- B1: values are AES-GCM ciphertext; the key never reaches the database.
CREATE TABLE secrets (
    id          uuid PRIMARY KEY,
    team_id     uuid NOT NULL,
    agent_id    uuid NOT NULL,
    name        text NOT NULL,
    nonce       bytea NOT NULL,
    ciphertext  bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (agent_id, name),
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id) ON DELETE CASCADE
);

-- E1: one row per usage event; event_key makes a retried write land once.
CREATE TABLE billing_events (
    id             uuid PRIMARY KEY,
    team_id        uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    agent_id       uuid NOT NULL,
    turn_id        uuid,
    event_key      text NOT NULL UNIQUE,
    kind           text NOT NULL CHECK (kind IN ('model_call', 'worker_seconds')),
    model          text,
    input_tokens   bigint,
    output_tokens  bigint,
    seconds        double precision,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX billing_events_team ON billing_events (team_id, created_at);
