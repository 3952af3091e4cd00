"""The website's door: the sidecar's HTTP routes, the ledger and installer over HTTP, and a
live feed (WebSocket and server-sent events), meeting the other services only on NATS."""
