"""The reply mapping, row by row: the shard's answer → the caller's status. First every row the
sidecar seed pins (its tests and comments, from simulator/seed_wire.py), then the rows of
docs/gateway.md, "Statuses", for what the seed describes only in prose."""

from __future__ import annotations

import pytest

from services.gateway.commands.reply_mapping import plane, status_for
from simulator.seed_wire import STATUS_ROWS


@pytest.mark.parametrize(("verb", "answer", "status", "line"), STATUS_ROWS,
                         ids=[f"{row[0]} {row[1]['kind']} {row[2]}" for row in STATUS_ROWS])
def test_every_row_the_seed_pins(verb, answer, status, line):
    assert status_for(verb, answer) == status


# (the row of docs/gateway.md, "Statuses", verb sent, shard answer, status)
TABLE = [
    ("bridge.busy on the event plane", "lease.apply", {"kind": "bridge.busy"}, 425),
    ("bridge.busy on the account plane", "account.create", {"kind": "bridge.busy"}, 425),
    ("bridge.busy on the admin plane", "admin.ban", {"kind": "bridge.busy"}, 425),
    ("bridge.busy on a generic verb", "pages.list", {"kind": "bridge.busy"}, 425),
    ("a normal reply", "world.spawn", {"kind": "world.spawn.ok", "serials": []}, 200),
    ("a replayed reply", "world.despawn", {"kind": "world.despawn.ok", "removed": ["0x1"], "replayed": True}, 200),
    ("lease.drifted", "lease.release", {"kind": "lease.drifted", "current": "5"}, 200),
    ("event plane disabled", "world.spawn", {"kind": "world.error", "reason": "the event plane is disabled"}, 403),
    ("event: bridge.error is read by its reason too", "world.save",
     {"kind": "bridge.error", "reason": "the event plane is disabled on this shard (Bridge.EventsEnabled)"}, 403),
    ("event: a close of a run not counted", "participation.close",
     {"kind": "participation.error", "reason": "this shard is not counting run 'r1'"}, 404),
    ("account: name clash", "account.create", {"kind": "account.error", "reason": "already exists"}, 409),
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
    ("generic bridge.error unknown", "pages.list", {"kind": "bridge.error", "reason": "unknown account"}, 404),
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
                                                ("link.delete", "account"),
                                                ("pages.list", "generic"), ("news.add", "generic")])
def test_a_verb_belongs_to_the_plane_of_its_first_word(verb, expected):
    assert plane(verb) == expected


def test_an_error_reason_may_come_as_error_instead_of_reason():
    answer = {"kind": "oneshot.error",
              "error": "This shard saves at most every 300 seconds, and the last save was 1 seconds ago"}
    assert status_for("world.save", answer) == 429


@pytest.mark.parametrize(("verb", "reason", "status"), [
    ("lease.apply", "no lease offered for key x", 400),
    ("world.save", "save too soon after the last", 400),
])
def test_sentences_no_seed_speaks_are_not_read_as_the_seeds(verb, reason, status):
    # The old dialect's paraphrases: a real shard never says them, so they map to nothing special.
    assert status_for(verb, {"kind": "lease.error", "reason": reason}) == status
