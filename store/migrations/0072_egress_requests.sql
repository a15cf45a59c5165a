-- W15: what a session's commands reached through its egress proxy, one row per request
-- (a tunnel counts as one): host, port, method, status, the refusal class, bytes both
-- ways, whether the proxy ended TLS. Never a body, a header or a path. Written in batches
-- by the runtime-manager, at most a fixed number per session (the rest counted in
-- egress_requests_dropped); removed with its session.
CREATE TABLE egress_requests (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team_id         uuid NOT NULL,
    session_id      uuid NOT NULL,
    host            text NOT NULL,
    port            integer NOT NULL,
    method          text NOT NULL,
    status          integer NOT NULL,
    refused         text,
    bytes_sent      bigint NOT NULL,
    bytes_received  bigint NOT NULL,
    tls_ended       boolean NOT NULL,
    at              timestamptz NOT NULL,
    FOREIGN KEY (team_id, session_id) REFERENCES agent_runtime_sessions (team_id, id)
        ON DELETE CASCADE
);
CREATE INDEX egress_requests_session ON egress_requests (session_id, id);
ALTER TABLE agent_runtime_sessions
    ADD COLUMN egress_requests_dropped bigint NOT NULL DEFAULT 0;
