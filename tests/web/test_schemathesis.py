"""Schemathesis against the door, as a website developer fuzzes it before relying on
docs/openapi/web.json (docs/web.md, "The OpenAPI document"): a pinned Schemathesis, every check
(response schemas, statuses, headers, negative and positive data, auth, the stateful phase),
the website's and the operator's token, against a real door on a real stack — the ledger and
PostgreSQL, cleanup and installer processes, a gateway with a shard simulator answering as the
door's default shard. Bounded by example counts and deterministic generation, not by time:
``make test-schemathesis`` runs the same with more examples."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from tests.cleanup.conftest import start_cleanup
from tests.gateway.conftest import shard_sims, start_gateway  # noqa: F401 — fixtures
from tests.ledger.conftest import ledger, ledger_db  # noqa: F401 — fixtures
from tests.web.conftest import OPERATOR_TOKEN, WEBSITE_TOKEN

ROOT = Path(__file__).resolve().parents[2]
DOCUMENT = ROOT / "docs" / "openapi" / "web.json"
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
CONFIG = Path(__file__).with_name("schemathesis.toml")

EXAMPLES = int(os.environ.get("SHARDBUS_SCHEMATHESIS_EXAMPLES", "5"))
"""Examples per operation and phase (``make test-schemathesis`` raises it)."""

RUN_TIMEOUT_S = float(os.environ.get("SHARDBUS_SCHEMATHESIS_TIMEOUT_S", "240"))
"""A hang's bound, far above a run's time (about 25 s a token here, 5 examples), below pytest's
300 s: never what ends a run that works."""


SLOW_S = 60.0
"""The door's and the gateway's waits here: a 504 is a documented answer but a finding of
``not_a_server_error``, so none may come of a loaded machine (the defaults are 8 s and 5 s)."""


@pytest.fixture
async def stack_door(ledger, start_gateway, shard_sims, services, start_door, unique, tmp_path):  # noqa: F811
    """The door, the default shard a simulator behind a gateway, and every service behind it."""
    shard = f"s{unique}"
    await shard_sims(await start_gateway(command_timeout_s=SLOW_S), shard)
    await start_cleanup(services)
    await asyncio.to_thread(services.start, "installer", modules_dir=str(tmp_path / "modules"),
                            installer_site=f"t{unique}")
    return await start_door(web_default_shard=shard, web_request_timeout_s=SLOW_S + 10)


@pytest.mark.parametrize("token", [WEBSITE_TOKEN, OPERATOR_TOKEN], ids=["website", "operator"])
async def test_schemathesis_finds_nothing(stack_door, token, tmp_path):
    env = {**os.environ, "SCHEMATHESIS_SHARD": stack_door.settings.web_default_shard,
           "SCHEMATHESIS_HOOKS": "tests.web.schemathesis_hooks", "PYTHONPATH": str(ROOT)}
    args = [str(SCHEMATHESIS), "--config-file", str(CONFIG), "run", str(DOCUMENT), "--url", stack_door.url,
            "--header", f"Authorization: Bearer {token}", "--checks", "all",
            "--phases", "examples,coverage,fuzzing,stateful", "--max-examples", str(EXAMPLES),
            "--generation-deterministic", "--workers", "1", "--request-timeout", str(SLOW_S * 3),
            "--no-color", "--output-truncate", "false",
            "--report", "junit", "--report-dir", str(tmp_path)]
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT, cwd=tmp_path, env=env)
    try:
        async with asyncio.timeout(RUN_TIMEOUT_S):
            output, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = output.decode(errors="replace")
    (tmp_path / "schemathesis.txt").write_text(text)
    print(text[-6000:])
    assert proc.returncode == 0, text[-20000:]
