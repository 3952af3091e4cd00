"""``python -m services.ledger.queries [--names | NAME …]``: print the ledger's statements."""

import sys

from services.ledger.queries import main

raise SystemExit(main(sys.argv[1:]))
