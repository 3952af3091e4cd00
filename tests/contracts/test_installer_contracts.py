"""The installer's contract (shared/contracts/installer.py) against both sides of every subject:
the installer serves each subject with the contract's request model and answers, through real
NATS, exactly what the reply model says (no field missing, none it does not name, an empty
optional field left out rather than sent as null); and every client — ``shardbus module``
(services/installer/commands.py), the web door's ``/modules`` routes and the console's module
page — sends requests the model takes (heard on the wire by a spy subscription) and reads the
replies with the model. A client refusing a request itself answers the installer's own 400, word
for word. Real NATS, the real installer in-process, releases from tests/installer's HTTPS host."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from services.installer import commands
from services.installer.app import create_app
from services.installer.settings import InstallerSettings
from shared import subjects
from shared.contracts import installer as c
from tests.contracts.asyncapi_docs import served
from tests.contracts.fields import unnamed_fields
from tests.installer.conftest import ca_file, releases, settings  # noqa: F401 — fixtures
from tests.web.conftest import OPERATOR_TOKEN, RunningDoor, start_door  # noqa: F401 — fixtures

BY_SUBJECT = {contract.subject: contract for contract in c.CONTRACTS}


# --- helpers ---------------------------------------------------------------------------------


def _fits(model: type[c.InstallerReply] | type[c.Event], raw: dict[str, Any]) -> Any:
    """``raw`` read with ``model``: it validates, names no field the model does not, and is exactly
    what the model sends (same keys in the same order, nothing null that the model leaves out)."""
    parsed = model.model_validate(raw)
    assert unnamed_fields(parsed) == [], raw
    assert json.dumps(parsed.wire()) == json.dumps(raw), (parsed.wire(), raw)
    return parsed


class Spy:
    """Hears every request sent on a subject (a plain subscription beside the installer's queue
    group gets its own copy): what each client really put on the wire."""

    def __init__(self) -> None:
        self.heard: dict[str, list[bytes]] = {}

    async def listen(self, nc: Any, *subjects_: str) -> None:
        for subject in subjects_:
            self.heard[subject] = []
            await nc.subscribe(subject, cb=self._on(subject))
        await nc.flush()

    def _on(self, subject: str) -> Any:
        async def heard(msg: Any) -> None:
            self.heard[subject].append(msg.data)
        return heard

    def requests(self, subject: str, model: type[c.InstallerRequest]) -> list[c.InstallerRequest]:
        """Each request heard on ``subject`` read with ``model``, checked to carry nothing else."""
        read = []
        for data in self.heard[subject]:
            request = model.model_validate_json(data)
            assert json.loads(data) == request.wire(), data  # no field the contract does not name
            read.append(request)
        return read


async def _nats(nc: Any, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    reply: dict[str, Any] = json.loads((await nc.request(subject, json.dumps(body).encode(), timeout=30)).data)
    return reply


def _cli_args(action: str, **values: Any) -> argparse.Namespace:
    return argparse.Namespace(action=action, quiet=True, json=False, timeout=30.0, **values)


async def _cli(action: str, **values: Any) -> dict[str, Any]:
    """What ``shardbus module <action>`` gets back, in-process (its request built as it builds it)."""
    args = _cli_args(action, **values)
    reply = await commands._ask_installer(args, commands._request(args))
    assert reply is not None, "the command could not reach NATS"
    return reply


@contextlib.asynccontextmanager
async def _console(door: RunningDoor) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A browser-like client logged in to the console, and the CSRF token its changes carry."""
    async with door.client(None, follow_redirects=False) as http:
        logged_in = await http.post("/console/login", data={"token": OPERATOR_TOKEN})
        assert logged_in.status_code == HTTPStatus.SEE_OTHER, logged_in.text
        page = (await http.get("/console/runs")).text
        yield http, page.split('name="console-csrf" content="')[1].split('"')[0]


@pytest.fixture
async def installer(settings: InstallerSettings, nats_url: str,  # noqa: F811
                    monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[InstallerSettings]:
    """The installer in-process on the test's site; ``shardbus module`` pointed at the same NATS."""
    monkeypatch.setenv("SHARDBUS_NATS_URL", nats_url)
    async with create_app(settings):
        yield settings


# --- the owner's side: the handlers take the contract's models ------------------------------


def test_every_installer_request_subject_has_exactly_one_contract():
    assert set(BY_SUBJECT) == {subjects.INSTALLER_INSTALL, subjects.INSTALLER_REMOVE, subjects.INSTALLER_LIST}
    assert len(BY_SUBJECT) == len(c.CONTRACTS)
    assert {(contract.owner, contract.queue) for contract in c.CONTRACTS} == {("installer", c.QUEUE)}


@pytest.mark.parametrize("contract", c.CONTRACTS, ids=lambda contract: contract.subject)
def test_the_installer_serves_each_subject_with_the_contracts_request_model(contract, tmp_path):
    # The AsyncAPI document FastStream generates from the installer's own handlers: each subject's
    # payload is the model its handler takes, in its queue group.
    app = create_app(InstallerSettings(modules_dir=str(tmp_path / "modules")))
    document = app.schema.to_specification().to_jsonable()
    channel, schema_name = served(document, contract.subject)
    assert channel["bindings"]["nats"]["queue"] == contract.queue
    if not contract.request.model_fields:  # installer.list takes nothing: its handler reads no body
        assert document["components"]["schemas"][schema_name] == {"title": "EmptyPayload", "type": "null"}
        return
    assert schema_name == contract.request.__name__
    assert document["components"]["schemas"][schema_name] == contract.request.model_json_schema(by_alias=True)


# --- each subject, both sides ----------------------------------------------------------------


async def test_installer_install_the_installer_and_every_client_agree(installer, releases, nc, start_door,  # noqa: F811
                                                                     unique):
    spy = Spy()
    await spy.listen(nc, subjects.INSTALLER_INSTALL)
    request_id = f"p{unique}"
    progress = await nc.subscribe(subjects.installer_progress(request_id))
    changes = await nc.subscribe(subjects.INSTALLER_EVENTS)
    first = releases.release(f"/{unique}", "uo-events", "1.4.0")
    newer = releases.release(f"/{unique}", "uo-events", "1.5.0")
    door = await start_door()

    # A plain NATS request, as a website sends it: installed, with progress and a change event.
    raw = await _nats(nc, subjects.INSTALLER_INSTALL, {"url": first, "requestId": request_id})
    installed = _fits(c.InstallReply, raw)
    assert (installed.status, installed.action, installed.previous) == (HTTPStatus.OK, "installed", None)
    assert installed.sha256 and installed.bytes and installed.entries and installed.unpacked_bytes
    stages = []
    while not stages or stages[-1] != "done":
        event = _fits(c.ProgressEvent, json.loads((await progress.next_msg(timeout=5)).data))
        assert event.request_id == request_id
        stages.append(event.stage)
    assert stages[0] == "manifest" and "download" in stages and stages[-1] == "done"
    sent = json.loads((await changes.next_msg(timeout=5)).data)
    change = c.CHANGE_EVENT.validate_python(sent)
    assert isinstance(change, c.InstalledEvent) and change.previous is None
    _fits(c.InstalledEvent, sent)

    # shardbus module install: its request, its reading of the reply (an upgrade).
    upgraded = _fits(c.InstallReply, await _cli("install", url=newer))
    assert upgraded.action == "upgraded" and upgraded.previous == c.Module(id="uo-events", version="1.4.0")
    assert commands._outcome("install", upgraded.wire()) == (True, ["upgraded uo-events 1.5.0"])

    # The web door's POST /modules/install: 201, the installer's reply verbatim (unchanged: no stats).
    async with door.client() as http:
        answered = await http.post("/modules/install", json={"url": newer})
    assert answered.status_code == HTTPStatus.CREATED, answered.text
    unchanged = _fits(c.InstallReply, answered.json())
    assert unchanged.action == "unchanged" and "sha256" not in answered.json()

    # The console's install (what its module page posts).
    async with _console(door) as (http, csrf):
        answered = await http.post("/console/api/module/install", json={"url": newer, "requestId": f"q{unique}"},
                                   headers={"X-Console-Csrf": csrf})
    assert answered.status_code == HTTPStatus.CREATED, answered.text
    assert _fits(c.InstallReply, answered.json()).action == "unchanged"

    heard = spy.requests(subjects.INSTALLER_INSTALL, c.InstallRequest)
    assert [r.url for r in heard] == [first, newer, newer, newer]  # the website, the CLI, the door, the console
    assert heard[1].request_id is not None and heard[2].request_id is None and heard[3].request_id == f"q{unique}"


async def test_installer_list_the_installer_and_every_client_agree(settings, releases, nc, start_door, unique,  # noqa: F811
                                                                   nats_url, monkeypatch):
    first = releases.release(f"/{unique}", "uo-events", "1.4.0")
    other = releases.release(f"/{unique}", "uo-vendors", "1.0.0")  # refused: the site runs one module
    declared = settings.model_copy(update={"declared_modules": f"{first},{other}"})
    monkeypatch.setenv("SHARDBUS_NATS_URL", nats_url)
    spy = Spy()
    await spy.listen(nc, subjects.INSTALLER_LIST)
    async with create_app(declared):
        polls = 0
        for _ in range(100):
            raw = await _nats(nc, subjects.INSTALLER_LIST, {})
            polls += 1
            if raw.get("declared") and all(entry["state"] != "pending" for entry in raw["declared"]):
                break
        listed = _fits(c.ListReply, raw)
        assert listed.modules == [c.Module(id="uo-events", version="1.4.0")]
        assert [(d.state, d.status) for d in listed.declared] == [("installed", None), ("refused", HTTPStatus.CONFLICT)]
        assert "module" not in raw["declared"][1] and "error" not in raw["declared"][0]  # left out, not null

        cli = _fits(c.ListReply, await _cli("list"))
        ok, lines = commands._outcome("list", cli.wire())
        assert ok and lines[0] == "uo-events 1.4.0" and lines[1].startswith(f"declared {first}: installed")

        door = await start_door()
        async with door.client() as http:
            answered = await http.get("/modules")
        assert answered.status_code == HTTPStatus.OK
        assert _fits(c.ListReply, answered.json()) == listed

        async with _console(door) as (http, _csrf):
            page = await http.get("/console/module?fragment=1")
        assert page.status_code == HTTPStatus.OK
        assert 'data-module="uo-events"' in page.text and "uo-vendors" not in page.text.split("<h2>Declared")[0]
        assert f"<code>{other}</code>" in page.text and "(409)" in page.text
        assert "<td>uo-events 1.4.0</td>" in page.text  # the declared module the first URL installed

    heard = spy.requests(subjects.INSTALLER_LIST, c.ListRequest)
    # Every ask was a valid request: the polls above, then the CLI, the door and the console's page.
    assert len(heard) == polls + 3, (len(heard), polls)


async def test_installer_remove_the_installer_and_every_client_agree(installer, releases, nc, start_door,  # noqa: F811
                                                                    unique):
    spy = Spy()
    await spy.listen(nc, subjects.INSTALLER_REMOVE)
    changes = await nc.subscribe(subjects.INSTALLER_EVENTS)
    url = releases.release(f"/{unique}", "uo-events", "1.4.0")
    door = await start_door()

    async def install() -> None:
        assert (await _nats(nc, subjects.INSTALLER_INSTALL, {"url": url}))["status"] == HTTPStatus.OK

    await install()
    raw = await _nats(nc, subjects.INSTALLER_REMOVE, {"id": "uo-events"})
    assert _fits(c.RemoveReply, raw).removed == c.Module(id="uo-events", version="1.4.0")

    await install()
    cli = _fits(c.RemoveReply, await _cli("remove", id="uo-events"))
    assert commands._outcome("remove", cli.wire()) == (True, ["removed uo-events"])

    await install()
    async with door.client() as http:
        answered = await http.delete("/modules/uo-events")
    assert answered.status_code == HTTPStatus.OK
    _fits(c.RemoveReply, answered.json())

    await install()
    async with _console(door) as (http, csrf):
        answered = await http.post("/console/api/module/uo-events/remove", headers={"X-Console-Csrf": csrf})
    assert answered.status_code == HTTPStatus.OK
    _fits(c.RemoveReply, answered.json())

    kinds = []
    for _ in range(8):
        sent = json.loads((await changes.next_msg(timeout=5)).data)
        change = c.CHANGE_EVENT.validate_python(sent)
        _fits(type(change), sent)
        kinds.append(change.type)
    assert kinds == ["installed", "removed"] * 4
    heard = spy.requests(subjects.INSTALLER_REMOVE, c.RemoveRequest)
    assert [r.id for r in heard] == ["uo-events"] * 4  # the website, the CLI, the door, the console

    # Nothing left to remove: the error reply, read with its model by every client.
    gone = _fits(c.ErrorReply, await _nats(nc, subjects.INSTALLER_REMOVE, {"id": "uo-events"}))
    assert gone.status == HTTPStatus.NOT_FOUND
    assert commands._outcome("remove", gone.wire()) == (False, [f"error 404: {gone.error}"])


# --- refusals: the installer's, and the clients' own, word for word --------------------------


@pytest.mark.parametrize(("subject", "body"), [
    (subjects.INSTALLER_INSTALL, {}),
    (subjects.INSTALLER_INSTALL, {"url": ""}),
    (subjects.INSTALLER_INSTALL, {"url": "https://x/" + "a" * 3000}),
    (subjects.INSTALLER_INSTALL, {"url": 5}),
    (subjects.INSTALLER_INSTALL, {"url": "https://x/m.json", "requestId": "a.b"}),
    (subjects.INSTALLER_REMOVE, {}),
    (subjects.INSTALLER_REMOVE, {"id": ""}),
    (subjects.INSTALLER_REMOVE, {"id": "x" * 65}),
], ids=lambda value: value if isinstance(value, str) else json.dumps(value)[:40])
async def test_a_request_a_client_refuses_is_refused_as_the_installer_refuses_it(installer, nc, subject, body):
    answered = _fits(c.ErrorReply, await _nats(nc, subject, body))
    assert answered.status == HTTPStatus.BAD_REQUEST
    with pytest.raises(c.RequestRefused) as refused:
        c.build(BY_SUBJECT[subject].request, body)
    assert refused.value.reply == answered  # the same status and sentence (``request.url: …``)


async def test_the_installers_other_refusals_fit_the_error_reply(installer, releases, nc, unique):  # noqa: F811
    await _nats(nc, subjects.INSTALLER_INSTALL, {"url": releases.release(f"/{unique}", "uo-events", "1.4.0")})
    taken = await _nats(nc, subjects.INSTALLER_INSTALL, {"url": releases.release(f"/{unique}", "uo-vendors", "1.0.0")})
    assert _fits(c.ErrorReply, taken).status == HTTPStatus.CONFLICT
    missing = await _nats(nc, subjects.INSTALLER_INSTALL,
                          {"url": f"https://127.0.0.1:{releases.port}/{unique}/missing.json"})
    assert _fits(c.ErrorReply, missing).status == HTTPStatus.BAD_REQUEST
    not_a_module = await _nats(nc, subjects.INSTALLER_REMOVE, {"id": "../etc"})
    assert _fits(c.ErrorReply, not_a_module).status == HTTPStatus.BAD_REQUEST


# --- the check can fail ---------------------------------------------------------------------

GOOD_INSTALL = {"status": 200, "action": "installed", "module": {"id": "uo-events", "version": "1.4.0"},
                "previous": None, "sha256": "ab" * 32, "bytes": 10, "entries": 3, "unpackedBytes": 30,
                "replica": "installer-1"}


@pytest.mark.parametrize(("broken", "why"), [
    ({k: v for k, v in GOOD_INSTALL.items() if k != "previous"}, "previous is always sent (null when empty)"),
    ({k: v for k, v in GOOD_INSTALL.items() if k != "module"}, "a field missing"),
    ({**GOOD_INSTALL, "action": "deleted"}, "an action outside the vocabulary"),
    ({**GOOD_INSTALL, "status": True}, "a status that is not an integer"),
    ({**GOOD_INSTALL, "bytes": "10"}, "a number as text"),
    ({**GOOD_INSTALL, "module": {"id": "UO events", "version": "1"}}, "a module id the pattern refuses"),
])
def test_a_reply_that_breaks_the_contract_is_refused(broken, why):
    _fits(c.InstallReply, GOOD_INSTALL)
    with pytest.raises(ValidationError):
        c.InstallReply.model_validate(broken)


def test_a_reply_with_a_field_the_contract_does_not_name_or_a_null_it_leaves_out_fails_the_check():
    with pytest.raises(AssertionError):
        _fits(c.InstallReply, {**GOOD_INSTALL, "extra": 1})
    unchanged = {k: v for k, v in GOOD_INSTALL.items() if k not in ("sha256", "bytes", "entries", "unpackedBytes")}
    _fits(c.InstallReply, {**unchanged, "action": "unchanged"})
    with pytest.raises(AssertionError):  # an unchanged install sends no sha256, not a null one
        _fits(c.InstallReply, {**unchanged, "action": "unchanged", "sha256": None})
    with pytest.raises(ValidationError):  # a progress event always names its total (null: not known)
        c.ProgressEvent.model_validate({"requestId": "r1", "stage": "download", "done": 0})
    with pytest.raises(ValidationError):
        c.CHANGE_EVENT.validate_python({"type": "unchanged", "module": {"id": "uo-events", "version": "1"}})


async def test_a_client_refuses_a_reply_outside_the_contract(start_door, nc):  # noqa: F811
    # A stand-in "installer" whose list reply lacks ``declared``: the door answers 502 rather than
    # pass it on, and the CLI says it does not fit.
    broken = {"status": 200, "modules": []}

    async def answer(msg: Any) -> None:
        await msg.respond(json.dumps(broken).encode())

    fake = await nc.subscribe(subjects.INSTALLER_LIST, queue=c.QUEUE, cb=answer)
    await nc.flush()
    try:
        door = await start_door()
        async with door.client() as http:
            answered = await http.get("/modules")
    finally:
        await fake.unsubscribe()
    assert answered.status_code == HTTPStatus.BAD_GATEWAY
    assert answered.json() == {"error": "the installer's reply to installer.list does not fit its contract"}
    ok, [line] = commands._outcome("list", broken)
    assert not ok and line.startswith("error 502: the installer's reply does not fit its contract (declared:")
