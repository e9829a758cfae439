"""The worker's handoff side: receives scheduler commands and builds CB-18 handoff packages.

Run it next to the worker agent: `HandoffWorker(address, token, worker_id, node_id,
lookup_from_agent(agent)).run()` as a background task.
"""

from worker.handoff.builder import BuiltPackage, SessionFacts, build_package
from worker.handoff.listener import HandoffWorker, ThreadSession, lookup_from_agent

__all__ = [
    "BuiltPackage",
    "HandoffWorker",
    "SessionFacts",
    "ThreadSession",
    "build_package",
    "lookup_from_agent",
]
