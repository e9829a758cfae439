"""gRPC face of the context budget: `boss.context_budget.v1.ContextBudgetService`.

Every RPC verifies the bearer token first (UNAUTHENTICATED when missing, expired, forged or of a
revoked device), then who may call it (docs/architecture.md, "Trust boundaries"):

- ReportThreadContext, StreamThreadContext: worker tokens (scope context:report) whose worker_id and
  node_id equal each snapshot's; the snapshot's owner is the token's. A thread belongs to the device
  that first reported it: another device's snapshot of it is refused (PERMISSION_DENIED, reason
  THREAD_BOUND_TO_OTHER_DEVICE). A different reading under a stored snapshot_id is refused
  (ALREADY_EXISTS naming `snapshot_id`). An open stream of a device its owner revokes ends with
  UNAUTHENTICATED (DEVICE_REVOKED).
- GetThreadContext, ListThreadContexts, ListAlerts: client tokens (scope context:read) see only their
  owner's threads and alerts (another owner's thread is NOT_FOUND, as an unknown one); service tokens
  see all. GetThresholdPolicy: client tokens read the default policy only, service tokens any.
- SetThresholdPolicy, AcknowledgeAlert, ResolveAlert: service tokens (scope context:admin).
- WatchEvents: service tokens (scope events:read); the stream spans every owner.

Ingest acks are sent only after the snapshots' transaction committed (group commit, batcher.py).
Unary errors carry google.rpc.Status details (ErrorInfo, BadRequest field violations). In the stream,
a rejected snapshot gets an ack with `accepted=false` and `error` (INVALID_ARGUMENT with field
violations such as `snapshots[3].captured_at`, PERMISSION_DENIED for another worker's snapshot,
UNAVAILABLE/INTERNAL when its batch could not be stored) and the stream stays open; a message with no
snapshot gets one error ack, a message with more than 1,000 one error ack per snapshot.

Events served by WatchEvents and their JSON payloads are documented in domain/events.py.

When tracing is on, a snapshot's `trace_context` (the worker's report span) goes with it to the
handlers, whose "ingest snapshot" span continues the report's trace (handlers.py, "Traces").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from datetime import datetime

import grpc
from boss.context_budget.v1 import context_budget_pb2 as pb
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc

from boss_common.tracing import tracing_enabled
from services.context_budget.adapters.protobuf import (
    ALERT_STATUSES_BY_NUMBER,
    ack_message,
    alert_message,
    policy_message,
    policy_of,
    rejected_ack,
    snapshot_input_of,
    thread_context_message,
)
from services.context_budget.batcher import IngestBatcher
from services.context_budget.domain.ingest import IngestOutcome
from services.context_budget.domain.model import AlertStatus, Snapshot
from services.context_budget.domain.validation import (
    check_identifier,
    validate_batch_size,
    validate_snapshot,
)
from services.context_budget.handlers import ContextBudgetHandlers
from services.shared.auth import (
    CLIENT,
    SCOPE_CONTEXT_ADMIN,
    SCOPE_CONTEXT_READ,
    SCOPE_CONTEXT_REPORT,
    SCOPE_EVENTS_READ,
    SERVICE,
    WORKER,
    Principal,
    TokenAuthority,
)
from services.shared.errors import (
    BossError,
    FieldViolation,
    InvalidArgument,
    PermissionDenied,
    grpc_status_of,
)
from services.shared.event_stream import watch_events
from services.shared.grpc_server import translate_errors
from services.shared.outbox import EventLog
from services.shared.paging import PageTokenCodec, fingerprint, page_size_of

log = logging.getLogger(__name__)

# Stream messages whose batches may be in flight at once per stream before reading pauses.
MAX_IN_FLIGHT_PER_STREAM = 8
MAX_THREAD_IDS = 1_000


@dataclass
class _PendingMessage:
    """One stream message between validation and its response."""

    batch_id: int
    snapshots: list[pb.ThreadContextSnapshot]
    acks: list[pb.ThreadContextAck | None]
    positions: list[int]
    future: asyncio.Future[list[IngestOutcome]] | None


def _discard_outcome(future: asyncio.Future[list[IngestOutcome]]) -> None:
    """Marks a result nobody will read as retrieved (no 'exception never retrieved' warning)."""
    if not future.cancelled():
        future.exception()


def _carry_trace_context(snapshot: Snapshot, message: pb.ThreadContextSnapshot) -> None:
    """Hands the report's trace context, if it has one, to the handlers (call when tracing is on)."""
    if message.trace_context:
        snapshot.trace_context = dict(message.trace_context)


def _require_id(value: str, field: str) -> None:
    violations: list[FieldViolation] = []
    check_identifier(value, field, violations, required=True)
    if violations:
        raise InvalidArgument(violations)


def _optional_id(value: str, field: str, violations: list[FieldViolation]) -> None:
    check_identifier(value, field, violations, required=False)


class ContextBudgetServicer(pb_grpc.ContextBudgetServiceServicer):
    """Implements ContextBudgetService over the handlers and the ingest batcher."""

    def __init__(
        self,
        handlers: ContextBudgetHandlers,
        batcher: IngestBatcher[Snapshot, IngestOutcome],
        event_log: EventLog,
        authority: TokenAuthority,
        page_tokens: PageTokenCodec,
    ) -> None:
        self._handlers = handlers
        self._batcher = batcher
        self._event_log = event_log
        self._authority = authority
        self._page_tokens = page_tokens
        # StreamThreadContext's request readers, ended by `end_report_streams` when the server stops.
        self._readers: set[asyncio.Task[None]] = set()
        self._draining = False

    def end_report_streams(self) -> None:
        """Ends every open StreamThreadContext as the server begins to stop (ServiceHost's
        on_draining): no further message is read; those read are answered once committed, then
        the stream ends with OK, so workers reconnect at once (to another replica behind a
        Service) and re-send what was not acknowledged, instead of holding the shutdown for its
        whole grace period."""
        self._draining = True
        for reader in list(self._readers):
            reader.cancel()

    # --- ingest ---------------------------------------------------------------------------------

    @translate_errors
    async def ReportThreadContext(
        self, request: pb.ReportThreadContextRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportThreadContextResponse:
        """Validates, authorises and stores one snapshot; answers after commit (CB-10).

        Errors: UNAUTHENTICATED; PERMISSION_DENIED (scope, or worker_id/node_id not the token's);
        INVALID_ARGUMENT with every violation (`snapshot.<field>`); UNAVAILABLE/INTERNAL when the
        transaction failed. Nothing is stored on any error.
        """
        principal = self._reporter(context)
        if not request.HasField("snapshot"):
            raise InvalidArgument([FieldViolation("snapshot", "is required")])
        snapshot = validate_snapshot(
            snapshot_input_of(request.snapshot), now=self._handlers.clock(), prefix="snapshot"
        )
        principal.require_worker(snapshot.worker_id, snapshot.node_id)
        snapshot.owner_id = principal.owner_id
        if tracing_enabled():
            _carry_trace_context(snapshot, request.snapshot)
        (outcome,) = await self._batcher.submit([snapshot])
        if outcome.error is not None:
            raise outcome.error
        return pb.ReportThreadContextResponse(ack=ack_message(outcome))

    def _reporter(self, context: grpc.aio.ServicerContext) -> Principal:
        """The caller of an ingest RPC: a worker token with context:report. Raises Unauthenticated
        or PermissionDenied."""
        return self._authority.authorize_grpc(context, SCOPE_CONTEXT_REPORT, WORKER)

    async def StreamThreadContext(
        self,
        request_iterator: AsyncIterable[pb.StreamThreadContextRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.StreamThreadContextResponse]:
        """One response per request message, in order, each after its snapshots committed.

        Reading continues while earlier messages commit (up to 8 in flight), so one stream can fill
        several group commits. Errors per snapshot (module docstring); the whole stream fails only
        with UNAUTHENTICATED or PERMISSION_DENIED (no context:report scope) at its start.
        """
        try:
            principal = self._reporter(context)
        except BossError as error:
            await context.abort_with_status(grpc_status_of(error))
            return
        responses = self._responses(request_iterator, principal)
        revocations = self._authority.revocations
        if revocations is not None:
            responses = revocations.guard_stream(principal, responses)
        try:
            async for response in responses:
                yield response
        except BossError as error:  # the device was revoked while the stream was open
            await context.abort_with_status(grpc_status_of(error))

    async def _responses(
        self,
        request_iterator: AsyncIterable[pb.StreamThreadContextRequest],
        principal: Principal,
    ) -> AsyncIterator[pb.StreamThreadContextResponse]:
        """StreamThreadContext's responses (see there)."""
        pending: asyncio.Queue[_PendingMessage | None] = asyncio.Queue(maxsize=MAX_IN_FLIGHT_PER_STREAM)
        reader = asyncio.create_task(self._read_stream(request_iterator, principal, pending))
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)
        if self._draining:
            reader.cancel()
        try:
            while True:
                message = await pending.get()
                if message is None:
                    break
                yield await self._respond(message)
            await reader
        finally:
            reader.cancel()
            # The client went away: outcomes of batches still in flight are committed but unread.
            while not pending.empty():
                left = pending.get_nowait()
                if left is not None and left.future is not None:
                    left.future.add_done_callback(_discard_outcome)

    async def _read_stream(
        self,
        request_iterator: AsyncIterable[pb.StreamThreadContextRequest],
        principal: Principal,
        pending: asyncio.Queue[_PendingMessage | None],
    ) -> None:
        try:
            async for request in request_iterator:
                await pending.put(self._accept_message(request, principal))
        except asyncio.CancelledError:
            if self._draining:  # the server stops: answer what was read, then end the stream
                await pending.put(None)
                return
            raise  # the writer side is gone: nobody waits for the end marker
        except BaseException:
            await pending.put(None)
            raise
        await pending.put(None)

    def _accept_message(
        self, request: pb.StreamThreadContextRequest, principal: Principal
    ) -> _PendingMessage:
        """Validates and authorises one message's snapshots and queues the valid ones."""
        snapshots = list(request.snapshots)
        acks: list[pb.ThreadContextAck | None] = [None] * len(snapshots)
        try:
            validate_batch_size(len(snapshots))
        except InvalidArgument as error:
            status = error.to_status()
            if not snapshots:
                return _PendingMessage(request.batch_id, [], [pb.ThreadContextAck(error=status)], [], None)
            rejected = [rejected_ack(message, status) for message in snapshots]
            return _PendingMessage(request.batch_id, snapshots, list(rejected), [], None)
        now = self._handlers.clock()
        tracing = tracing_enabled()
        valid: list[Snapshot] = []
        positions: list[int] = []
        for index, message in enumerate(snapshots):
            try:
                snapshot = validate_snapshot(
                    snapshot_input_of(message), now=now, prefix=f"snapshots[{index}]"
                )
                principal.require_worker(snapshot.worker_id, snapshot.node_id)
            except BossError as error:
                acks[index] = rejected_ack(message, error.to_status())
                continue
            snapshot.owner_id = principal.owner_id
            if tracing:
                _carry_trace_context(snapshot, message)
            valid.append(snapshot)
            positions.append(index)
        future = None
        if valid:
            try:
                future = self._batcher.enqueue(valid)
            except BossError as error:
                status = error.to_status()
                for index in positions:
                    acks[index] = rejected_ack(snapshots[index], status)
                positions = []
        return _PendingMessage(request.batch_id, snapshots, acks, positions, future)

    async def _respond(self, message: _PendingMessage) -> pb.StreamThreadContextResponse:
        acks = message.acks
        if message.future is not None:
            try:
                outcomes = await message.future
            except BossError as error:
                status = error.to_status()
                for index in message.positions:
                    acks[index] = rejected_ack(message.snapshots[index], status)
            else:
                for index, outcome in zip(message.positions, outcomes, strict=True):
                    if outcome.error is not None:
                        acks[index] = rejected_ack(message.snapshots[index], outcome.error.to_status())
                    else:
                        acks[index] = ack_message(outcome)
        complete = [ack for ack in acks if ack is not None]
        assert len(complete) == len(acks), "every snapshot of a message gets an ack"
        return pb.StreamThreadContextResponse(batch_id=message.batch_id, acks=complete)

    # --- reads ----------------------------------------------------------------------------------

    @translate_errors
    async def GetThreadContext(
        self, request: pb.GetThreadContextRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetThreadContextResponse:
        """The thread's current budget. INVALID_ARGUMENT without thread_id; NOT_FOUND when it
        never reported."""
        principal = self._reader(context)
        _require_id(request.thread_id, "thread_id")
        view = await self._handlers.get_thread_context(request.thread_id, principal.owner_scope)
        return pb.GetThreadContextResponse(
            thread_context=thread_context_message(
                view.state, view.open_alerts, self._handlers.compaction_risk_horizon
            )
        )

    @translate_errors
    async def ListThreadContexts(
        self, request: pb.ListThreadContextsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListThreadContextsResponse:
        """Current budgets ordered by thread_id, filtered by project_id and/or thread_ids (at most
        1,000), AIP-158 paging (page_size 0 -> 100, capped at 1,000, negative INVALID_ARGUMENT;
        page_token from a previous answer with the same filters, else INVALID_ARGUMENT). Client
        tokens see only their owner's threads."""
        principal = self._reader(context)
        violations: list[FieldViolation] = []
        _optional_id(request.project_id, "project_id", violations)
        thread_ids = sorted(set(request.thread_ids))
        if len(request.thread_ids) > MAX_THREAD_IDS:
            violations.append(FieldViolation("thread_ids", f"must hold at most {MAX_THREAD_IDS} ids"))
        else:
            for index, thread_id in enumerate(request.thread_ids):
                check_identifier(thread_id, f"thread_ids[{index}]", violations, required=True)
        if request.page_size < 0:
            violations.append(FieldViolation("page_size", "must not be negative"))
        if violations:
            raise InvalidArgument(violations)
        limit = page_size_of(request.page_size)
        filters = fingerprint("threads", request.project_id, thread_ids)
        after = None
        if request.page_token:
            (after,) = self._cursor(request.page_token, filters, size=1)
        views = await self._handlers.list_thread_contexts(
            project_id=request.project_id,
            thread_ids=thread_ids,
            after_thread_id=after,
            limit=limit + 1,
            owner_id=principal.owner_scope,
        )
        next_token = ""
        if len(views) > limit:
            views = views[:limit]
            next_token = self._page_tokens.encode([views[-1].state.snapshot.thread_id], filters)
        return pb.ListThreadContextsResponse(
            thread_contexts=[
                thread_context_message(view.state, view.open_alerts, self._handlers.compaction_risk_horizon)
                for view in views
            ],
            next_page_token=next_token,
        )

    def _reader(self, context: grpc.aio.ServicerContext) -> Principal:
        """The caller of a read: a client or service token with context:read. Raises
        Unauthenticated or PermissionDenied."""
        return self._authority.authorize_grpc(context, SCOPE_CONTEXT_READ, CLIENT, SERVICE)

    def _admin(self, context: grpc.aio.ServicerContext) -> Principal:
        """The caller of a change to policies or alerts: a service token with context:admin."""
        return self._authority.authorize_grpc(context, SCOPE_CONTEXT_ADMIN, SERVICE)

    def _cursor(self, token: str, filters: str, size: int) -> list[str]:
        cursor = self._page_tokens.decode(token, filters)
        if len(cursor) != size:
            raise InvalidArgument([FieldViolation("page_token", "is malformed")])
        return cursor

    # --- policies -------------------------------------------------------------------------------

    @translate_errors
    async def GetThresholdPolicy(
        self, request: pb.GetThresholdPolicyRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetThresholdPolicyResponse:
        """The policy in force for project_id ("" = the default), and whether it is an override.
        Client tokens read the default policy only (PERMISSION_DENIED, reason
        SERVICE_TOKEN_REQUIRED, for a project_id): policies are the operator's."""
        principal = self._reader(context)
        violations: list[FieldViolation] = []
        _optional_id(request.project_id, "project_id", violations)
        if violations:
            raise InvalidArgument(violations)
        if request.project_id and principal.kind != SERVICE:
            raise PermissionDenied(
                "a project's threshold policy is read with a service token; client tokens read the "
                "default policy (project_id empty)",
                reason="SERVICE_TOKEN_REQUIRED",
            )
        policy, override = await self._handlers.get_threshold_policy(request.project_id)
        return pb.GetThresholdPolicyResponse(policy=policy_message(policy), project_override=override)

    @translate_errors
    async def SetThresholdPolicy(
        self, request: pb.SetThresholdPolicyRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetThresholdPolicyResponse:
        """Stores a project's override, or the default with an empty project_id (context:admin).
        INVALID_ARGUMENT (`policy.<field>`) unless 0 < urgent < watch < safe <= 100."""
        self._admin(context)
        if not request.HasField("policy"):
            raise InvalidArgument([FieldViolation("policy", "is required")])
        violations: list[FieldViolation] = []
        _optional_id(request.policy.project_id, "policy.project_id", violations)
        if violations:
            raise InvalidArgument(violations)
        stored = await self._handlers.set_threshold_policy(policy_of(request.policy))
        return pb.SetThresholdPolicyResponse(policy=policy_message(stored))

    # --- alerts ---------------------------------------------------------------------------------

    @translate_errors
    async def ListAlerts(
        self, request: pb.ListAlertsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListAlertsResponse:
        """Alerts newest first, filtered by thread_id, project_id and alert_statuses (AIP-158 paging).
        Client tokens see only alerts of their owner's threads."""
        principal = self._reader(context)
        violations: list[FieldViolation] = []
        _optional_id(request.thread_id, "thread_id", violations)
        _optional_id(request.project_id, "project_id", violations)
        statuses: set[AlertStatus] = set()
        for index, number in enumerate(request.alert_statuses):
            status = ALERT_STATUSES_BY_NUMBER.get(number)
            if status is None:
                violations.append(
                    FieldViolation(
                        f"alert_statuses[{index}]", f"unknown or unspecified alert status {number}"
                    )
                )
            else:
                statuses.add(status)
        if request.page_size < 0:
            violations.append(FieldViolation("page_size", "must not be negative"))
        if violations:
            raise InvalidArgument(violations)
        limit = page_size_of(request.page_size)
        filters = fingerprint(
            "alerts", request.thread_id, request.project_id, sorted(status.value for status in statuses)
        )
        after = None
        if request.page_token:
            opened_at_text, alert_id = self._cursor(request.page_token, filters, size=2)
            try:
                after = (datetime.fromisoformat(opened_at_text), alert_id)
            except ValueError as error:
                raise InvalidArgument([FieldViolation("page_token", "is malformed")]) from error
        alerts = await self._handlers.list_alerts(
            thread_id=request.thread_id,
            project_id=request.project_id,
            statuses=sorted(statuses),
            after=after,
            limit=limit + 1,
            owner_id=principal.owner_scope,
        )
        next_token = ""
        if len(alerts) > limit:
            alerts = alerts[:limit]
            last = alerts[-1]
            next_token = self._page_tokens.encode([last.opened_at.isoformat(), last.alert_id], filters)
        return pb.ListAlertsResponse(
            alerts=[alert_message(alert) for alert in alerts], next_page_token=next_token
        )

    @translate_errors
    async def AcknowledgeAlert(
        self, request: pb.AcknowledgeAlertRequest, context: grpc.aio.ServicerContext
    ) -> pb.AcknowledgeAlertResponse:
        """opened -> acked (service tokens, context:admin). NOT_FOUND; FAILED_PRECONDITION from
        another status."""
        self._admin(context)
        _require_id(request.alert_id, "alert_id")
        alert = await self._handlers.acknowledge_alert(request.alert_id)
        return pb.AcknowledgeAlertResponse(alert=alert_message(alert))

    @translate_errors
    async def ResolveAlert(
        self, request: pb.ResolveAlertRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResolveAlertResponse:
        """opened|acked -> resolved (service tokens, context:admin). NOT_FOUND; FAILED_PRECONDITION
        when resolved."""
        self._admin(context)
        _require_id(request.alert_id, "alert_id")
        alert = await self._handlers.resolve_alert(request.alert_id)
        return pb.ResolveAlertResponse(alert=alert_message(alert))

    # --- events ---------------------------------------------------------------------------------

    async def WatchEvents(
        self, request: pb.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WatchEventsResponse]:
        """Committed events with sequence > after_sequence, then live ones (events:read), in runs
        of up to 500 per response. Resuming with the last sequence processed loses and repeats
        nothing. Service tokens only: the stream spans every owner."""
        try:
            self._authority.authorize_grpc(context, SCOPE_EVENTS_READ, SERVICE)
            # after_sequence in range, and retention
            await self._event_log.admit(request.after_sequence, request.consumer, request.types)
        except BossError as error:
            await context.abort_with_status(grpc_status_of(error))
            return
        async for envelopes in watch_events(self._event_log, request.after_sequence, list(request.types)):
            yield pb.WatchEventsResponse(events=envelopes)
