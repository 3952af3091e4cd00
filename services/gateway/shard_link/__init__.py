"""The gateway's a shard's link: the TCP (and TLS) connection, the hello, its lines in and out
(docs/gateway.md, "Modules")."""
