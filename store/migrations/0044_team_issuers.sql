-- Issue 50, hole 8: a team's own JWT issuers. A token whose `iss` is one of these is
-- accepted for that team only, verified against the issuer's JWKS with its audience.
-- An `iss` names one team across the deployment: a token's team is found by it.
CREATE TABLE team_issuers (
    id uuid PRIMARY KEY,
    team_id uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    issuer text NOT NULL UNIQUE,
    audience text NOT NULL,
    jwks_url text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX team_issuers_team ON team_issuers (team_id, created_at, id);
