"""Redis: batches, jobs, results and events (`results`), stored conversations (`conversations`),
the counters `/metrics` reads (`metrics`), every key name (`keys`), and the embedded Redis for the
demo and tests (`embedded`). Every write a redelivered job can repeat is idempotent.
"""
