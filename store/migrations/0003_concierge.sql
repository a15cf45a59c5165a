-- B1: a concierge agent is also offered the agent tools (create, archive, change the
-- system prompt of its team's agents). Every existing agent stays an ordinary one.
ALTER TABLE agents ADD COLUMN concierge boolean NOT NULL DEFAULT false;
