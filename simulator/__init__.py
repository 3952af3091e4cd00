"""A shard simulator speaking protocol 7 to the gateway over real TCP: for demos, tests and
benchmarks (``shardbus shard-sim``, or :class:`simulator.shard.ShardSimulator` in-process)."""
