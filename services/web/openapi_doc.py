"""The door's OpenAPI document made exact (:func:`describe`), as the door serves it at
``/openapi.json`` and ``python -m services.web.openapi`` writes it to docs/openapi/web.json
(``make docs``).

FastAPI gives the paths, their operation ids, summaries and parameters' names; everything a
client relies on is written here from the door's own rules (docs/web.md) and the contracts of
``shared/contracts/`` that the door passes through: each route's request body (the contract's
request model, less what the path fills in), each answer's body (the contract's reply model, or
the door's own ``{"error"}``), every status it can answer with the headers that come with it
(``WWW-Authenticate`` on a 401, ``Retry-After`` on the feed's 503), which token it takes, and
its parameters' patterns and bounds. No 422: the door answers a bad request 400
(http_app.py). docs/web.md, "The OpenAPI document", is what a website reads of it.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from services.web import ledger_routes
from services.web.auth import Role
from services.web.feed.filter import MAX_SEQUENCE, MAX_VALUES, TYPES
from services.web.feed.routes import SSE_RETRY_MS
from services.web.settings import WebSettings
from services.web.sidecar import routes as sidecar
from services.web.sidecar.fast import SCOPED
from shared import subjects
from shared.contracts import cleanup, gateway, ledger
from shared.contracts.ids import LEDGER_ID_PATTERN, MODULE_ID_PATTERN, SHARD_ID_PATTERN
from shared.contracts.ledger_statuses import CLEANUP_STATUSES, RUN_STATUSES
from shared.contracts.registry import BY_SUBJECT

REF = "#/components/schemas/{model}"

ERROR: dict[str, Any] = {
    "title": "Error",
    "type": "object",
    "description": "An answer that is not a success: the door's own `{\"error\": \"…\"}`, or the service's "
                   "reply `{\"status\": 4xx/5xx, \"error\": \"…\"}` relayed verbatim (docs/web.md).",
    "required": ["error"],
    "properties": {
        "error": {"type": "string", "description": "What went wrong, a sentence a person can act on."},
        "status": {"type": "integer", "minimum": 400, "maximum": 599,
                   "description": "Present when the service behind the door answered (its reply's status)."},
    },
}

SHARD_VERDICT: dict[str, Any] = {"anyOf": [{"$ref": "#/components/schemas/ShardAnswer"},
                                           {"$ref": "#/components/schemas/Error"}]}
"""A sidecar route's refusal: the shard's own answer line relayed (its ``kind`` and ``reason``),
or the gateway's or the door's ``{"error"}``."""

SECURITY_SCHEMES: dict[str, Any] = {
    "website": {"type": "http", "scheme": "bearer",
                "description": "The website's token (SHARDBUS_WEB_TOKEN). `Authorization: token <t>` is taken too."},
    "operator": {"type": "http", "scheme": "bearer",
                 "description": "The operator's token (SHARDBUS_WEB_OPERATOR_TOKEN): everything the website may "
                                "call, plus sweeps, reconciles and every module's reports."},
    "module": {"type": "http", "scheme": "bearer",
               "description": "A module's token (SHARDBUS_WEB_MODULE_TOKENS): that module's own expiries and "
                              "reconciles only."},
}

WEBSITE: tuple[Role, ...] = ("website", "operator")
OPERATOR: tuple[Role, ...] = ("operator",)
MODULE: tuple[Role, ...] = ("module", "operator")

STATUS_WORDS: dict[int, str] = {
    400: "Bad request. The door's: a body or parameter it cannot read or pass on (docs/web.md, \"Bodies and "
         "paths\"); or the service's: the field it names.",
    401: "No token, or one the door does not know.",
    403: "A known token whose role may not call this route.",
    404: "Not found.",
    409: "Conflict: the service's sentence says with what.",
    413: "The body is over SHARDBUS_WEB_MAX_BODY_BYTES, or more than NATS carries in one message.",
    502: "The service answered outside its contract.",
    503: "The service is not running (no replica answers), its own dependency is away, or the door is not "
         "connected to NATS; retry shortly.",
    504: "The service did not answer in time.",
}


@dataclass(frozen=True)
class Op:
    """What the document says of one operation beyond FastAPI's: who may call it, the contract
    it relays (its subject, or a pattern of one), its body, success and other statuses."""

    roles: tuple[Role, ...] = WEBSITE
    subject: str | None = None
    body: str | None = None
    """``contract``: the subject's request model; ``object``: any JSON object; ``any``: any JSON."""
    filled: tuple[str, ...] = ()
    """Request fields the path or query fills in (left out of the body's schema)."""
    success: int | None = HTTPStatus.OK
    reply: dict[str, Any] | None = None
    """The success body's schema, when not the subject's reply model."""
    statuses: dict[int, str] = field(default_factory=dict)
    """Statuses besides 400/401/403/413/502/503/504, with what they mean here."""
    description: str = ""


NOT_FOUND_RUN = {404: "No such run."}
NOT_FOUND_ROW = {404: "No such run or resource."}
CONFLICT = {409: "Conflict: the run's or row's status does not allow it (the sentence says the current one)."}


def _ledger_ops() -> dict[tuple[str, str], Op]:
    resource_ops = {
        ("post", f"/resources/{action}"): Op(subject=subject, body="contract",
                                              statuses={**NOT_FOUND_ROW, **CONFLICT})
        for action, subject in ledger_routes.RESOURCE_SUBJECTS.items()
    }
    return {
        ("post", "/runs"): Op(subject=subjects.LEDGER_RUN_CREATE, body="contract",
                              statuses={409: "The runId exists with another shard, event or schedule."}),
        ("get", "/runs"): Op(subject=subjects.LEDGER_RUNS),
        ("get", "/runs/{runId}"): Op(subject=subjects.LEDGER_CONSOLE, statuses=NOT_FOUND_RUN),
        ("get", "/runs/{runId}/log"): Op(subject=subjects.LEDGER_LOG, statuses=NOT_FOUND_RUN),
        ("post", "/runs/{runId}/status"): Op(subject=subjects.LEDGER_RUN_STATUS, body="contract",
                                             filled=("runId",), statuses={**NOT_FOUND_RUN, **CONFLICT}),
        **resource_ops,
        ("get", "/live"): Op(subject=subjects.LEDGER_LIVE),
        ("post", "/modules/{module}/expired"): Op(
            roles=MODULE, subject=subjects.LEDGER_EXPIRED_PATTERN, body="object",
            description="The ledger reads an expiry leniently: a body that is not `{kind, ref}` is answered "
                        "`{\"status\": 200, \"expired\": 0}` and changes nothing (docs/contracts.md, \"Ledger\")."),
        ("post", "/modules/{module}/reconcile"): Op(roles=MODULE, subject=subjects.LEDGER_RECONCILE_PATTERN,
                                                    body="contract", statuses=NOT_FOUND_RUN),
        ("post", "/cleanup/retry"): Op(subject=subjects.CLEANUP_RETRY, body="contract",
                                       statuses={**NOT_FOUND_RUN, 409: "The run's cleanup is not incomplete."}),
        ("post", "/cleanup/sweep"): Op(
            roles=OPERATOR, subject=subjects.CLEANUP_SWEEP, body="contract",
            statuses={**NOT_FOUND_RUN, 409: "The run is not over: its resources are given back only once it is."},
            reply={"anyOf": [_ref(cleanup.SweepReply), _ref(cleanup.RunReply)],
                   "description": "The whole sweep's totals; with `runId`, that run's report."}),
        ("post", "/cleanup/reconcile"): Op(roles=OPERATOR, subject=subjects.CLEANUP_RECONCILE, body="contract"),
        ("post", "/modules/install"): Op(
            subject=subjects.INSTALLER_INSTALL, body="contract", success=HTTPStatus.CREATED,
            statuses={409: "Another module is installed (a site runs one), or the site lock is busy."}),
        ("get", "/modules"): Op(subject=subjects.INSTALLER_LIST),
        ("delete", "/modules/{id}"): Op(subject=subjects.INSTALLER_REMOVE, filled=("id",),
                                        statuses={404: "That module is not installed.",
                                                  409: "The site lock is busy."}),
    }


SHARD_STATUSES: dict[int, str] = {
    400: "The door's (a body that is not a JSON object, a shard id that does not match), the gateway's (a "
         "staff verb without `actor`), or the shard's own verdict on the body, relayed: its answer line.",
    403: "A module's token; or the shard's own refusal (its plane's error kinds), relayed.",
    404: "No default shard is configured (the bare paths); or the shard's own not-found, relayed.",
    409: "`Shard-Protocol` names another protocol than the shard's; or the shard's own conflict, relayed.",
    425: "`bridge.busy`: the same call is in flight on the shard; retry later.",
    429: "The shard's own rate refusal, relayed.",
    503: "No gateway holds the shard (`{\"error\": \"shard not connected\"}`), or the shard's own 503 verdict.",
    504: "The shard did not answer in time (`{\"error\": \"shard did not reply in time\"}`).",
}

BOARD_STATUSES: dict[int, str] = {
    400: "The shard id does not match [a-z0-9_-]{1,32}.",
    404: "No default shard is configured (the bare paths), or no board by that name.",
    503: "No gateway is running to read the boards, or the board's bucket cannot be read now.",
    504: "The gateway did not answer the board read in time.",
}

ALWAYS_404 = ("ruleset", "points")
"""Boards the sidecar serves and shardbus does not: always 404 (docs/web.md, "Boards")."""


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=_name(model))}


def _name(model: type[BaseModel]) -> str:
    """A model's schema name: its class name, with its owner's when two owners share one."""
    owner = model.__module__.rsplit(".", 1)[-1]
    clashing = {"RunReply", "WireModel", "Module"}
    return f"{owner.title()}{model.__name__}" if model.__name__ in clashing else model.__name__


def _models() -> list[type[BaseModel]]:
    """Every model the document names: the contracts' requests and replies it relays."""
    models: list[type[BaseModel]] = [gateway.ShardAnswer]
    for op in _ledger_ops().values():
        if op.subject is not None:
            contract = BY_SUBJECT[op.subject]
            models += [contract.request, contract.reply]
    models += [cleanup.SweepReply, cleanup.RunReply]
    return list(dict.fromkeys(models))


def _schemas() -> dict[str, Any]:
    """The models' JSON schemas, each under its own name, references between them kept."""
    models = _models()
    _refs, top = models_json_schema([(m, "validation") for m in models], ref_template=REF)
    defs: dict[str, Any] = top.get("$defs", {})
    # pydantic names a clashing model by its module path; the document names it by _name().
    renames = {key: _name(m) for m in models for key in defs if key.endswith(f"__{m.__name__}")
               and key.replace("__", ".").startswith(m.__module__)}
    for m in models:
        renames.setdefault(m.__name__, _name(m))
    text = json.dumps(defs)
    for old, new in renames.items():
        text = text.replace(f'"{REF.format(model=old)}"', f'"{REF.format(model=new)}"')
    defs = json.loads(text)
    for schema in defs.values():
        for name, prop in schema.get("properties", {}).items():
            if prop.get("type") == "object" and prop.get("title") in STORED_JSON:
                schema["properties"][name] = {
                    **prop, "propertyNames": {"pattern": ledger.NO_NUL_PATTERN},
                    "additionalProperties": {"$ref": REF.format(model="StorableJson")},
                    "description": f"At most {STORED_JSON[prop['title']]} bytes as PostgreSQL prints it, nested at "
                                   f"most {ledger.JSON_DEPTH_MAX} deep (docs/contracts.md, \"Ledger\")."}
    named = {renames.get(key, key): value for key, value in defs.items()}
    for name, schema in named.items():
        if name != key_title(schema):  # one title a schema: generators name their classes by it
            schema["title"] = name
    return named


def key_title(schema: dict[str, Any]) -> str | None:
    title = schema.get("title")
    return title if isinstance(title, str) else None


STORED_JSON = {"Revert": ledger.REVERT_MAX_BYTES, "Summary": ledger.SUMMARY_MAX_BYTES}
"""The free-form objects the ledger stores as PostgreSQL jsonb (their schema's title)."""

NO_NUL_TEXT: dict[str, Any] = {"type": "string", "pattern": ledger.NO_NUL_PATTERN}
SCALARS: list[dict[str, Any]] = [{"type": "number"}, {"type": "boolean"}, {"type": "null"}]
"""One type each: Python client generators (openapi-python-client) refuse a list of types in a union."""

STORED: dict[str, dict[str, Any]] = {
    "StorableJson": {
        "description": "A JSON value PostgreSQL stores: no NUL character (U+0000) in any string or key.",
        "anyOf": [NO_NUL_TEXT, *SCALARS, {"$ref": REF.format(model="StorableArray")},
                  {"$ref": REF.format(model="StorableObject")}],
    },
    "StorableObject": {
        "type": "object", "description": "A JSON object PostgreSQL stores: no NUL in a key or within.",
        "propertyNames": {"pattern": ledger.NO_NUL_PATTERN},
        "additionalProperties": {"$ref": REF.format(model="StorableJson")},
    },
    # An array's items refer to StorableObject, not back to StorableJson: TypeScript generators
    # (openapi-typescript) cannot type an array of itself (TS2502). An array within an array holds
    # no NUL either; this schema does not say so.
    "StorableArray": {
        "type": "array", "description": "A JSON array PostgreSQL stores: no NUL within.",
        "items": {"anyOf": [NO_NUL_TEXT, *SCALARS, {"$ref": REF.format(model="StorableObject")},
                            {"type": "array", "items": {}}]},
    },
}
"""What the ledger's stored JSON objects (revert, summary) may hold, as components."""


def _request_schema(op: Op) -> dict[str, Any]:
    if op.body == "any":
        return {"description": "Any JSON value: a body that is not an object is read as `{}`."}
    if op.body == "object" or op.subject is None:
        return {"type": "object"}
    model = BY_SUBJECT[op.subject].request
    if not op.filled:
        return _ref(model)
    schema: dict[str, Any] = copy.deepcopy(_schemas()[_name(model)])
    for name in op.filled:
        schema.get("properties", {}).pop(name, None)
        if name in schema.get("required", []):
            schema["required"].remove(name)
    schema["title"] = f"{schema.get('title', model.__name__)} (less {', '.join(op.filled)}: from the path)"
    return schema


def _error(status: int, words: str, *, headers: dict[str, Any] | None = None,
           schema: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": words, "content": {"application/json": {
        "schema": schema or {"$ref": "#/components/schemas/Error"}}}}
    if headers:
        answer["headers"] = headers
    return answer


UNAUTHORIZED_HEADERS = {"WWW-Authenticate": {"description": "Always `Bearer`.", "required": True,
                                             "schema": {"type": "string", "enum": ["Bearer"]}}}
RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before reconnecting (when the door is full or "
                                              "the feed's stream is away).",
                               "schema": {"type": "string", "pattern": "^[0-9]+$"}}}


def _answers(statuses: dict[int, str], success: tuple[int, str, dict[str, Any]] | None,
             *, verdict: dict[str, Any] | None = None, headers: dict[int, dict[str, Any]] | None = None,
             ) -> dict[str, Any]:
    answers: dict[str, Any] = {}
    if success is not None:
        status, words, schema = success
        answers[str(status)] = {"description": words, "content": {"application/json": {"schema": schema}}}
    for status in sorted(statuses):
        door_only = (HTTPStatus.UNAUTHORIZED, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, HTTPStatus.BAD_GATEWAY)
        shard_said = verdict is not None and status not in door_only
        extra = dict(headers.get(status, {})) if headers else {}
        if status == HTTPStatus.UNAUTHORIZED:
            extra.update(UNAUTHORIZED_HEADERS)
        answers[str(status)] = _error(status, statuses[status], headers=extra or None,
                                      schema=verdict if shard_said else None)
    return answers


def _security(roles: tuple[Role, ...]) -> list[dict[str, list[str]]]:
    return [{role: []} for role in roles]


def _parameter(name: str, where: str, schema: dict[str, Any], words: str, required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required or where == "path", "description": words,
            "schema": schema}


def _pattern(regex: str) -> str:
    return f"^{regex}$"


SHARD_PARAMETER = _parameter("shard", "path", {"type": "string", "pattern": _pattern(SHARD_ID_PATTERN)},
                             "The shard's id (else 400).")
PROTOCOL_PARAMETER = _parameter(sidecar.PROTOCOL_HEADER, "header", {"type": "string", "maxLength": 64},
                                "The shard protocol the website speaks (7): a shard speaking another answers 409.")
AFTER = _parameter("after", "query", {"type": "integer", "minimum": 0, "maximum": ledger.BIGINT_MAX},
                   "The `next` of the page before.")


def _limit(maximum: int) -> dict[str, Any]:
    return _parameter("limit", "query", {"type": "integer", "minimum": 1, "maximum": maximum},
                      "At most this many rows (the ledger's default when absent).")


def _ledger_parameters(method: str, path: str) -> list[dict[str, Any]]:
    ledger_id = {"type": "string", "pattern": _pattern(LEDGER_ID_PATTERN)}
    found: list[dict[str, Any]] = []
    if "{runId}" in path:
        found.append(_parameter("runId", "path", ledger_id, "The run: letters, digits, _ and -, at most 64 "
                                                            "(the ledger answers 400 otherwise)."))
    if "{module}" in path:
        found.append(_parameter("module", "path", ledger_id, "The module reporting: the ledger's pattern "
                                                             "(else 400); a module's token names only itself."))
    if "{id}" in path:
        found.append(_parameter("id", "path", {"type": "string", "pattern": _pattern(MODULE_ID_PATTERN)},
                                "The installed module's id (else 400)."))
    if (method, path) == ("get", "/runs"):
        found += [
            _parameter("status", "query", {"type": "string", "enum": [*RUN_STATUSES, ""]},
                       "Only runs with this status (empty: no filter)."),
            _parameter("cleanupStatus", "query", {"type": "string", "enum": [*CLEANUP_STATUSES, ""]},
                       "Only runs whose cleanup has this status (empty: no filter)."),
            _limit(ledger.PAGE_LIMIT_MAX)]
    elif path in ("/runs/{runId}", "/runs/{runId}/log"):
        found += [AFTER, _limit(ledger.PAGE_LIMIT_MAX)]
    elif path == "/live":
        found += [_parameter("module", "query", ledger_id, "The module whose live rows to list.", required=True),
                  AFTER, _limit(ledger.LIVE_LIMIT_MAX)]
    return found


def _ledger_operation(method: str, path: str, op: Op) -> dict[str, Any]:
    contract = BY_SUBJECT[op.subject] if op.subject else None
    statuses = {status: STATUS_WORDS[status] for status in (400, 401, 403, 502, 503, 504)}
    if op.body is not None:
        statuses[HTTPStatus.REQUEST_ENTITY_TOO_LARGE] = STATUS_WORDS[HTTPStatus.REQUEST_ENTITY_TOO_LARGE]
    statuses.update(op.statuses)
    success = None
    if op.success is not None and contract is not None:
        reply = op.reply or _ref(contract.reply)
        words = f"The {contract.owner}'s reply to `{op.subject}`, verbatim" + (
            " (the installer's `\"status\": 200` kept)." if op.success == HTTPStatus.CREATED else ".")
        success = (op.success, words, reply)
    operation: dict[str, Any] = {"security": _security(op.roles), "parameters": _ledger_parameters(method, path),
                                 "responses": _answers(statuses, success)}
    if op.description:
        operation["description"] = op.description
    if op.body is not None:
        schema = _request_schema(op)
        resolved = _schemas().get(schema["$ref"].rsplit("/", 1)[1], {}) if "$ref" in schema else schema
        operation["requestBody"] = {
            # An empty body is read as {}: with a field required, the service's 400 names it.
            "required": bool(resolved.get("required")),
            "description": "A JSON object (an empty body is `{}`); unknown fields are ignored.",
            "content": {"application/json": {"schema": schema}}}
    return operation


def _sidecar_operation(method: str, path: str) -> dict[str, Any]:
    scoped = path.startswith(SCOPED + "/")
    bare = path[len(SCOPED):] if scoped else path
    parameters = [SHARD_PARAMETER] if scoped else []
    board = bare[1:] if bare[1:] in sidecar.BOARDS else None
    if board is not None:
        statuses = {status: BOARD_STATUSES[status] for status in (400, 404, 503, 504)}
        statuses.update({401: STATUS_WORDS[401], 403: STATUS_WORDS[403], 502: STATUS_WORDS[502]})
        if not scoped:
            del statuses[HTTPStatus.BAD_REQUEST]
        if board in ALWAYS_404:
            return {"security": _security(WEBSITE), "parameters": parameters,
                    "description": f"Always 404 `{{\"error\": \"no board named '{board}'; boards: …\"}}`: the "
                                   "sidecar serves this board, shardbus does not (docs/web.md, \"Boards\").",
                    "responses": _answers(statuses, None)}
        items = (HTTPStatus.OK, "The board: a JSON array of items, each the frame the shard sent.",
                 {"type": "array", "items": {"type": "object"}})
        return {"security": _security(WEBSITE), "parameters": parameters, "responses": _answers(statuses, items)}
    route = next(r for r in sidecar.ROUTES if r.method.lower() == method and r.path == bare)
    for name in ("run_id", "page_id"):
        if "{" + name + "}" in route.path:
            parameters.append(_parameter(name, "path", {"type": "string", "minLength": 1,
                                                        "maxLength": sidecar.PATH_ID_MAX},
                                         f"Becomes `{route.path_id}` in the body (over the body's).",))
    for name in route.query:
        parameters.append(_parameter(name, "query", {"type": "string"}, f"Copied into the body as `{name}`."))
    parameters.append(PROTOCOL_PARAMETER)
    statuses = {**SHARD_STATUSES, 401: STATUS_WORDS[401], 502: STATUS_WORDS[502]}
    if method == "post":
        statuses[HTTPStatus.REQUEST_ENTITY_TOO_LARGE] = STATUS_WORDS[HTTPStatus.REQUEST_ENTITY_TOO_LARGE]
    answer = ("The shard's answer line itself (`replayed: true` on a repeated idempotencyKey; "
              "`lease.drifted` is a 200 too).")
    success: tuple[int, str, dict[str, Any]] = (HTTPStatus.OK, answer, _ref(gateway.ShardAnswer))
    operation: dict[str, Any] = {
        "security": _security(WEBSITE), "parameters": parameters,
        "description": f"Sends `{route.verb}` to the shard (`shard.<shard>.cmd.{route.verb}`); the shard judges "
                       "the body's fields, and its refusal is relayed with its status and its answer line as the "
                       "body (docs/contracts.md, \"Gateway command plane\").",
        "responses": _answers(statuses, success, verdict=SHARD_VERDICT)}
    if method == "post":
        if route.path_id is not None:
            schema: dict[str, Any] = {"description": f"The command's fields; `{route.path_id}` comes from the path. "
                                                     "A body that is not a JSON object is read as `{}`."}
        else:
            schema = {"type": "object", "description": "The command's fields (an empty body or `null` is `{}`)."}
        operation["requestBody"] = {"required": False, "content": {"application/json": {
            "schema": schema, "example": route.example or {}}}}
    return operation


def _at_most(maximum: int) -> str:
    """A regex of the decimal numbers from 0 to ``maximum`` (leading zeros allowed, as the
    door reads them): fewer digits, or as many and no greater, digit by digit."""
    top = str(maximum)
    shorter = f"[0-9]{{1,{len(top) - 1}}}"
    same = [f"{top[:i]}[0-{int(d) - 1}][0-9]{{{len(top) - i - 1}}}" for i, d in enumerate(top) if d != "0"]
    return "^(?:" + "|".join([shorter, *same, top]) + ")$"


def _listed(item: str, words: str) -> dict[str, Any]:
    """A feed filter parameter: comma-separated values, each matching ``item``."""
    return {"type": "string", "pattern": f"^{item}(?:,{item}){{0,{MAX_VALUES - 1}}}$",
            "description": f"{words} Comma-separated (or the parameter repeated), at most {MAX_VALUES} values."}


def _events_operation() -> dict[str, Any]:
    statuses = {400: "A filter value that does not match, or filters that contradict each other (`kinds` with "
                     "`types` leaving frames out, `boards` with `types` leaving boards out): the sentence names it.",
                401: "No token (header or `?token=`), or one the door does not know.",
                403: "A module's token.",
                503: "Too many feed clients, the feed's stream away, or the door not connected to NATS yet."}
    boards = "|".join(WebSettings.model_fields["web_feed_boards"].default)
    kind_token = r"(?:[A-Za-z0-9_-]+|\*)"
    kind = rf"(?:{kind_token}(?:\.{kind_token})*(?:\.>)?|>)"
    cursor = {"type": "string", "pattern": _at_most(MAX_SEQUENCE)}
    parameters = [
        _parameter("token", "query", {"type": "string"}, "The token, where headers cannot be set (EventSource)."),
        _parameter("since", "query", cursor, "Resume after this `seq` (digits, at most 2^63-1)."),
        _parameter("types", "query", _listed(f"(?:{'|'.join(TYPES)})", "Event types."), "Event types."),
        _parameter("shards", "query", _listed(SHARD_ID_PATTERN, "Shard ids."), "Shard ids."),
        _parameter("kinds", "query", _listed(kind, "Frame kinds (each at most 128 characters): `*` one token, "
                                                   "a final `>` the rest."), "Frame kinds."),
        _parameter("boards", "query", _listed(f"(?:{boards})", "Board names (SHARDBUS_WEB_FEED_BOARDS)."),
                   "Board names."),
        _parameter("Last-Event-ID", "header", cursor, "Sent by EventSource on reconnecting; wins over `since`."),
    ]
    event = {
        "type": "object", "required": ["data"],
        "description": "One server-sent event: `id` is its `seq`, `data` one JSON object (the first a `hello`, "
                       "then frames, board changes and ledger events; docs/web.md, \"Messages\").",
        "properties": {
            "id": {"type": "string", "pattern": _at_most(MAX_SEQUENCE)},
            "event": {"type": "string", "enum": ["message", "dropped"],
                      "description": "`message` (unnamed) for every feed event; `dropped` last, with the reason."},
            "data": {"type": "string", "contentMediaType": "application/json"},
            "retry": {"type": "integer", "const": SSE_RETRY_MS},
        }}
    return {
        "security": _security(WEBSITE), "parameters": parameters,
        "description": "Server-sent events: each event `id: <seq>` and `data: <one JSON object>`, the first a "
                       "`hello`; a dropped client gets `event: dropped` (docs/web.md, \"The live feed\").",
        "responses": {
            "200": {"description": "The event stream (it does not end while the client reads); the schema is "
                                   "one event's.",
                    "content": {"text/event-stream": {"schema": event}}},
            **_answers(statuses, None, headers={503: RETRY_AFTER}),
        }}


def _overlaps(paths: dict[str, Any]) -> None:
    """Where a literal path is also a value of a templated one (``/world/save`` of
    ``/world/{run_id}``, ``/modules/install`` of ``/modules/{id}``), the templated route's other
    methods are served at it too: documented at the literal path (OpenAPI matches a literal
    path first), the template's parameter fixed."""
    templated = {path: re.compile("^" + re.sub(r"\{[^}/]+\}", "([^/]+)", path) + "$") for path in paths if "{" in path}
    for literal in list(paths):
        for path, pattern in templated.items():
            found = pattern.match(literal.replace("{shard}", "x"))
            if found is None or path == literal or path.count("{") != literal.count("{") + 1:
                continue
            name = next(n for n in re.findall(r"\{([^}/]+)\}", path) if n != "shard")
            value = literal.rstrip("/").split("/")[path.split("/").index("{" + name + "}")]
            for method, operation in paths[path].items():
                if method in paths[literal]:
                    continue
                same = copy.deepcopy(operation)
                same["parameters"] = [p for p in same["parameters"] if p["name"] != name]
                same["operationId"] = f"{operation['operationId']}_{value}"
                same["description"] = (f"`{method.upper()} {path}` with `{name}` = `{value}`: the same route. "
                                       + same.get("description", ""))
                paths[literal][method] = same


def describe(generated: dict[str, Any]) -> dict[str, Any]:
    """FastAPI's document of the door's routes (``generated``) made exact: every operation as
    the door answers it, the contracts' models as components, the bearer tokens."""
    ledger_ops = _ledger_ops()
    paths: dict[str, Any] = {}
    for path, operations in generated["paths"].items():
        for method, fastapi_op in operations.items():
            kept = {key: fastapi_op[key] for key in ("tags", "summary", "operationId") if key in fastapi_op}
            if (method, path) in ledger_ops:
                mine = _ledger_operation(method, path, ledger_ops[(method, path)])
            elif path == "/events":
                mine = _events_operation()
            else:
                mine = _sidecar_operation(method, path)
            paths.setdefault(path, {})[method] = {**kept, **mine}
    _overlaps(paths)
    schemas = {"Error": ERROR, **STORED, **_schemas()}
    return {
        "openapi": generated["openapi"],
        "info": {**generated["info"], "description": generated["info"].get("description", "")
                 + " Every answer that is not a success is a JSON object with `error` (docs/web.md)."},
        "paths": paths,
        "components": {"schemas": dict(sorted(schemas.items())), "securitySchemes": SECURITY_SCHEMES},
    }
