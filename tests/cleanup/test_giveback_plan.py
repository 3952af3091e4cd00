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
def test_a_world_object_is_despawned_on_its_runs_shard(kind):
    command = giveback.plan(_row(kind=kind), "uo1")
    assert isinstance(command, Command)
    assert command.subject == "shard.uo1.cmd.world.despawn"
    assert command.payload == {"runId": "run-a", "ref": "0x4001", "idempotencyKey": "cleanup:run-a:41"}


def test_a_lease_is_released_with_expected_and_baseline():
    row = _row(kind="lease", ref="spawn.rate",
               revert={"key": "spawn.rate", "target": None, "expected": "2", "baseline": "1"})
    command = giveback.plan(row, "uo1")
    assert command.subject == "shard.uo1.cmd.lease.release"
    assert command.payload == {"runId": "run-a", "key": "spawn.rate", "expected": "2", "baseline": "1",
                               "idempotencyKey": "cleanup:run-a:41"}


def test_a_lease_on_one_target_names_the_target():
    row = _row(kind="lease", revert={"key": "loot.bonus", "target": "dungeon-3", "expected": "2", "baseline": "0"})
    assert giveback.plan(row, "uo1").payload["target"] == "dungeon-3"


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
    ({"key": "spawn.rate", "expected": "2"}, "'baseline'"),
    ({"key": "spawn.rate", "expected": "2", "baseline": None}, "'baseline'"),
    ({"expected": "2", "baseline": "1"}, "'key'"),
    ({"key": "spawn.rate"}, "'expected', 'baseline'"),
])
def test_a_lease_whose_revert_data_is_incomplete_fails_without_reaching_the_shard(revert, names):
    outcome = giveback.plan(_row(kind="lease", revert=revert), "uo1")
    assert isinstance(outcome, Outcome) and outcome.verdict is Verdict.FAILED
    assert f"lacks {names}" in outcome.reason and "by hand" in outcome.reason


def test_a_run_without_a_valid_shard_fails_with_the_reason():
    outcome = giveback.plan(_row(), "")
    assert outcome.verdict is Verdict.FAILED and "no valid shard" in outcome.reason
