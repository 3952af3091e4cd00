"""Every request/reply subject of every owner, from the owners' contract modules: what
``tests/contracts`` walks, and what a reader opens to see the whole surface at once."""

from __future__ import annotations

from shared.contracts import Contract, cleanup, gateway, installer, ledger

CONTRACTS: tuple[Contract, ...] = (*ledger.CONTRACTS, *cleanup.CONTRACTS, *installer.CONTRACTS,
                                    *gateway.CONTRACTS)
"""Every contract; each subject once."""

BY_SUBJECT: dict[str, Contract] = {contract.subject: contract for contract in CONTRACTS}
if len(BY_SUBJECT) != len(CONTRACTS):  # pragma: no cover - a subject written twice
    raise RuntimeError("a subject has more than one contract")
