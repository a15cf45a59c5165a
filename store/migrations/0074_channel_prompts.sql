-- P16: an approval asked in a channel as the platform's buttons. A button carries an
-- opaque short token (Telegram's `callback_data` holds at most 64 bytes, and a button's
-- data is the client's to forge), never the approval id: the token names the approval,
-- the channel and the conversation it was asked in, and a press is taken only from that
-- channel and conversation. One token per approval and channel, whichever replica sends
-- the prompt and however often it is sent again.
CREATE TABLE channel_prompts (
    token        text PRIMARY KEY CHECK (length(token) BETWEEN 16 AND 32),
    channel_id   uuid NOT NULL REFERENCES agent_channels (id) ON DELETE CASCADE,
    conversation text NOT NULL CHECK (length(conversation) BETWEEN 1 AND 256),
    approval_id  uuid NOT NULL REFERENCES approvals (id) ON DELETE CASCADE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (channel_id, approval_id)
);
CREATE INDEX channel_prompts_approval ON channel_prompts (approval_id);
