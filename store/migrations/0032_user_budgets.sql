-- L4: budgets per end user (a JWT's subject), under the team's.
--
-- `team_quotas.per_user`: the limits every user of the team has, field by field like
-- `overrides` (a present `null` is unlimited); an absent field is unlimited, since no
-- configuration default applies per user.
ALTER TABLE team_quotas
    ADD COLUMN per_user jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(per_user) = 'object');

-- One user's overrides of the team's `per_user`, merged field by field over it.
CREATE TABLE user_quotas (
    team_id     uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    user_id     text NOT NULL CHECK (octet_length(user_id) BETWEEN 1 AND 255),
    overrides   jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(overrides) = 'object'),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, user_id)
);

-- Whose turn billed the event: the JWT subject of the turn's principal (its `actor`,
-- `user:<subject>`); null for an API key's turns and for worker-seconds. Set by a trigger
-- from the turn row, so every writer of model-call events (the turn's end state, the
-- summarizer, a retried bill) sets it alike.
ALTER TABLE billing_events ADD COLUMN user_id text;

CREATE FUNCTION billing_events_user() RETURNS trigger AS $$
BEGIN
    IF NEW.user_id IS NULL AND NEW.turn_id IS NOT NULL THEN
        SELECT substr(actor, 6) INTO NEW.user_id
        FROM turns WHERE id = NEW.turn_id AND actor LIKE 'user:%';
    END IF;
    RETURN NEW;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER billing_events_user BEFORE INSERT ON billing_events
    FOR EACH ROW EXECUTE FUNCTION billing_events_user();

-- No index of their own: a user's counts are the team's (`billing_events_team`,
-- `turns_team_running`, `turns_team_started`) filtered by user, a month's events or a
-- minute's turns of one team at most.
