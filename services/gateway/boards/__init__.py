"""The gateway's the boards: which frames change which board (rules.py) and the key-value buckets
(store.py) (docs/gateway.md, "Modules")."""
