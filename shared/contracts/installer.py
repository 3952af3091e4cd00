"""The installer's contract (docs/contracts.md, "Installer"): what ``installer.install``,
``installer.remove`` and ``installer.list`` take and answer, the payloads of ``installer.events``
and ``installer.progress.<requestId>``, and the limits both sides need, written once for the
installer (services/installer) and its clients (``shardbus module``, the web door's
``/modules`` routes and the console's module page).

On the wire, every reply is a JSON object with an integer ``status``: a 2xx carries the result's
fields (:class:`InstallReply`, :class:`RemoveReply`, :class:`ListReply`), anything else an
``error`` sentence (:class:`ErrorReply`). A field the installer leaves out when it has nothing to
say (an unchanged install's ``sha256``…) is left out, never sent as ``null``; one it always sends
(``previous``) is ``null`` when empty. :meth:`InstallerReply.wire` and :meth:`Event.wire` give
exactly that shape; :meth:`InstallerRequest.wire` a request's (``requestId`` left out when
there is none)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from http import HTTPStatus
from typing import Annotated, Any, ClassVar, Final, Literal, TypeVar, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    create_model,
    model_serializer,
)
from pydantic.alias_generators import to_camel

from shared import subjects
from shared.contracts import Contract
from shared.contracts.ids import ModuleId, RequestId
from shared.errors import ShardbusError
from shared.replies import Reply, describe_validation_error

QUEUE: Final = "installer"
"""The queue group every installer replica's request subscribers join (one replica answers)."""

URL_MAX: Final = 2048
"""The longest manifest URL an install takes."""

REMOVE_ID_MAX: Final = 64
"""The longest id a removal takes (a module id is at most 64 characters too; the installer says
which ids are not module ids)."""

INSTALL_TIMEOUT_S: Final = 900.0
"""How long a client waits for an install's answer (a large artifact on a slow link takes a
while); the install goes on regardless, and ``installer.list`` tells its outcome."""

REMOVE_TIMEOUT_S: Final = 120.0
"""How long a client waits for a removal's answer (the site lock, then the delete)."""

LIST_TIMEOUT_S: Final = 10.0
"""How long a client waits for ``installer.list``."""

PROGRESS_EVERY_S: Final = 0.2
"""Least pause between two download progress events of one install."""

Stage = Literal["manifest", "download", "inspect", "unpack", "done"]
"""An install's stage, as ``installer.progress.<requestId>`` names it."""

STAGES: Final[tuple[Stage, ...]] = get_args(Stage)
"""An install's stages, in the order the installer goes through them."""

Action = Literal["installed", "upgraded", "unchanged"]
"""What an install did."""

Change = Literal["installed", "upgraded", "removed"]
"""What changed on the site (``installer.events``)."""

DeclaredState = Literal["pending", "installed", "upgraded", "unchanged", "refused", "failed"]
"""What became of a declared module (``SHARDBUS_DECLARED_MODULES``) at start."""

REQUEST_ARGUMENT: Final = "request"
"""The name the installer's handlers give the request they take: a field the installer refuses
is named from there (``request.url``), and so is one a client refuses before sending it."""


# --- requests ---------------------------------------------------------------------------


class InstallerRequest(BaseModel):
    """Base of the requests: camelCase names on the wire, unknown fields ignored."""

    model_config = ConfigDict(populate_by_name=True)

    def wire(self) -> dict[str, Any]:
        """The request as sent: camelCase, an optional field without a value left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class InstallRequest(InstallerRequest):
    """``installer.install``: the manifest URL, and an id to publish progress under."""

    url: str = Field(min_length=1, max_length=URL_MAX)
    request_id: RequestId | None = Field(default=None, alias="requestId")


class RemoveRequest(InstallerRequest):
    """``installer.remove``: the module to remove."""

    id: str = Field(min_length=1, max_length=REMOVE_ID_MAX)


class ListRequest(InstallerRequest):
    """``installer.list``: nothing (the installer reads no body)."""


RequestT = TypeVar("RequestT", bound=InstallerRequest)


class RequestRefused(ShardbusError):
    """A request the installer would refuse, refused by a client before sending it: ``reply`` is
    the installer's own 400, word for word (its ``status`` and ``error`` are the refusal's
    ``status`` and ``sentence``)."""

    def __init__(self, reply: ErrorReply) -> None:
        super().__init__(reply.error, reply.status)
        self.reply = reply


@functools.cache
def _as_handled(model: type[InstallerRequest]) -> type[BaseModel]:
    """``model`` as the installer's handler receives it: the argument :data:`REQUEST_ARGUMENT`."""
    field: dict[str, Any] = {REQUEST_ARGUMENT: (model, ...)}
    return create_model(f"{model.__name__}Argument", **field)


def build(model: type[RequestT], body: Mapping[str, Any]) -> RequestT:
    """The request ``body`` read with ``model``, or :class:`RequestRefused` carrying the 400 the
    installer would answer it (the same sentence: ``invalid request: request.url: …``)."""
    try:
        handled = _as_handled(model).model_validate({REQUEST_ARGUMENT: body})
    except ValidationError as exc:
        raise RequestRefused(ErrorReply(status=HTTPStatus.BAD_REQUEST, error=describe_validation_error(exc))) \
            from None
    request = getattr(handled, REQUEST_ARGUMENT)
    assert isinstance(request, model)
    return request


# --- replies and their parts -------------------------------------------------------------


def _without_empty(model: BaseModel, data: dict[str, Any], info: SerializationInfo,
                   omitted: frozenset[str]) -> dict[str, Any]:
    """``data`` without the fields of ``omitted`` (Python names) that hold ``None``."""
    for name in omitted:
        key = (type(model).model_fields[name].alias or name) if info.by_alias else name
        if key in data and data[key] is None:
            del data[key]
    return data


class WireModel(BaseModel):
    """Base of the replies' parts and of the events: camelCase, strict types (a number is a
    number, never a bool), fields a newer installer adds are kept; the fields named in
    ``OMITTED_WHEN_NONE`` are left out when they hold nothing."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow", strict=True)

    OMITTED_WHEN_NONE: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_empty(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return _without_empty(self, data, info, self.OMITTED_WHEN_NONE)


class Module(WireModel):
    """A module on the wire: its id and the version its ``module.json`` gives (``null``: none)."""

    id: ModuleId
    version: str | None


class Declared(WireModel):
    """What became of one declared module at start."""

    OMITTED_WHEN_NONE: ClassVar[frozenset[str]] = frozenset({"module", "status", "error"})

    url: str
    state: DeclaredState
    module: Module | None = None
    status: int | None = None
    error: str | None = None


class InstallerReply(WireModel, Reply):
    """Base of every reply: ``status`` (strictly an integer), ``error`` only when there is one."""

    OMITTED_WHEN_NONE: ClassVar[frozenset[str]] = frozenset({"error"})

    status: int = Field(ge=100, le=599)

    def wire(self) -> dict[str, Any]:
        """The reply as sent: camelCase, integers for statuses, empty optional fields left out."""
        return self.model_dump(mode="json", by_alias=True)


class ErrorReply(InstallerReply):
    """Any refusal or failure: ``{status, error}`` (400 bad URL, manifest, hash or archive, or a
    request that fails its model; 404 nothing to remove; 409 the site is taken or its lock busy;
    500 a bug; 502 the source host; 503 the installer starting or the site lock lost)."""

    status: int = Field(ge=400, le=599)
    error: str


class InstallReply(InstallerReply):
    """``installer.install``: what the install did; an ``unchanged`` one fetched nothing and has
    no ``sha256``, ``bytes``, ``entries`` or ``unpackedBytes``."""

    OMITTED_WHEN_NONE: ClassVar[frozenset[str]] = frozenset(
        {"error", "sha256", "bytes", "entries", "unpacked_bytes"})

    action: Action
    module: Module
    previous: Module | None
    sha256: str | None = None
    bytes: int | None = None
    entries: int | None = None
    unpacked_bytes: int | None = None
    replica: str


class RemoveReply(InstallerReply):
    """``installer.remove``: the module removed (the site is free)."""

    removed: Module
    replica: str


class ListReply(InstallerReply):
    """``installer.list``: the installed module(s) (normally none or one) and the declared
    modules' fate."""

    modules: list[Module]
    declared: list[Declared]


ReplyT = TypeVar("ReplyT", bound=InstallerReply)


def read_reply(model: type[ReplyT], data: Mapping[str, Any]) -> ReplyT | ErrorReply:
    """A reply received: ``model`` when its status is 2xx, else :class:`ErrorReply`;
    ValidationError when it fits neither (not the installer's contract)."""
    status = data.get("status")
    if isinstance(status, int) and HTTPStatus.OK <= status < HTTPStatus.MULTIPLE_CHOICES:
        return model.model_validate(data)
    return ErrorReply.model_validate(data)


# --- events -------------------------------------------------------------------------------


class Event(WireModel):
    """Base of the installer's events."""

    def wire(self) -> dict[str, Any]:
        """The event as published."""
        return self.model_dump(mode="json", by_alias=True)


class ProgressEvent(Event):
    """``installer.progress.<requestId>``: an install with a ``requestId`` reached ``stage``
    (bytes ``done`` of ``total``, ``null`` when not known); ``done`` is the last."""

    request_id: RequestId
    stage: Stage
    done: int = Field(ge=0)
    total: int | None = Field(ge=0)


class InstalledEvent(Event):
    """``installer.events`` after an install or upgrade (``previous``: ``null`` after an install)."""

    type: Literal["installed", "upgraded"]
    module: Module
    previous: Module | None


class RemovedEvent(Event):
    """``installer.events`` after a removal."""

    type: Literal["removed"]
    module: Module


ChangeEvent = Annotated[InstalledEvent | RemovedEvent, Field(discriminator="type")]
"""``installer.events``: ``{type: installed|upgraded|removed, module, previous?}``."""

CHANGE_EVENT: Final[TypeAdapter[InstalledEvent | RemovedEvent]] = TypeAdapter(ChangeEvent)
"""Reads an ``installer.events`` payload."""


CONTRACTS: tuple[Contract, ...] = (
    Contract(subjects.INSTALLER_INSTALL, "installer", InstallRequest, InstallReply, QUEUE),
    Contract(subjects.INSTALLER_REMOVE, "installer", RemoveRequest, RemoveReply, QUEUE),
    Contract(subjects.INSTALLER_LIST, "installer", ListRequest, ListReply, QUEUE),
)
"""Every request/reply subject the installer answers; each may also answer :class:`ErrorReply`."""
