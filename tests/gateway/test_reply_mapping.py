"""SPEC section 2's reply mapping table, row by row: the shard's answer → the caller's status."""

from __future__ import annotations

import pytest

from services.gateway.reply_mapping import plane, status_for

# (SPEC row, verb sent, shard answer, status)
TABLE = [
    ("bridge.busy on the event plane", "lease.apply", {"kind": "bridge.busy"}, 425),
    ("bridge.busy on the account plane", "account.create", {"kind": "bridge.busy"}, 425),
    ("bridge.busy on the admin plane", "admin.ban", {"kind": "bridge.busy"}, 425),
    ("bridge.busy on a generic verb", "help.pages", {"kind": "bridge.busy"}, 425),
    ("a normal reply", "world.spawn", {"kind": "world.spawned", "refs": []}, 200),
    ("a replayed reply", "world.despawn", {"kind": "world.despawn", "result": "removed", "replayed": True}, 200),
    ("lease.drifted", "lease.release", {"kind": "lease.drifted", "current": "5"}, 200),
    ("event plane disabled", "world.spawn", {"kind": "world.error", "reason": "the event plane is disabled"}, 403),
    ("event: no lease offered", "lease.apply", {"kind": "lease.error", "reason": "no lease offered for key x"}, 404),
    ("event: not counting that run", "participation.snapshot",
     {"kind": "participation.error", "reason": "not counting run r1"}, 404),
    ("event: no participation ledger", "item.grant",
     {"kind": "item.error", "reason": "no participation ledger for run r1"}, 404),
    ("event: a save too soon", "world.save", {"kind": "world.error", "reason": "save too soon after the last"}, 429),
    ("event: any other error", "world.spawn",
     {"kind": "world.error", "reason": "spawn of 3 would exceed the shard's ceiling of 2"}, 400),
    ("account: name clash", "account.create", {"kind": "account.error", "reason": "name clash: bob"}, 409),
    ("account: per-IP cap", "account.create", {"kind": "account.error", "reason": "per-IP account cap reached"}, 429),
    ("account: disabled", "account.create", {"kind": "account.error", "reason": "account creation is disabled"}, 403),
    ("account: protected", "account.password", {"kind": "account.error", "reason": "account is protected"}, 403),
    ("account: refused", "account.link", {"kind": "account.error", "reason": "link refused by the player"}, 403),
    ("account: unknown target", "account.link", {"kind": "account.error", "reason": "unknown account zed"}, 404),
    ("account: not linked", "account.unlink", {"kind": "account.error", "reason": "account is not linked"}, 404),
    ("account: anything else", "account.create", {"kind": "account.error", "reason": "name too short"}, 400),
    ("admin: protected", "admin.ban", {"kind": "admin.error", "reason": "account admin is protected"}, 403),
    ("admin: disabled", "admin.broadcast", {"kind": "admin.error", "reason": "broadcasts are disabled"}, 403),
    ("admin: unknown", "admin.unban", {"kind": "admin.error", "reason": "unknown account zed"}, 404),
    ("admin: anything else", "admin.ban", {"kind": "admin.error", "reason": "duration must be positive"}, 400),
    ("generic bridge.error unknown", "help.pages", {"kind": "bridge.error", "reason": "unknown verb help.pages"}, 404),
    ("generic bridge.error else", "lease.apply", {"kind": "bridge.error", "reason": "internal trouble"}, 400),
    ("generic *.error unknown", "news.add", {"kind": "news.error", "reason": "unknown article 4"}, 404),
    ("generic *.error else", "news.add", {"kind": "news.error", "reason": "title is required"}, 400),
]


@pytest.mark.parametrize(("row", "verb", "answer", "status"), TABLE, ids=[row[0] for row in TABLE])
def test_every_row_of_the_spec_reply_table(row, verb, answer, status):
    assert status_for(verb, answer) == status


@pytest.mark.parametrize(("verb", "expected"), [("lease.apply", "event"), ("participation.open", "event"),
                                                ("world.save", "event"), ("item.grant", "event"),
                                                ("account.create", "account"), ("admin.ban", "admin"),
                                                ("help.pages", "generic"), ("news.add", "generic")])
def test_a_verb_belongs_to_the_plane_of_its_first_word(verb, expected):
    assert plane(verb) == expected


def test_an_error_reason_may_come_as_error_instead_of_reason():
    assert status_for("world.save", {"kind": "world.error", "error": "Too soon"}) == 429
