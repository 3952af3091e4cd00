"""What every shardbus service shares: settings, subject names, reply envelope, NATS and
database helpers, logging. Imports no service."""
