"""The seed sidecar's HTTP API, drop-in: ``routes.py`` forwards each route to the gateway as a
command or a board read; ``reply.py`` turns the gateway's reply into the sidecar's answer."""
