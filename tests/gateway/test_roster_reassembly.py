"""Roster reassembly, one test per rule of docs/gateway.md, "Boards" ("Roster reassembly"): a
roster is written whole, never partial."""

from __future__ import annotations

from services.gateway.boards.rules import RosterAssembler


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
    # A missing or non-array `members` is empty, as the seed reads it (docs/gateway.md, "Boards").
    r = RosterAssembler()
    r.take("7", chunk(0, ["a"], True))
    assert r.take("7", {"seq": 1, "more": False, "members": "oops"}) == ["a"]
    assert r.partials == {}


def test_a_roster_with_no_seq_or_more_is_a_whole_one_frame_roster():
    # A missing seq is 0, a missing more false, as the seed reads them (docs/gateway.md, "Boards").
    assert RosterAssembler().take("7", {"members": ["a"]}) == ["a"]
    assert RosterAssembler().take("7", {"seq": "1", "more": "yes", "members": ["b"]}) == ["b"]


def test_partials_of_many_guilds_never_hold_more_than_the_byte_cap_and_the_oldest_go_first():
    # A hostile shard starting roster after roster and finishing none: the member cap bounds one
    # guild, so all guilds together are bounded by the bytes of their lines.
    r = RosterAssembler(max_bytes=10_000)
    for guild in range(100):
        assert r.take(str(guild), chunk(0, ["m"], True), size=1_000) is None
        assert r.held_bytes <= 10_000
    assert len(r.partials) == 10 and r.evicted == 90
    assert list(r.partials) == [str(g) for g in range(90, 100)]  # the newest kept
    assert r.take("99", chunk(1, ["n"], False), size=1_000) == ["m", "n"]
    assert r.take("0", chunk(1, ["n"], False)) is None  # evicted: its continuation has no start
    assert r.held_bytes == 9_000


def test_a_finished_roster_gives_back_what_its_partial_held():
    r = RosterAssembler()
    r.take("7", chunk(0, ["a"], True), size=500)
    r.take("7", chunk(1, ["b"], True), size=500)
    assert r.held_bytes == 1_000
    assert r.take("7", chunk(2, ["c"], False), size=500) == ["a", "b", "c"]
    assert r.held_bytes == 0 and r.partials == {}
    r.take("8", chunk(0, ["a"], True), size=500)
    r.take("8", chunk(0, ["a"], True), size=300)  # seq 0 again: starts afresh
    assert r.held_bytes == 300
