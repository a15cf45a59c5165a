-- L1 (issue 29): a team the operator disabled. Its keys and tokens are refused, its
-- schedules do not fire; the row and everything of the team stay until it is erased.
ALTER TABLE teams ADD COLUMN disabled_at timestamptz;
