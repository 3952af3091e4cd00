"""The simulated shard's world and what each protocol-7 verb does to it, in the seed's words.
Pure state, no I/O: ``ShardWorld.execute(verb, body)`` returns the shard's answer (without
``reqId``), or None for a verb no seed route reaches (a real shard's answer to it is unknown,
so the simulator says nothing and the caller sees the gateway's 504).

Every answer kind and reason sentence comes from :mod:`simulator.seed_wire`; the seed line
of each is cited there. Where a verb refuses for a reason the seed gives no sentence for,
the simulator does not refuse: it carries on as leniently as the sidecar's passthrough.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SPAWNABLE = ("creature", "boss", "npc", "gate", "decor")
"""What ``world.spawn`` places (S004:1245)."""

PLACES_AT_MOST = 30
"""How many of one ``what`` one spawn may place (S004:1423: "1 to 30 of 'creature'")."""

LEASE_CATALOG = {"PlayerCaps.SkillCap": ("1200", False), "Spawner.MaxCount": ("10", True),
                 "Loot.RareChance": ("1", False), "Weather.Season": ("summer", False)}
"""Lease keys this shard offers: key → (baseline, targeted). ``PlayerCaps.SkillCap`` and the
targeted ``Spawner.MaxCount`` are the seed's (S004:1142, 1373); ``Loot.MaxProps`` is the seed's
example of a key NOT offered (S004:1473)."""

GRANTS = ({"item": "gold", "min": 1, "max": 100_000}, {"item": "trophy", "min": 1, "max": 1},
          {"item": "dye", "min": 1, "max": 5})
"""The grant allowlist ``item.catalog`` answers with (S004:1292-1297)."""

PROTECTED_ACCOUNTS = frozenset({"admin", "owner"})
"""Accounts staff verbs may not touch ("protected", S004:1599)."""

EVENT_GATE = "the event plane is disabled on this shard (Bridge.EventsEnabled)"
"""S004:1394."""

VERBS = frozenset({"admin.ban", "admin.unban", "admin.broadcast", "lease.list", "lease.apply", "lease.release",
                   "participation.open", "participation.snapshot", "participation.close", "world.spawn",
                   "world.owned", "world.despawn", "item.catalog", "item.grant", "world.save", "account.create",
                   "account.link", "account.unlink", "pages.list", "pages.respond"})
"""Every verb the seed's routes reach (S004:911-951); anything else is not answered."""


class Refusal(Exception):
    """A verb's error answer: ``kind`` and the seed's reason sentence."""

    def __init__(self, kind: str, reason: str, **extra: Any) -> None:
        super().__init__(reason)
        self.answer = {"kind": kind, **extra, "reason": reason}


@dataclass
class WorldObject:
    """Something a run placed in the world."""

    serial: str
    what: str
    run_id: str
    present: bool = True


@dataclass
class Hold:
    """A lease the shard holds: the value set, the value before, its deadline, and whether
    the deadline has fired (listed ``expired: true`` until teardown collects it)."""

    run_id: str | None
    value: str
    baseline: str
    until_ms: int
    expired: bool = False


@dataclass
class ParticipationLedger:
    """Who took part in a run's event."""

    open: bool = True
    participants: dict[str, dict[str, Any]] = field(default_factory=dict)


def _error_kind(verb: str) -> tuple[str, dict[str, Any]]:
    """The error kind of a verb's plane (S004:1393-1554), and ``action`` for the world verbs."""
    if verb in ("item.catalog", "item.grant", "world.save"):
        return "oneshot.error", {}
    head, _, action = verb.partition(".")
    if head == "world":
        return "world.error", {"action": action}
    return f"{head}.error", {}


class ShardWorld:
    """A shard's state as the event, staff, account and help-page planes see it."""

    def __init__(self, *, clock: Callable[[], float] = time.time, spawn_ceiling: int = PLACES_AT_MOST,
                 save_interval_s: int = 300, event_plane_enabled: bool = True,
                 leases: dict[str, tuple[str, bool]] | None = None) -> None:
        self.clock = clock
        self.spawn_ceiling, self.save_interval_s = spawn_ceiling, save_interval_s
        self.event_plane_enabled = event_plane_enabled
        self.catalog = dict(leases or LEASE_CATALOG)
        self.values: dict[tuple[str, str], str] = {}
        self.holds: dict[tuple[str, str], Hold] = {}
        self.objects: dict[str, WorldObject] = {}
        self.pruned: dict[str, set[str]] = {}
        self.despawned: Counter[str] = Counter()
        """How many answered ``world.despawn`` commands named each serial (one command carries
        many): a test's exactly-once check counts serials, not commands."""
        self.ledgers: dict[str, ParticipationLedger] = {}
        self.accounts: dict[str, dict[str, Any]] = {name: {"banned": False, "linked": None} for name in
                                                    ("alice", "bob", *PROTECTED_ACCOUNTS)}
        self.broadcasts: list[str] = []
        self.pages: dict[str, dict[str, Any]] = {}
        self.last_save: float | None = None
        self.frames: list[dict[str, Any]] = []
        """Frames the world emits by itself (``world.save.before|after``), for the shard to send."""
        self._serial = 0x40000000

    # --- hooks a test uses to play the world's other actors ---------------------------

    def kill(self, serial: str) -> None:
        """A player kills (or otherwise removes) a run's creature: it is gone from the world."""
        self.objects[serial].present = False

    def set_value(self, key: str, value: str, target: str | None = None) -> None:
        """Staff change a leased (or any catalog) value by hand."""
        self.values[(key, target or "")] = value

    def value(self, key: str, target: str | None = None) -> str:
        """The current value of ``key`` (for ``target``)."""
        return self.values.get((key, target or ""), self.catalog.get(key, ("", False))[0])

    def participate(self, run_id: str, serial: str, name: str, account: str | None = None) -> None:
        """A character takes part in a run's event (counted only while its ledger is open)."""
        ledger = self.ledgers.get(run_id)
        if ledger and ledger.open:
            ledger.participants[serial] = {"serial": serial, "name": name, "account": account}

    def page(self, page_id: str, account: str, text: str) -> None:
        """A player opens a help page."""
        self.pages[page_id] = {"id": page_id, "account": account, "text": text, "open": True}

    def expire_leases(self) -> list[tuple[str, str]]:
        """Restore the baseline of every lease past its deadline (a value somebody changed
        by hand since is left as they set it); the hold stays listed ``expired: true`` until
        teardown collects it (S004:1137-1140). The ``(key, target)`` of each that fired."""
        now_ms = int(self.clock() * 1000)
        fired = []
        for (key, target), hold in self.holds.items():
            if hold.expired or hold.until_ms > now_ms:
                continue
            hold.expired = True
            if self.value(key, target) == hold.value:
                self.values[(key, target)] = hold.baseline
            fired.append((key, target))
        return fired

    # --- the verbs ------------------------------------------------------------------------

    def execute(self, verb: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """Carry out one command; the shard's answer (None for a verb no seed route reaches)."""
        if verb not in VERBS:
            return None
        handler: Callable[[dict[str, Any]], dict[str, Any]] = getattr(self, "_" + verb.replace(".", "_"))
        kind, extra = _error_kind(verb)
        try:
            if kind in ("lease.error", "participation.error", "world.error", "oneshot.error") \
                    and not self.event_plane_enabled:
                raise Refusal(kind, EVENT_GATE, **extra)
            return handler(body)
        except Refusal as exc:
            return exc.answer

    # leases (S004:1131-1196)

    def _offered(self, key: Any) -> tuple[str, bool]:
        """``key``, a lease key this shard offers, and whether it is targeted; else the refusal."""
        if not isinstance(key, str) or key not in self.catalog:
            raise Refusal("lease.error", f"no lease is offered for key '{key}'")
        return key, self.catalog[key][1]

    def _lease_list(self, body: dict[str, Any]) -> dict[str, Any]:
        key, target = body.get("key"), body.get("target")
        keys = [key] if key is not None else sorted(self.catalog)
        leases = []
        for name in keys:
            _, targeted = self._offered(name)
            if targeted and target is None:
                # One capability over many targets has no single current (S004:1141-1144).
                leases.append({"key": name, "targeted": True, "current": None,
                               "held": any(k == name for k, _ in self.holds)})
                continue
            where = str(target or "") if targeted else ""
            hold = self.holds.get((name, where))
            row: dict[str, Any] = {"key": name, "current": self.value(name, where), "held": hold is not None}
            if targeted:
                row.update(targeted=True, target=where)
            if hold is not None and hold.expired:
                row["expired"] = True
            leases.append(row)
        holds = [self._hold_row(k, t, h) for (k, t), h in sorted(self.holds.items())
                 if (key is None or k == key) and (target is None or t == target)]
        return {"kind": "lease.list.ok", "leases": leases, "holds": holds}

    @staticmethod
    def _hold_row(key: str, target: str, hold: Hold) -> dict[str, Any]:
        row: dict[str, Any] = {"key": key, "value": hold.value, "untilMs": hold.until_ms, "expired": hold.expired}
        if target:
            row["target"] = target
        if hold.run_id is not None:
            row["runId"] = hold.run_id
        return row

    def _lease_apply(self, body: dict[str, Any]) -> dict[str, Any]:
        key, targeted = self._offered(body.get("key"))
        hold_ms = body.get("holdMs")
        if isinstance(hold_ms, bool) or not isinstance(hold_ms, int) or hold_ms <= 0:
            raise Refusal("lease.error", "a lease needs a positive holdMs")
        target = str(body.get("target") or "") if targeted else ""
        value = str(body.get("value"))  # values cross as text (S004:1180)
        run_id = body.get("runId")
        held = self.holds.get((key, target))
        baseline = held.baseline if held and not held.expired else self.value(key, target)
        until_ms = int(self.clock() * 1000) + hold_ms
        self.holds[(key, target)] = Hold(None if run_id is None else str(run_id), value, baseline, until_ms)
        self.values[(key, target)] = value
        answer = {"kind": "lease.ok", "key": key, "value": value, "baseline": baseline, "untilMs": until_ms}
        if target:
            answer["target"] = target
        return answer

    def _lease_release(self, body: dict[str, Any]) -> dict[str, Any]:
        key, targeted = self._offered(body.get("key"))
        target = str(body.get("target") or "") if targeted else ""
        expected, baseline = str(body.get("expected")), str(body.get("baseline"))
        current = self.value(key, target)
        # Teardown collects the verdict, whatever it is: the hold is done with.
        self.holds.pop((key, target), None)
        if current not in (expected, baseline):
            # Compare-and-set: somebody changed it deliberately; never overwrite that.
            return {"kind": "lease.drifted", "key": key, "current": current}
        self.values[(key, target)] = baseline
        answer = {"kind": "lease.ok", "key": key, "value": baseline}
        if target:
            answer["target"] = target
        return answer

    # participation (S004:1198-1243)

    def _ledger(self, body: dict[str, Any]) -> tuple[str, ParticipationLedger]:
        run_id = str(body.get("runId"))
        ledger = self.ledgers.get(run_id)
        if ledger is None:
            raise Refusal("participation.error", f"this shard is not counting run '{run_id}'")
        return run_id, ledger

    def _participation_open(self, body: dict[str, Any]) -> dict[str, Any]:
        run_id = str(body.get("runId"))
        self.ledgers.setdefault(run_id, ParticipationLedger()).open = True
        return {"kind": "participation.ok", "runId": run_id, "open": True}

    def _participation_snapshot(self, body: dict[str, Any]) -> dict[str, Any]:
        run_id, ledger = self._ledger(body)
        return {"kind": "participation.snapshot.ok", "runId": run_id, "open": ledger.open,
                "participants": list(ledger.participants.values())}

    def _participation_close(self, body: dict[str, Any]) -> dict[str, Any]:
        run_id, ledger = self._ledger(body)
        ledger.open = False
        return {"kind": "participation.ok", "runId": run_id, "open": False}

    # world objects (S004:1245-1288)

    def _world_spawn(self, body: dict[str, Any]) -> dict[str, Any]:
        run_id, what, count = str(body.get("runId")), body.get("what"), body.get("count", 1)
        limit = self.spawn_ceiling if what in SPAWNABLE else 0
        if not isinstance(what, str) or isinstance(count, bool) or not isinstance(count, int) \
                or not 1 <= count <= limit:  # a what not spawnable has limit 0: refused either way
            shown = count if isinstance(count, int) and not isinstance(count, bool) else 0
            raise Refusal("world.error", f"this shard places 1 to {limit} of '{what}' at a time, "
                                         f"and {shown} was asked for", action="spawn")
        serials = []
        for _ in range(count):
            self._serial += 1
            serial = f"0x{self._serial:08X}"
            self.objects[serial] = WorldObject(serial, what, run_id)
            serials.append(serial)
        return {"kind": "world.spawn.ok", "runId": run_id, "what": what, "serials": serials}

    def _world_owned(self, body: dict[str, Any]) -> dict[str, Any]:
        """What the run still owns; objects the world lost are pruned as it walks (S004:1260-1265)."""
        run_id = str(body.get("runId"))
        owned, pruned = [], 0
        for serial, obj in list(self.objects.items()):
            if obj.run_id != run_id:
                continue
            if obj.present:
                owned.append({"serial": serial, "what": obj.what})
            else:
                del self.objects[serial]
                self.pruned.setdefault(run_id, set()).add(serial)
                pruned += 1
        return {"kind": "world.owned.ok", "runId": run_id, "owned": owned, "pruned": pruned}

    def _world_despawn(self, body: dict[str, Any]) -> dict[str, Any]:
        """``removed`` found and deleted; ``gone`` owned but already absent; ``refused`` never
        this run's (S004:1273-1276). No ``serials``: everything the run owns."""
        run_id = str(body.get("runId"))
        serials = body.get("serials")
        if serials is None:
            serials = [s for s, o in self.objects.items() if o.run_id == run_id]
        elif not isinstance(serials, list):
            serials = []  # a malformed list names nothing; it never means "everything"
        answer: dict[str, Any] = {"kind": "world.despawn.ok", "runId": run_id, "removed": [], "gone": [],
                                  "refused": []}
        for serial in serials:
            if isinstance(serial, str):
                self.despawned[serial] += 1
            obj = self.objects.get(serial) if isinstance(serial, str) else None
            if obj is not None and obj.run_id == run_id:
                answer["removed" if obj.present else "gone"].append(serial)
                del self.objects[serial]
                self.pruned.setdefault(run_id, set()).add(serial)
            elif isinstance(serial, str) and serial in self.pruned.get(run_id, ()):
                answer["gone"].append(serial)
            else:
                answer["refused"].append(serial)
        return answer

    # the one-shots (S004:1290-1333)

    def _item_catalog(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"kind": "item.catalog.ok", "items": [dict(g) for g in GRANTS]}

    def _item_grant(self, body: dict[str, Any]) -> dict[str, Any]:
        run_id, item = str(body.get("runId")), body.get("item")
        if item not in {g["item"] for g in GRANTS}:
            raise Refusal("oneshot.error", f"this shard does not grant '{item}'")
        ledger = self.ledgers.get(run_id)
        if ledger is None:
            raise Refusal("oneshot.error", f"run {run_id} has no participation ledger open on this shard")
        return {"kind": "item.grant.ok", "runId": run_id, "item": item, "amount": body.get("amount"),
                "granted": len(ledger.participants), "missed": []}

    def _world_save(self, body: dict[str, Any]) -> dict[str, Any]:
        now = self.clock()
        if self.last_save is not None and now - self.last_save < self.save_interval_s:
            raise Refusal("oneshot.error", f"this shard saves at most every {self.save_interval_s} seconds, "
                                           f"and the last save was {int(now - self.last_save)} seconds ago")
        self.last_save = now
        # The reply says the save STARTED; what happened rides world.save.before/after (S004:1323-1326).
        self.frames += [{"kind": "world.save.before"}, {"kind": "world.save.after"}]
        return {"kind": "world.save.ok", "started": True}

    # staff (S004:1080-1097)

    def _staff_target(self, body: dict[str, Any]) -> str:
        name = body.get("account")
        if name not in self.accounts:
            raise Refusal("admin.error", "unknown account")
        if name in PROTECTED_ACCOUNTS:
            raise Refusal("admin.error", "protected")
        return str(name)

    def _admin_ban(self, body: dict[str, Any]) -> dict[str, Any]:
        name = self._staff_target(body)
        self.accounts[name]["banned"] = True
        return {"kind": "admin.ok", "account": name}

    def _admin_unban(self, body: dict[str, Any]) -> dict[str, Any]:
        name = self._staff_target(body)
        self.accounts[name]["banned"] = False
        return {"kind": "admin.ok", "account": name}

    def _admin_broadcast(self, body: dict[str, Any]) -> dict[str, Any]:
        self.broadcasts.append(str(body.get("text", "")))
        return {"kind": "admin.ok"}

    # accounts and links (S004:1065-1079)

    def _account_create(self, body: dict[str, Any]) -> dict[str, Any]:
        name = str(body.get("account"))
        if name in self.accounts:
            raise Refusal("account.error", "already exists")
        self.accounts[name] = {"banned": False, "linked": None}
        return {"kind": "account.ok", "account": name}

    def _linkable(self, body: dict[str, Any]) -> str:
        name = body.get("account")
        if name not in self.accounts:
            raise Refusal("account.error", "unknown account")
        if name in PROTECTED_ACCOUNTS:
            raise Refusal("account.error", "protected")
        return str(name)

    def _account_link(self, body: dict[str, Any]) -> dict[str, Any]:
        name = self._linkable(body)
        self.accounts[name]["linked"] = body.get("userId")
        return {"kind": "account.ok", "account": name, "userId": body.get("userId")}

    def _account_unlink(self, body: dict[str, Any]) -> dict[str, Any]:
        name = self._linkable(body)
        if self.accounts[name]["linked"] is None:
            raise Refusal("account.error", "not linked")
        self.accounts[name]["linked"] = None
        return {"kind": "account.ok", "account": name}

    # the help-page queue (S004:949-951, 1337)

    def _pages_list(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"kind": "pages.list", "pages": [dict(p) for p in self.pages.values() if p["open"]]}

    def _pages_respond(self, body: dict[str, Any]) -> dict[str, Any]:
        page = self.pages.get(str(body.get("id")))
        if page is not None:
            page["open"] = False
            page["response"] = body.get("text")
        return {"kind": "pages.ok", "id": body.get("id")}
