"""The simulated shard's world and what each protocol-7 verb does to it. Pure state, no I/O:
``ShardWorld.execute(verb, body)`` returns the shard's answer (without ``reqId``).

Errors are answered as ``{"kind": "<verb>.error", "reason": "…"}`` (``bridge.error`` for an
unknown verb), with the reason words the gateway's reply mapping reads (SPEC section 2)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SPAWNABLE = ("creature", "boss", "npc", "gate", "decor")
"""What ``world.spawn`` can place."""

DEFAULT_LEASES = {"spawn.rate": "1", "loot.multiplier": "1", "weather": "clear", "skill.gain": "1"}
"""The lease catalog: keys a run may lease, with each key's value before any lease."""

ITEMS = ({"id": "gold", "name": "Gold coins"}, {"id": "trophy", "name": "Event trophy"},
         {"id": "dye", "name": "Rare dye tub"})
"""The item catalog ``item.grant`` gives from."""

PROTECTED_ACCOUNTS = frozenset({"admin", "owner"})
"""Accounts staff verbs may not touch."""


class Refusal(Exception):
    """A verb's error answer; the reason is what the shard says."""


@dataclass
class WorldObject:
    """Something a run placed in the world."""

    ref: str
    what: str
    run_id: str
    present: bool = True


@dataclass
class Hold:
    """A run's lease on a key: the value it set, the value before, and its deadline."""

    run_id: str
    value: str
    baseline: str
    until_ms: int


@dataclass
class ParticipationLedger:
    """Who took part in a run's event, and how much."""

    open: bool = True
    participants: dict[str, int] = field(default_factory=dict)


def _required(body: dict[str, Any], name: str) -> Any:
    value = body.get(name)
    if value is None or value == "":
        raise Refusal(f"{name} is required")
    return value


class ShardWorld:
    """A shard's state as the event, staff and account planes see it."""

    def __init__(self, *, clock: Callable[[], float] = time.time, spawn_ceiling: int = 500,
                 save_interval_s: float = 30.0, event_plane_enabled: bool = True,
                 leases: dict[str, str] | None = None, accounts_per_ip: int = 3) -> None:
        self.clock = clock
        self.spawn_ceiling, self.save_interval_s = spawn_ceiling, save_interval_s
        self.event_plane_enabled = event_plane_enabled
        self.catalog = dict(leases or DEFAULT_LEASES)
        self.values: dict[tuple[str, str], str] = {}
        self.holds: dict[tuple[str, str], Hold] = {}
        self.objects: dict[str, WorldObject] = {}
        self.ledgers: dict[str, ParticipationLedger] = {}
        self.accounts: dict[str, dict[str, Any]] = {name: {"ip": "", "banned": False} for name in
                                                    ("alice", "bob", *PROTECTED_ACCOUNTS)}
        self.accounts_per_ip = accounts_per_ip
        self.broadcasts: list[str] = []
        self.last_save: float | None = None
        self._serial = 0x40000000

    # --- hooks a test uses to play the world's other actors ---------------------------

    def kill(self, ref: str) -> None:
        """A player kills (or otherwise removes) a run's creature: it is gone from the world."""
        self.objects[ref].present = False

    def set_value(self, key: str, value: str, target: str | None = None) -> None:
        """Staff change a leased (or any catalog) value by hand."""
        self.values[(key, target or "")] = value

    def value(self, key: str, target: str | None = None) -> str:
        """The current value of ``key`` (for ``target``)."""
        return self.values.get((key, target or ""), self.catalog.get(key, ""))

    def participate(self, run_id: str, player: str, points: int = 1) -> None:
        """A player earns points in a run's event (counted only while its ledger is open)."""
        ledger = self.ledgers.get(run_id)
        if ledger and ledger.open:
            ledger.participants[player] = ledger.participants.get(player, 0) + points

    def expire_leases(self) -> list[dict[str, Any]]:
        """Restore the baseline of every lease past its deadline; frames telling the site so.

        A value somebody changed by hand since is left as they set it."""
        now_ms = int(self.clock() * 1000)
        frames = []
        for (key, target), hold in list(self.holds.items()):
            if hold.until_ms > now_ms:
                continue
            del self.holds[(key, target)]
            restored = self.value(key, target) == hold.value
            if restored:
                self.values[(key, target)] = hold.baseline
            frames.append({"kind": "lease.expired", "key": key, "target": target or None,
                           "runId": hold.run_id, "restored": restored, "value": self.value(key, target)})
        return frames

    # --- the verbs ------------------------------------------------------------------------

    def execute(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """Carry out one command; the shard's answer."""
        handler = getattr(self, "_" + verb.replace(".", "_"), None)
        if handler is None:
            return {"kind": "bridge.error", "reason": f"unknown verb {verb}"}
        if verb.split(".")[0] in ("lease", "participation", "world", "item") and not self.event_plane_enabled:
            return {"kind": f"{verb}.error", "reason": "the event plane is disabled on this shard"}
        try:
            return handler(body)
        except Refusal as exc:
            return {"kind": f"{verb}.error", "reason": str(exc)}
        except (TypeError, ValueError, AttributeError) as exc:  # a field of the wrong type
            return {"kind": f"{verb}.error", "reason": f"malformed {verb}: {exc}"}

    # leases

    def _lease_list(self, body: dict[str, Any]) -> dict[str, Any]:
        key, target = body.get("key"), body.get("target")
        items = [{"key": k, "target": t or None, "value": self.value(k, t), "runId": h.run_id,
                  "untilMs": h.until_ms}
                 for (k, t), h in sorted(self.holds.items())
                 if (key is None or k == key) and (target is None or t == target)]
        return {"kind": "lease.list", "items": items}

    def _lease_apply(self, body: dict[str, Any]) -> dict[str, Any]:
        run_id, key = _required(body, "runId"), _required(body, "key")
        value, hold_ms = body.get("value"), body.get("holdMs")
        if not isinstance(value, str):
            raise Refusal("value must be text")
        if type(hold_ms) is not int or hold_ms <= 0:
            raise Refusal("holdMs must be a positive integer")
        if key not in self.catalog:
            raise Refusal(f"no lease offered for key {key}")
        target = str(body.get("target") or "")
        held = self.holds.get((key, target))
        if held and held.run_id != run_id:
            raise Refusal(f"{key} is already leased by another run")
        baseline = held.baseline if held else self.value(key, target)
        until_ms = int(self.clock() * 1000) + hold_ms
        self.holds[(key, target)] = Hold(run_id, value, baseline, until_ms)
        self.values[(key, target)] = value
        return {"kind": "lease.applied", "runId": run_id, "key": key, "target": target or None,
                "value": value, "baseline": baseline, "untilMs": until_ms}

    def _lease_release(self, body: dict[str, Any]) -> dict[str, Any]:
        run_id, key = _required(body, "runId"), _required(body, "key")
        expected, baseline = _required(body, "expected"), _required(body, "baseline")
        if key not in self.catalog:
            raise Refusal(f"no lease offered for key {key}")
        target = str(body.get("target") or "")
        current = self.value(key, target)
        held = self.holds.get((key, target))
        if held and held.run_id != run_id:
            raise Refusal(f"{key} is leased by another run")
        if current not in (expected, baseline):
            # Compare-and-set: somebody changed it deliberately; never overwrite that.
            return {"kind": "lease.drifted", "runId": run_id, "key": key, "target": target or None,
                    "expected": expected, "current": current}
        self.holds.pop((key, target), None)
        self.values[(key, target)] = baseline
        return {"kind": "lease.released", "runId": run_id, "key": key, "target": target or None,
                "value": baseline}

    # world objects

    def _world_spawn(self, body: dict[str, Any]) -> dict[str, Any]:
        run_id, what = _required(body, "runId"), _required(body, "what")
        if what not in SPAWNABLE:
            raise Refusal(f"what must be one of {', '.join(SPAWNABLE)}")
        count = body.get("count", 1)
        if type(count) is not int or count < 1:
            raise Refusal("count must be a positive integer")
        present = sum(1 for o in self.objects.values() if o.present)
        if present + count > self.spawn_ceiling:
            raise Refusal(f"spawn of {count} would exceed the shard's ceiling of {self.spawn_ceiling}")
        refs = []
        for _ in range(count):
            self._serial += 1
            ref = f"0x{self._serial:08X}"
            self.objects[ref] = WorldObject(ref, what, run_id)
            refs.append(ref)
        return {"kind": "world.spawned", "runId": run_id, "what": what, "refs": refs}

    def _world_owned(self, body: dict[str, Any]) -> dict[str, Any]:
        run_id = _required(body, "runId")
        items = [{"ref": o.ref, "what": o.what} for o in self.objects.values()
                 if o.run_id == run_id and o.present]
        return {"kind": "world.owned", "runId": run_id, "items": items}

    def _world_despawn(self, body: dict[str, Any]) -> dict[str, Any]:
        run_id, ref = _required(body, "runId"), _required(body, "ref")
        obj = self.objects.get(ref)
        answer = {"kind": "world.despawn", "runId": run_id, "ref": ref}
        if obj is None or obj.run_id != run_id:
            return {**answer, "result": "refused", "reason": f"{ref} was never this run's"}
        if not obj.present:
            return {**answer, "result": "gone"}
        obj.present = False
        return {**answer, "result": "removed"}

    def _world_save(self, body: dict[str, Any]) -> dict[str, Any]:
        now = self.clock()
        if self.last_save is not None and now - self.last_save < self.save_interval_s:
            wait = self.save_interval_s - (now - self.last_save)
            raise Refusal(f"save too soon after the last; try again in {wait:.0f} s")
        self.last_save = now
        return {"kind": "world.saved", "at": int(now * 1000)}

    # participation and items

    def _ledger(self, body: dict[str, Any]) -> tuple[str, ParticipationLedger]:
        run_id = _required(body, "runId")
        ledger = self.ledgers.get(run_id)
        if ledger is None:
            raise Refusal(f"not counting run {run_id}: no participation ledger")
        return run_id, ledger

    def _participants(self, ledger: ParticipationLedger) -> list[dict[str, Any]]:
        return [{"name": n, "points": p} for n, p in sorted(ledger.participants.items())]

    def _participation_open(self, body: dict[str, Any]) -> dict[str, Any]:
        run_id = _required(body, "runId")
        self.ledgers.setdefault(run_id, ParticipationLedger()).open = True
        return {"kind": "participation.opened", "runId": run_id}

    def _participation_snapshot(self, body: dict[str, Any]) -> dict[str, Any]:
        run_id, ledger = self._ledger(body)
        return {"kind": "participation.snapshot", "runId": run_id, "open": ledger.open,
                "participants": self._participants(ledger)}

    def _participation_close(self, body: dict[str, Any]) -> dict[str, Any]:
        run_id, ledger = self._ledger(body)
        ledger.open = False
        return {"kind": "participation.closed", "runId": run_id, "participants": self._participants(ledger)}

    def _item_catalog(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"kind": "item.catalog", "items": list(ITEMS)}

    def _item_grant(self, body: dict[str, Any]) -> dict[str, Any]:
        item = _required(body, "item")
        run_id = _required(body, "runId")
        ledger = self.ledgers.get(run_id)
        if ledger is None:
            raise Refusal(f"no participation ledger for run {run_id}")
        if item not in {i["id"] for i in ITEMS}:
            raise Refusal(f"item {item} is not in the catalog")
        return {"kind": "item.granted", "runId": run_id, "item": item, "granted": len(ledger.participants)}

    # staff and accounts

    def _account(self, body: dict[str, Any]) -> str:
        name = _required(body, "account")
        if name not in self.accounts:
            raise Refusal(f"unknown account {name}")
        if name in PROTECTED_ACCOUNTS:
            raise Refusal(f"account {name} is protected")
        return name

    def _admin_ban(self, body: dict[str, Any]) -> dict[str, Any]:
        name = self._account(body)
        self.accounts[name]["banned"] = True
        return {"kind": "admin.ban", "account": name, "banned": True, "by": body.get("actor")}

    def _admin_unban(self, body: dict[str, Any]) -> dict[str, Any]:
        name = self._account(body)
        self.accounts[name]["banned"] = False
        return {"kind": "admin.unban", "account": name, "banned": False, "by": body.get("actor")}

    def _admin_broadcast(self, body: dict[str, Any]) -> dict[str, Any]:
        message = _required(body, "message")
        self.broadcasts.append(str(message))
        return {"kind": "admin.broadcast", "delivered": sum(1 for a in self.accounts.values() if not a["banned"])}

    def _account_create(self, body: dict[str, Any]) -> dict[str, Any]:
        name, ip = _required(body, "name"), str(body.get("ip") or "")
        if name in self.accounts:
            raise Refusal(f"name clash: {name} is already taken")
        if ip and sum(1 for a in self.accounts.values() if a["ip"] == ip) >= self.accounts_per_ip:
            raise Refusal(f"per-IP account cap of {self.accounts_per_ip} reached")
        self.accounts[name] = {"ip": ip, "banned": False}
        return {"kind": "account.created", "name": name}

    def _help_pages(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"kind": "help.pages", "items": [{"id": "rules", "title": "Shard rules"},
                                                {"id": "events", "title": "Scheduled events"}]}
