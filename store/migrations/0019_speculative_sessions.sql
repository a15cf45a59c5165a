-- W11: a session started speculatively, when the model began streaming a worker tool
-- call, before the call existed. `speculative` holds until a call uses the session; a
-- turn that ends without one sets `speculation_expires_at` (its end plus a short grace),
-- and the runtime-manager tears a still unused session down then, instead of after the
-- profile's idle window.
ALTER TABLE agent_runtime_sessions
    ADD COLUMN speculative boolean NOT NULL DEFAULT false,
    ADD COLUMN speculation_expires_at timestamptz;
