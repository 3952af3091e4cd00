"""The hosts checker finds what it is for (docs/reliability.md, "Hosts"): a clean history of frames
and commands passes, and each broken promise is named. Pure, no hosts."""

from __future__ import annotations

from typing import Any

from tests.hosts.checker import CALM_COMMANDS, Verdict, check, check_commands


def frames_history() -> tuple[dict[str, Any], dict[str, list[int]]]:
    """A shard that sent 1..5, was acknowledged each (3 twice: a resend), all stored in order."""
    return {"h0": {"sent": [1, 2, 3, 4, 5], "acks": [1, 2, 3, 3, 4, 5], "unacked": []}}, {"h0": [1, 2, 3, 4, 5]}


def commands(*outcomes: int | str) -> list[dict[str, Any]]:
    """Outcomes of shard h0's commands in order: a status, or why there was no reply."""
    return [{"shard": "h0", "sent": k * 0.1, "took": 0.01,
             "status": o if isinstance(o, int) else None, "error": o if isinstance(o, str) else None}
            for k, o in enumerate(outcomes)]


def commands_verdict(outcomes: list[dict[str, Any]]) -> Verdict:
    verdict = Verdict()
    check_commands(verdict, outcomes, ["h0"])
    return verdict


def test_a_clean_history_passes_and_counts_what_it_saw() -> None:
    history, stored = frames_history()
    verdict = check(history, stored, {})
    check_commands(verdict, commands(200, "timeout", "no responders", 503, 504, *[200] * CALM_COMMANDS), ["h0"])
    assert verdict.violations == []
    assert (verdict.sent, verdict.acked, verdict.stored, verdict.resent_deduplicated) == (5, 5, 5, 1)
    assert verdict.commands == {"200": 6, "timeout": 1, "no responders": 1, "503": 1, "504": 1}
    assert "10 commands (200 6, 503 1, 504 1, no responders 1, timeout 1)" in verdict.summary()


def test_frames_lost_twice_or_out_of_order_are_each_named() -> None:
    history, _ = frames_history()
    verdict = check(history, {"h0": [1, 3, 2, 3, 5]}, {"h0": [4]})
    assert verdict.violations == [
        "h0: acknowledged but not in SHARD_FRAMES: 1 (4)",
        "h0: stored more than once: 1 (3)",
        "h0: stored out of the shard's order: 1 (2 after 3)",
        "h0: dead-lettered (given up on): 1 (4)",
    ]


def test_a_command_answered_with_an_undocumented_status_is_named() -> None:
    verdict = commands_verdict(commands(500, *[200] * CALM_COMMANDS))
    assert verdict.violations == ["h0: commands answered with an undocumented status: 1 (#0: 500)"]


def test_a_command_that_failed_otherwise_than_unanswered_is_named() -> None:
    verdict = commands_verdict(commands("not JSON", *[200] * CALM_COMMANDS))
    assert verdict.violations == ["h0: commands failed otherwise than with no reply: 1 (#0: not JSON)"]


def test_commands_still_failing_once_healed_are_named() -> None:
    verdict = commands_verdict(commands(*[200] * CALM_COMMANDS, 503, "timeout"))
    assert verdict.violations == [f"h0: commands not answered 200 once healed (the last {CALM_COMMANDS}): "
                                  f"2 (#{CALM_COMMANDS}: 503, #{CALM_COMMANDS + 1}: timeout)"]


def test_a_shard_hardly_commanded_proves_nothing() -> None:
    verdict = commands_verdict(commands(200))
    assert verdict.violations == [f"h0: only 1 commands sent, fewer than {CALM_COMMANDS}"]


def test_commands_through_the_door_are_held_to_the_same_promises_on_their_own() -> None:
    """The door's way is judged by itself: its last commands must be answered 200 too, whatever
    the NATS way's are, and its broken connections count as no reply."""
    door = [{**o, "via": "door"} for o in commands(503, "connection lost", *[200] * (CALM_COMMANDS - 1), 504)]
    verdict = commands_verdict(commands(*[200] * CALM_COMMANDS) + door)
    assert verdict.violations == [f"h0 via door: commands not answered 200 once healed (the last {CALM_COMMANDS}): "
                                  f"1 (#{CALM_COMMANDS + 1}: 504)"]
    assert verdict.commands["door connection lost"] == 1 and verdict.commands["200"] == CALM_COMMANDS
