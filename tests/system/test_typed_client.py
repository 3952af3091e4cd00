"""A website's typed client: TypeScript types generated from docs/openapi/web.json by
openapi-typescript, and docs/examples/website.ts calling three routes through them (POST /runs,
GET /runs/{runId}, GET /shards/{shard}/guilds), type-check with ``tsc --noEmit`` (docs/web.md,
"The OpenAPI document"). Both tools are pinned in tests/npm/ and installed by ``make
npm-tools``; a missing one fails, never skips."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".npm-tools" / "node_modules" / ".bin"
EXAMPLES = ROOT / "docs" / "examples"
DOCUMENT = ROOT / "docs" / "openapi" / "web.json"
GENERATE = ["--default-non-nullable", "false"]
"""As docs/examples/website.ts says to run it: a field with a default stays optional."""


def _type_check(document: Path, where: Path) -> subprocess.CompletedProcess[str]:
    for tool in ("openapi-typescript", "tsc"):
        assert (BIN / tool).exists(), f"no {tool}: make npm-tools"
    assert shutil.which("node"), "no node: make npm-tools"
    for name in ("website.ts", "tsconfig.json"):
        shutil.copy(EXAMPLES / name, where / name)
    generated = subprocess.run([str(BIN / "openapi-typescript"), str(document), *GENERATE, "-o",
                                str(where / "web-api.ts")], capture_output=True, text=True, timeout=120)
    assert generated.returncode == 0, generated.stderr
    return subprocess.run([str(BIN / "tsc"), "-p", str(where / "tsconfig.json")], capture_output=True, text=True,
                          timeout=180, cwd=where)


def test_the_sample_website_type_checks_against_the_document(tmp_path):
    checked = _type_check(DOCUMENT, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_route_the_document_drops_fails_the_type_check(tmp_path):
    document = json.loads(DOCUMENT.read_text())
    del document["paths"]["/runs/{runId}"]
    changed = tmp_path / "web.json"
    changed.write_text(json.dumps(document))
    checked = _type_check(changed, tmp_path)
    assert checked.returncode != 0
    assert "website.ts" in checked.stdout and "/runs/{runId}" in checked.stdout, checked.stdout
