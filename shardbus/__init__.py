"""shardbus: the command line and the embedded stack that run the five services."""

__version__ = "0.1.0"
