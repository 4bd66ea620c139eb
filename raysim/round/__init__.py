"""One synchronized round, without Ray: the validated experiment as it travels to every process (`experiment`),
the round engine that plans, aggregates, runs the system model and the ledger and writes the round's rows
(`engine`), a shard of logical clients and their steps (`shard`), the fixed reduction tree that makes sums
independent of packing (`reduction`), and `backend: local`, the whole run in one process (`local`). The Ray
actors drive the same engine and shards."""
