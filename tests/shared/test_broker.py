"""Every request gets an answer: a validation error is a 400 naming the field, a handler that
raises is a 500, never a caller left waiting for its timeout (real nats-server)."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field

from shared import subjects
from shared.broker import make_app, make_broker
from shared.health import add_health
from shared.settings import CommonSettings


class Add(BaseModel):
    a: int
    b: int = Field(ge=0)


@pytest.fixture
async def calculator(nats_url, unique):
    settings = CommonSettings(nats_url=nats_url)
    broker = make_broker(settings, "calc")
    app = make_app(broker, "calc")

    @broker.subscriber(f"calc.{unique}.add", queue="calc")
    async def add(request: Add) -> dict:
        return {"status": 200, "sum": request.a + request.b}

    @broker.subscriber(f"calc.{unique}.boom", queue="calc")
    async def boom(request: Add) -> dict:
        raise RuntimeError("kaput")

    add_health(app, broker, f"calc{unique}", settings)
    async with app:
        yield unique


async def _ask(nc, subject: str, body: bytes) -> dict:
    return json.loads((await nc.request(subject, body, timeout=3)).data)


async def test_a_valid_request_gets_its_result(calculator, nc):
    assert await _ask(nc, f"calc.{calculator}.add", b'{"a": 2, "b": 3}') == {"status": 200, "sum": 5}


async def test_a_request_failing_validation_gets_a_400_naming_the_field(calculator, nc):
    reply = await _ask(nc, f"calc.{calculator}.add", b'{"a": 2, "b": -1}')
    assert reply["status"] == 400
    assert "b:" in reply["error"] and "greater than or equal to 0" in reply["error"]


async def test_a_missing_field_is_named(calculator, nc):
    reply = await _ask(nc, f"calc.{calculator}.add", b'{"b": 1}')
    assert reply["status"] == 400 and "a: Field required" in reply["error"]


async def test_a_body_that_is_not_json_gets_a_400(calculator, nc):
    reply = await _ask(nc, f"calc.{calculator}.add", b"not json at all")
    assert reply["status"] == 400


async def test_a_handler_that_raises_answers_500_and_keeps_serving(calculator, nc):
    reply = await _ask(nc, f"calc.{calculator}.boom", b'{"a": 1, "b": 1}')
    assert reply["status"] == 500 and "RuntimeError" in reply["error"] and "kaput" not in reply["error"]
    assert (await _ask(nc, f"calc.{calculator}.add", b'{"a": 1, "b": 1}'))["sum"] == 2


async def test_health_answers_with_the_service_name(calculator, nc):
    reply = await _ask(nc, subjects.health(f"calc{calculator}"), b"")
    assert reply["status"] == 200 and reply["service"] == f"calc{calculator}"
