"""The gateway: shard connections in, NATS messages out; commands back to the shard."""
