"""The four shardbus services. Each is a folder; they meet on NATS subjects, never on imports."""
