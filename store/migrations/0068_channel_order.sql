-- P15 (issue 57): a channel's replies go out in order per conversation. A reply is not
-- claimed while an earlier row (by `seq`) of the same conversation of the same channel is
-- still pending; this index answers that probe for each offered row.
CREATE INDEX webhook_deliveries_conversation
    ON webhook_deliveries (channel_id, (payload->>'conversation'), seq)
    WHERE state = 'pending' AND channel_id IS NOT NULL;
