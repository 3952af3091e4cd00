"""The door's OpenAPI document, for docs/openapi/web.json: ``python -m services.web.openapi
--out docs/openapi/web.json`` (``make docs``). What it says is services/web/openapi_doc.py's."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from services.web.http_app import build_http_app
from services.web.settings import WebSettings


def document() -> dict[str, Any]:
    """The OpenAPI document of every route, as a door serves it at ``/openapi.json`` (built
    with a placeholder token; none is in it)."""
    settings = WebSettings(web_token=SecretStr("openapi-placeholder"))
    return build_http_app(settings).openapi()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document(), indent=2, ensure_ascii=False) + "\n")
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
