-- X1, L2 (issue 50): a memory written in an end user's chat is that user's: only turns
-- in their chats recall it, and erasing the user (`DELETE /v1/users/{sub}`) erases it.
-- NULL is agent-wide (written in a chat an API key opened). Notes kept with their turn
-- are attributed to that turn's chat; older ones stay agent-wide.
ALTER TABLE memories ADD COLUMN user_id text;
UPDATE memories m SET user_id = c.created_by
FROM turns t JOIN chats c ON c.id = t.chat_id
WHERE m.turn_id = t.id AND c.created_by IS NOT NULL;
CREATE INDEX memories_user ON memories (team_id, user_id) WHERE user_id IS NOT NULL;
