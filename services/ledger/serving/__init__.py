"""The ledger serving requests: each subject's action, the hot subjects' dispatcher and its
coalescers (docs/ledger.md, "Layout")."""
