"""Per-shard tokens (``SHARDBUS_SHARD_TOKENS``): a shard holding its own token cannot say hello
as another shard, so it can neither publish that shard's frames nor take its commands."""

from __future__ import annotations

import asyncio
import json
import secrets

import pytest

from services.gateway.shard_link.wire import HelloRefused, check_hello
from shared import subjects
from tests.gateway.conftest import INTEREST_SETTLE_S, TOKEN, refused


async def test_a_shard_cannot_say_hello_as_another_shard(start_gateway, shard_sims, nc, unique):
    first, second = f"a{unique}", f"b{unique}"
    tokens = {first: secrets.token_urlsafe(16), second: secrets.token_urlsafe(16)}
    running = await start_gateway(shard_tokens=tokens)
    heard: list[str] = []

    async def on_frame(msg) -> None:
        heard.append(msg.subject)

    await nc.subscribe(f"shard.{second}.frame.>", cb=on_frame)
    await nc.flush(timeout=5)
    await asyncio.sleep(INTEREST_SETTLE_S)

    assert await refused(running, second, tokens[first])  # first's token, second's id
    assert await refused(running, second, TOKEN)  # the common token is not enough either
    assert await refused(running, first, tokens[second])
    await asyncio.sleep(0.2)
    assert heard == []  # no hello of the impostor reached the stream

    # Each shard with its own token is accepted, and then holds its own commands only.
    a = await shard_sims(running, first, token=tokens[first])
    b = await shard_sims(running, second, token=tokens[second])
    assert set(running.gateway.links) >= {first, second}
    msg = await nc.request(subjects.command(second, "item.catalog"), b"{}", timeout=5)
    assert json.loads(msg.data)["status"] == 200
    assert b.executed["item.catalog"] == 1 and a.executed["item.catalog"] == 0
    assert [s for s in heard if s.endswith("server.hello")] == [f"shard.{second}.frame.server.hello"]


async def test_a_per_shard_token_is_never_logged(start_gateway, unique, caplog):
    own = secrets.token_urlsafe(16)
    running = await start_gateway(shard_tokens={f"a{unique}": own})
    with caplog.at_level("INFO"):
        assert await refused(running, f"b{unique}", own)
    assert "hello refused" in caplog.text and own not in caplog.text


@pytest.mark.parametrize("configured", ["", {"uo1": ""}])
def test_a_shard_with_no_token_configured_is_refused_even_with_an_empty_token(configured):
    hello = json.dumps({"t": 1, "kind": "server.hello", "shard": "uo1", "protocol": 7, "token": ""}).encode()
    token_for = configured if isinstance(configured, str) else configured.get
    with pytest.raises(HelloRefused, match="no token is configured"):
        check_hello(hello, token_for)
