-- R3 across replicas: the brain replica holding an idle slot's channel. Any replica may
-- claim any idle slot; the claimer asks the holder (over the relay) to bind the worker,
-- and the session's calls are relayed to it like any other (W4).
ALTER TABLE worker_pool ADD COLUMN holder_replica uuid;
