"""Every string that becomes a subject token, a key or a path is matched whole: Python's ``$``
also matches before a trailing newline, so ``re.match(r"^[a-z]+$", "uoa\\n")`` succeeds
(../shared/STACK_NOTES.md section 6). Table-driven over every such check."""

from __future__ import annotations

import pytest

from services.gateway.boards.rules import RULES_BY_KIND, item_id
from services.gateway.boards.store import NEWS_ID
from services.gateway.shard_link.wire import is_safe_kind
from services.installer.manifest import is_module_id
from shared.contracts.ledger import is_module_name
from shared.subjects import is_shard_id


def vendor_serial(value: str) -> bool:
    return item_id(RULES_BY_KIND["vendor.listing"], {"serial": value}) is not None


CHECKS = [("shard id", is_shard_id, "uoa"), ("frame kind", is_safe_kind, "guild.update"),
          ("installer module id", is_module_id, "uo-events"), ("ledger module name", is_module_name, "events"),
          ("board item id", vendor_serial, "0x4000CC01"), ("news id", lambda v: bool(NEWS_ID.fullmatch(v)), "n1")]


@pytest.mark.parametrize(("what", "check", "good"), CHECKS, ids=[c[0] for c in CHECKS])
@pytest.mark.parametrize("tail", ["\n", "\r\n", " ", "\x00", ".", "*"])
def test_a_good_value_passes_and_the_same_with_a_tail_does_not(what, check, good, tail):
    assert check(good) is True
    if what == "frame kind" and tail == ".":
        return  # "guild.update." is refused too, but as an empty token; covered below
    assert check(good + tail) is False


def test_a_kind_ending_in_an_empty_token_is_refused():
    assert is_safe_kind("guild.update.") is False
