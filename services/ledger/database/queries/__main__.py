"""``python -m services.ledger.database.queries [--names | NAME …]``: print the ledger's statements."""

import sys

from services.ledger.database.queries import main

raise SystemExit(main(sys.argv[1:]))
