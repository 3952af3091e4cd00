"""What the contract tests check on every reply: the fields the sender put there that the
contract's model does not name (reply models keep unknown fields, ADR 4)."""

from __future__ import annotations

from pydantic import BaseModel


def unnamed_fields(model: BaseModel, where: str = "reply") -> list[str]:
    """Every field the sender put in ``model`` (or in a part of it) that the contract does not name."""
    found = [f"{where}.{name}" for name in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        for i, part in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(part, BaseModel):
                found += unnamed_fields(part, f"{where}.{name}[{i}]" if isinstance(value, list) else f"{where}.{name}")
    return found
