-- T2/E2: a team's quota overrides. A field present in `overrides` replaces the default
-- from configuration (`BRAIN_QUOTA_*`); a present `null` means unlimited; an absent field
-- follows the default, so a changed default reaches every team that did not override it.
CREATE TABLE team_quotas (
    team_id     uuid PRIMARY KEY REFERENCES teams (id) ON DELETE CASCADE,
    overrides   jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(overrides) = 'object'),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The Postgres side of enforcement (Redis unreachable) and `GET /v1/quotas` count a
-- team's running turns and its turns of the last minute.
CREATE INDEX turns_team_running ON turns (team_id) WHERE status = 'running';
CREATE INDEX turns_team_started ON turns (team_id, started_at);
