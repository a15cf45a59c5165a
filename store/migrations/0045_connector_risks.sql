-- Issue 50, hole 10: a connector's MCP annotations (`readOnlyHint`, ...) are its server's
-- claims, so they lower no tool's risk class below `write` unless an admin marked the
-- connector's hints trusted; an admin may also set a tool's class outright, by the tool's
-- name on the server (`{"tool": "read" | "write" | "external" | "irreversible"}`).
ALTER TABLE connectors
    ADD COLUMN trust_hints boolean NOT NULL DEFAULT false,
    ADD COLUMN tool_risks  jsonb NOT NULL DEFAULT '{}'::jsonb
        CHECK (jsonb_typeof(tool_risks) = 'object');
