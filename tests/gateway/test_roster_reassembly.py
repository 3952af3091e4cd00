"""Roster reassembly, one test per rule of SPEC section 2: a roster is written whole, never partial."""

from __future__ import annotations

from services.gateway.boards import RosterAssembler


def chunk(seq: int, members: list, more: bool) -> dict:
    return {"kind": "guild.roster", "seq": seq, "more": more, "members": members}


def test_a_one_frame_roster_is_complete_at_once():
    assert RosterAssembler().take("7", chunk(0, ["a", "b"], False)) == ["a", "b"]


def test_chunks_in_order_are_written_once_whole():
    r = RosterAssembler()
    assert r.take("7", chunk(0, ["a"], True)) is None
    assert r.take("7", chunk(1, ["b"], True)) is None
    assert r.take("7", chunk(2, ["c"], False)) == ["a", "b", "c"]
    assert r.partials == {}


def test_seq_0_starts_afresh_and_drops_a_leftover_partial():
    r = RosterAssembler()
    r.take("7", chunk(0, ["old"], True))
    assert r.take("7", chunk(0, ["new"], True)) is None
    assert r.take("7", chunk(1, ["x"], False)) == ["new", "x"]


def test_an_out_of_order_seq_discards_the_partial():
    r = RosterAssembler()
    r.take("7", chunk(0, ["a"], True))
    assert r.take("7", chunk(2, ["c"], False)) is None
    assert r.take("7", chunk(1, ["b"], False)) is None  # nothing left to continue
    assert r.partials == {}


def test_a_continuation_with_no_start_is_ignored():
    r = RosterAssembler()
    assert r.take("7", chunk(1, ["b"], False)) is None
    assert r.partials == {}


def test_guilds_interleave_independently():
    r = RosterAssembler()
    r.take("7", chunk(0, ["a1"], True))
    r.take("8", chunk(0, ["b1"], True))
    assert r.take("8", chunk(1, ["b2"], False)) == ["b1", "b2"]
    assert r.take("7", chunk(1, ["a2"], False)) == ["a1", "a2"]


def test_an_empty_member_list_is_a_complete_empty_roster():
    assert RosterAssembler().take("7", chunk(0, [], False)) == []


def test_more_than_the_member_cap_discards_the_partial():
    r = RosterAssembler(max_members=50_000)
    r.take("7", chunk(0, list(range(30_000)), True))
    assert r.take("7", chunk(1, list(range(30_000)), True)) is None
    assert r.partials == {}
    assert r.take("7", chunk(2, ["z"], False)) is None


def test_a_new_hello_clears_every_partial():
    # Each connection (each server.hello) gets a new assembler; nothing carries over.
    old = RosterAssembler()
    old.take("7", chunk(0, ["a"], True))
    after_hello = RosterAssembler()
    assert after_hello.take("7", chunk(1, ["b"], False)) is None


def test_a_chunk_whose_members_are_not_a_list_adds_no_members_and_still_completes():
    # S004:271-276: `members` … `.and_then(|m| m.as_array()).cloned().unwrap_or_default()`.
    r = RosterAssembler()
    r.take("7", chunk(0, ["a"], True))
    assert r.take("7", {"seq": 1, "more": False, "members": "oops"}) == ["a"]
    assert r.partials == {}


def test_a_roster_with_no_seq_or_more_is_a_whole_one_frame_roster():
    # S004:265-270: seq `unwrap_or(0)`, more `unwrap_or(false)`.
    assert RosterAssembler().take("7", {"members": ["a"]}) == ["a"]
    assert RosterAssembler().take("7", {"seq": "1", "more": "yes", "members": ["b"]}) == ["b"]
