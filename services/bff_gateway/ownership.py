"""The owner rule for thread reads the conversations projection does not serve.

A client token acts for one owner; the conversations service knows which owner each thread belongs
to and answers another owner's thread as NOT_FOUND. The routes that read a thread from elsewhere
(`GET /api/v1/threads/{id}/context-budget` from context_budget and the scheduler, the handoff
package routes from the scheduler) call `require_own_thread` first, so a client token sees exactly
the threads its owner sees on the home list:

- the thread is the caller's owner's: nothing happens;
- it is another owner's or unknown to conversations: 404 problem+json (`thread_not_found`, reason
  THREAD_NOT_FOUND, or the route's own "unknown id" problem), never a hint that it exists;
- conversations cannot be reached: 503 problem+json with Retry-After (never a silent bypass).

Worker and service tokens are not scoped by owner here: each backend applies its own rules to them.
"""

from __future__ import annotations

from boss.conversations.v1 import conversations_pb2 as conversations_pb
from fastapi import Request

from services.bff_gateway.auth import Caller
from services.bff_gateway.problems import ProblemError
from services.bff_gateway.routers.conversations import conversations_client
from services.shared.errors import THREAD_NOT_FOUND

CLIENT_KIND = "client"


def thread_not_found(thread_id: str) -> ProblemError:
    """404 for a thread the caller may not see (unknown, or another owner's: the same answer)."""
    return ProblemError(
        404, "not-found", f"thread {thread_id!r} not found", title="Not found", reason=THREAD_NOT_FOUND
    )


async def require_own_thread(
    request: Request, caller: Caller, thread_id: str, *, not_found: ProblemError | None = None
) -> None:
    """Checks that a client token's owner owns `thread_id` by reading the thread from the
    conversations service with the caller's own token (conversations applies its owner rule).

    Args:
        request: the current request (its app holds the conversations client).
        caller: the verified caller; only tokens of kind "client" are checked.
        thread_id: the Codex thread being read.
        not_found: the problem to answer when the thread is not the caller's (default:
            `thread_not_found(thread_id)`); a route about another resource passes its own "unknown
            id" problem so that another owner's resource looks exactly like an unknown one.

    Raises:
        ProblemError: 404 (`not_found`) when conversations answers NOT_FOUND; 503 with Retry-After
            when conversations is unreachable or too slow; otherwise conversations' error mapped as
            every backend error is (403, 502, ...).
    """
    if caller.principal.kind != CLIENT_KIND:
        return
    try:
        await conversations_client(request).call(
            "GetThreadContextBudget",
            conversations_pb.GetThreadContextBudgetRequest(thread_id=thread_id),
            caller.token,
        )
    except ProblemError as problem:
        if problem.status == 404:
            raise (not_found or thread_not_found(thread_id)) from problem
        raise
