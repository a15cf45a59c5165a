-- Issue 50, hole 10: a connector's OAuth callback is bound to the principal and the
-- browser that began the flow, so a link sent to someone else cannot attach their account
-- to the sender's grant. The browser keeps a per-flow nonce in a cookie; the flow keeps
-- its SHA-256 here, set when the flow's URL is handed to the principal that began it
-- (`POST /v1/connectors/{id}/authorize`, or `POST /v1/oauth/flows/{flow}` for a flow a
-- turn began). A callback takes the flow only with the matching nonce; a flow without a
-- browser yet (a turn's, not handed out) is taken by none. Flows begun before this have
-- none and expire unused within their ten minutes.
ALTER TABLE oauth_flows
    ADD COLUMN browser_hash bytea CHECK (length(browser_hash) = 32);

-- Pending flows are bounded per connector and per principal that began them
-- (`authorization::MAX_LIVE_FLOWS_PER_PRINCIPAL`); a turn hands out again a live flow its
-- own principal began.
CREATE INDEX oauth_flows_actor ON oauth_flows (connector_id, actor_kind, actor, expires_at);
