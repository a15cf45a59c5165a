-- W14: the agent's egress allowlist ({allow: [host patterns]}). NULL: every host, the
-- behaviour before W14 (the address rule applies either way).
ALTER TABLE agents ADD COLUMN egress jsonb;
