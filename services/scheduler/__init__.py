"""The scheduler bounded context: budget-driven ranking of threads (CB-4, CB-17), per-level actions
(CB-7), handoff packages (CB-6, CB-18), worker commands, and the pre-compaction guarantee (CB-3, CB-19).

It follows context_budget's event stream with a durable cursor and keeps its own scheduling view of
every thread; it never reads another context's tables.
"""
