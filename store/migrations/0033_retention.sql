-- L6 (issue 29): a team's retention. Transcripts, artifacts and workspace snapshots older
-- than `retention_days` are deleted by a sweep any replica may run; NULL keeps them.
ALTER TABLE teams
    ADD COLUMN retention_days integer CHECK (retention_days BETWEEN 1 AND 36500);

-- The sweep finds a team's turns that ended before the cutoff (their messages go with
-- them, found by `messages_turn`).
CREATE INDEX turns_team_finished ON turns (team_id, finished_at) WHERE finished_at IS NOT NULL;
