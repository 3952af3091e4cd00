"""shardbus: the command line and the embedded stack that run the four services."""

__version__ = "0.1.0"
