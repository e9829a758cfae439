"""Tasks and leases (CHAT-1, CHAT-3): runs of a user's message on a node's local agent.

The scheduler owns tasks. Conversations publishes `task.requested` (stored with the user message in
one transaction); `TaskHandlers.apply_task_requests` creates the task, queued, idempotent by
task_id. A node's local agent claims its node's tasks with a lease (`ClaimTask`, a long poll woken
by the enqueue's commit), starts, heartbeats and finishes them, every step fenced by the lease; the
sweeper requeues claims that were never started, fails runs whose agent stopped answering, and
says when a queued task's device is offline, then expires it. Every status change publishes
`task.status_changed` in its transaction.

- `model.py`: statuses, kinds, the `Task` value, settings and the state machine.
- `rules.py`: pure rules: the per-thread claim order, task requests, finish outcomes, wording.
- `sweep.py`: pure sweeper decisions.
- `tables.py`, `repository.py`: the `tasks` and `device_presence` tables and their SQL.
- `wakeups.py`: waking waiting claims (in process, and LISTEN/NOTIFY on PostgreSQL).
- `handlers.py`: the unit-of-work handlers; `servicer.py`: the five task RPCs.
"""
