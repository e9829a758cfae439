"""The context_budget bounded context (SPEC CB-2, CB-6, CB-7, CB-9 to CB-11).

Device workers report each Codex thread's context budget over gRPC; this service validates the
readings, classifies them with the threshold policy, keeps their history, the current budget per
thread and the thread alerts, and publishes `thread.context.*` events through its transactional outbox.

Start it with `python -m services.context_budget serve` (see `server.py` for the in-process API).
"""

SERVICE_NAME = "context_budget"
GRPC_SERVICE_NAME = "boss.context_budget.v1.ContextBudgetService"
