-- A team's end users as the deployment knows them (X1): the brain keeps no directory of
-- the people an issuer signs tokens for, so an admin disables one here (their tokens are
-- refused, their detached work ends, a cadence they set pauses), and the admin claim of
-- the latest token of theirs seen tells a cadence whose setter lost admin at the issuer.
CREATE TABLE team_users (
    team_id     uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    sub         text NOT NULL,
    disabled_at timestamptz,
    -- The admin claim of the latest token of theirs seen; NULL before any was.
    admin       boolean,
    PRIMARY KEY (team_id, sub)
);
