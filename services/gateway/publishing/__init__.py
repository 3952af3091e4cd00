"""The gateway's publishing: each shard's frames into JetStream, in order, nothing lost or
acknowledged early (docs/gateway.md, "Modules")."""
