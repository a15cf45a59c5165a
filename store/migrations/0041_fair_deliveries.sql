-- Issue 50, hole 7: one team's push receivers must not starve every team's webhooks.
--
-- The delivery claim takes each team's oldest due deliveries in turn, within a per-team
-- share of a replica's slots (`Store::claim_deliveries`): it finds the teams with pending
-- deliveries by a skip scan of this index (one probe per team) and each team's due ones by
-- a range of it. It replaces the claim's index over every team's rows by due time.
CREATE INDEX webhook_deliveries_team_due ON webhook_deliveries (team_id, next_attempt_at)
    WHERE state = 'pending';
DROP INDEX webhook_deliveries_due;

-- A team's pending push notifications are bounded when a config is kept
-- (`BRAIN_A2A_MAX_PENDING_PUSHES_PER_TEAM`); this counts them without reading the
-- team's webhook deliveries.
CREATE INDEX webhook_deliveries_push_pending ON webhook_deliveries (team_id)
    WHERE state = 'pending' AND push_config IS NOT NULL;
