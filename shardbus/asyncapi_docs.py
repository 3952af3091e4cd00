"""``python -m shardbus.asyncapi_docs FILE…``: rewrites each AsyncAPI document ``make docs``
generated with its keys sorted, so that regenerating an unchanged tree changes no byte.

FastStream lists a service's channels in an order that changes from one process to the next
(the same code gave ``shardbus.ping`` first in one run and ``installer.remove`` in another), so
the order it writes carries no meaning; sorted, the committed documents diff only where the
code changed (docs/asyncapi/)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def stable_text(document: object) -> str:
    """The one text of ``document`` that ``make docs`` writes: keys sorted, two-space indent."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(paths: list[str]) -> int:
    for path in map(Path, paths):
        path.write_text(stable_text(json.loads(path.read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
