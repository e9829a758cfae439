"""Group chat (CHAT-4): a message into a group becomes the master agent's dispatch plan (which
member threads get which instruction, chosen by their context budgets), the person confirms it,
one dispatch_execution task runs per thread, each thread's raw result comes back into the group,
and the master agent sums up.

- `choice.py`: the pure target choice over the members' budgets, open tasks and devices' presence;
- `plans.py`: plan values, their lifecycle (proposed -> confirmed | rejected | expired |
  superseded) and the group's collaboration gate;
- `drafting.py`, `summary.py`: the master model's requests and the checks of its answers, the
  plain summary and the group's messages;
- `repository.py`: the dispatch_plans and dispatch_targets tables (migration 0004);
- `presence.py`: device presence from the scheduler (`ListDevicePresence`);
- `handlers.py`: sending, confirming, rejecting, a group's state; `progress.py`: the dispatch
  tasks' reports, the summary, expiry; `support.py`: what both share;
- `background.py`: the summaries and expiry a conversations process runs;
- `settings.py`: BOSS_DISPATCH_*; `proto_mapping.py`: plans as protobuf messages.
"""
