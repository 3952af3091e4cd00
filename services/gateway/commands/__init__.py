"""The gateway's commands: a request's body to the shard's line, and the shard's answer to a status
(docs/gateway.md, "Modules")."""
