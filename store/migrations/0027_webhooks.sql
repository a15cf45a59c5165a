-- P4 (issue 28): signed webhooks, delivered at least once from an outbox.
--
-- A subscription: where a team's events go, and the signing secret (sealed under
-- BRAIN_SECRETS_KEY with AES-256-GCM, bound to its team and id, as team secrets are).
CREATE TABLE webhooks (
    id            uuid PRIMARY KEY,
    team_id       uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    url           text NOT NULL CHECK (length(url) BETWEEN 1 AND 2048),
    events        text[] NOT NULL CHECK (cardinality(events) BETWEEN 1 AND 16),
    secret_nonce  bytea NOT NULL,
    secret_sealed bytea NOT NULL,
    -- Events not recorded because the webhook's outbox was full.
    dropped       bigint NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhooks_team ON webhooks (team_id, created_at, id);

-- The outbox: one row per (event, destination), written in the transaction of the event.
-- A destination is a subscription (`webhook_id`) or a URL of its own (`target_url`: an A2A
-- push notification config, which 0028 references). `next_attempt_at`
-- is also the claim's visibility timeout: a replica that claims a row moves it past the
-- attempt's bound, so a replica killed mid-attempt leaves it to be claimed again.
CREATE TABLE webhook_deliveries (
    id              uuid PRIMARY KEY,
    seq             bigint GENERATED ALWAYS AS IDENTITY,
    team_id         uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    webhook_id      uuid REFERENCES webhooks (id) ON DELETE CASCADE,
    target_url      text CHECK (length(target_url) BETWEEN 1 AND 2048),
    event           text NOT NULL,
    -- What makes an event the same event: a second write of it is not a second delivery.
    event_key       text NOT NULL,
    payload         jsonb NOT NULL,
    state           text NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    CHECK ((webhook_id IS NULL) <> (target_url IS NULL))
);
CREATE UNIQUE INDEX webhook_deliveries_once
    ON webhook_deliveries (team_id, coalesce(webhook_id, '00000000-0000-0000-0000-000000000000'::uuid),
                           event, event_key);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (webhook_id) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_listing ON webhook_deliveries (webhook_id, seq);

-- Each attempt of a delivery: when, the status answered (none: the request failed), an
-- error class, how long it took. Never the response body.
CREATE TABLE webhook_attempts (
    delivery_id uuid NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    attempt     integer NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    status      integer,
    error       text,
    duration_ms integer NOT NULL,
    PRIMARY KEY (delivery_id, attempt)
);
