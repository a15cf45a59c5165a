-- W13: an agent secret with egress settings ({hosts, header, format}) never enters its
-- sandbox: the commands hold a placeholder and the egress proxy sets the value on requests
-- to its hosts. NULL: an ordinary secret, in the commands' environment as before.
ALTER TABLE secrets ADD COLUMN egress jsonb;
