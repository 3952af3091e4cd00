"""Which command gives a row back, with which stable idempotency key — and which rows cannot
be given back at all (they fail with a reason instead of reaching the shard)."""

from __future__ import annotations

import pytest

from services.cleanup import giveback
from services.cleanup.classify import Outcome, Verdict
from services.cleanup.giveback import Command


def _row(**over):
    row = {"resourceId": 41, "runId": "run-a", "module": "arena", "kind": "creature", "ref": "0x4001",
           "status": "reverting", "attempts": 0, "revert": {}}
    row.update(over)
    return row


@pytest.mark.parametrize("kind", sorted(giveback.WORLD_KINDS))
def test_a_world_object_is_despawned_on_its_runs_shard_by_its_serial_alone(kind):
    command = giveback.plan(_row(kind=kind), "uo1")
    assert isinstance(command, Command)
    assert command.subject == "shard.uo1.cmd.world.despawn"
    # One serial: never the seed's "no serials", which would despawn everything the run owns.
    assert command.payload == {"runId": "run-a", "serials": ["0x4001"], "idempotencyKey": "cleanup:run-a:41"}


def test_a_despawn_answer_is_read_for_the_rows_own_serial():
    command = giveback.plan(_row(), "uo1")
    other = {"status": 200, "body": {"kind": "world.despawn.ok", "runId": "run-a", "removed": ["0x4002"],
                                     "gone": [], "refused": []}}
    mine = {"status": 200, "body": {**other["body"], "gone": ["0x4001"]}}
    assert command.read(other).verdict is Verdict.FAILED
    assert command.read(mine).verdict is Verdict.REVERTED


def test_a_lease_is_released_with_expected_and_baseline_as_the_seed_writes_it():
    row = _row(kind="lease", ref="PlayerCaps.SkillCap",
               revert={"key": "PlayerCaps.SkillCap", "target": None, "expected": "1300", "baseline": "1200"})
    command = giveback.plan(row, "uo1")
    assert command.subject == "shard.uo1.cmd.lease.release"
    assert command.payload == {"key": "PlayerCaps.SkillCap", "expected": "1300", "baseline": "1200",
                               "idempotencyKey": "cleanup:run-a:41"}


def test_a_lease_on_one_target_names_the_target():
    row = _row(kind="lease", revert={"key": "Spawner.MaxCount", "target": "0x4000ABCD", "expected": "25",
                                     "baseline": "10"})
    assert giveback.plan(row, "uo1").payload["target"] == "0x4000ABCD"


def test_an_unknown_kind_goes_to_the_owning_modules_revert_subject():
    row = _row(kind="zone", ref="arena-north", revert={"radius": 20})
    command = giveback.plan(row, "uo1")
    assert command.subject == "modules.arena.revert"
    assert command.payload == {"runId": "run-a", "kind": "zone", "ref": "arena-north", "revert": {"radius": 20},
                               "idempotencyKey": "cleanup:run-a:41"}


def test_the_idempotency_key_depends_on_the_row_alone():
    first = giveback.plan(_row(attempts=0, status="reverting"), "uo1")
    again = giveback.plan(_row(attempts=2, status="reverting"), "uo1")
    other = giveback.plan(_row(resourceId=42), "uo1")
    assert first.payload["idempotencyKey"] == again.payload["idempotencyKey"]
    assert first.payload["idempotencyKey"] != other.payload["idempotencyKey"]


@pytest.mark.parametrize("revert, names", [
    ({"key": "PlayerCaps.SkillCap", "expected": "1300"}, "'baseline'"),
    ({"key": "PlayerCaps.SkillCap", "expected": "1300", "baseline": None}, "'baseline'"),
    ({"expected": "1300", "baseline": "1200"}, "'key'"),
    ({"key": "PlayerCaps.SkillCap"}, "'expected', 'baseline'"),
])
def test_a_lease_whose_revert_data_is_incomplete_fails_without_reaching_the_shard(revert, names):
    outcome = giveback.plan(_row(kind="lease", revert=revert), "uo1")
    assert isinstance(outcome, Outcome) and outcome.verdict is Verdict.FAILED
    assert f"lacks {names}" in outcome.reason and "by hand" in outcome.reason


def test_a_run_without_a_valid_shard_fails_with_the_reason():
    outcome = giveback.plan(_row(), "")
    assert outcome.verdict is Verdict.FAILED and "no valid shard" in outcome.reason
