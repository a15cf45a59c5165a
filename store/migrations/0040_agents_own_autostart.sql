-- X1 (issue 50): an autostart's chat is the agent's own. Its turns act with an admin's
-- authority, so only admins read or write it; `autostart` marks it (the chats an
-- agent's pointer names today are marked here).
ALTER TABLE chats ADD COLUMN autostart boolean NOT NULL DEFAULT false;
UPDATE chats c SET autostart = true
FROM agents a
WHERE a.autostart_chat_id = c.id AND a.id = c.agent_id AND a.team_id = c.team_id;

-- X1 (issue 50): why a cadence stopped firing until an admin sets it again
-- (`setter_revoked`: who set it lost their standing). A paused cadence has no next tick.
ALTER TABLE agents ADD COLUMN autostart_paused text;
