-- X1 (issue 24): who set an agent's autostart, as `key:<id>` or `user:<subject>` (never a
-- credential). Its turns act with that principal's authority over the agent: only an
-- admin may set one, so a recorded setter is an admin; a cadence set before this column
-- (NULL) runs its turns with a chat principal's authority, which changes nothing of the
-- agent through its tools.
ALTER TABLE agents ADD COLUMN autostart_set_by text;

-- X1, A3 (issue 24): who answered an approval, and whether as an admin. A continuation
-- whose turn row was never written (its replica died, or a store error, between the
-- answer and the turn) is started again by whichever replica sees it stranded, with the
-- authority of who answered.
ALTER TABLE approvals ADD COLUMN answered_by text;
ALTER TABLE approvals ADD COLUMN answered_admin boolean NOT NULL DEFAULT false;
CREATE INDEX approvals_continuations ON approvals (answered_at)
    WHERE continuation_turn IS NOT NULL;
