-- D1 (issue 26): whether a turn ran with no client to end it (`POST .../messages` with
-- `"background": true`, an autostart, an approval answered through `POST /v1/approvals`).
-- The turns written before: an autostart always ran so; a continuation's mode was not
-- recorded and reads as interactive.
ALTER TABLE turns ADD COLUMN background boolean NOT NULL DEFAULT false;
UPDATE turns SET background = true WHERE trigger = 'autostart';

-- D1: what a hang-up of the client of an interactive turn does: `cancel` (the turn stops,
-- T8) or `continue` (it runs to its end like a background turn).
ALTER TABLE agents ADD COLUMN disconnect_policy text NOT NULL DEFAULT 'cancel'
    CHECK (disconnect_policy IN ('cancel', 'continue'));
