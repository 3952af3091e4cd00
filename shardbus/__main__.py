"""``python -m shardbus`` is the ``shardbus`` command."""

from shardbus.cli import main

raise SystemExit(main())
