"""`GET /api/v1/events`: the conversations event stream as Server-Sent Events (SPEC CB-15).

Each SSE event is one committed event of the conversations context: `event:` its type, `id:` its
sequence, `data:` its JSON payload plus `sequence` and `occurred_at`. Resume (WHATWG HTML §9.2.4):
a client that reconnects with `Last-Event-ID: n` (or `?last_event_id=n` on its first connect) gets
exactly the events after n, nothing missed, nothing repeated. Rules:

- Chat events carry the REST shapes, converted by the same functions as the REST answers
  (chat/mapping.py): `conversation.message.created` has `message` as `GET
  /api/v1/projects/{id}/messages` answers it (MessageView, with the message's own `sequence` in its
  conversation); `task.updated` has `task` and `collaborationGate` as `GET /api/v1/tasks/{id}`
  answers them. `task.requested` (the scheduler's: it carries the instruction text) is never sent;
  the ids of the events around it are unchanged, so a resume across it misses nothing else.

- Auth: `Authorization: Bearer` or `?access_token=` (EventSource cannot set headers); the token
  needs "events:read". A client sees only its own owner's events.
- A Last-Event-ID that is not a non-negative integer in ASCII digits is 400 problem+json. A
  resume (a Last-Event-ID) while conversations cannot be reached is 503 with Retry-After before
  the stream starts, never a 200 stream that is cut at once. One beyond the stream's
  head (e.g. after the database was reset) gets a `stream.resync` event (`reason`
  "last_event_id_unknown"), and so does one whose following events retention has pruned (`reason`
  "history_pruned": the client was away longer than the outbox keeps events,
  services/shared/retention.py): refetch everything, then continue from the `id` it carries.
  Never a silent gap.
- A fresh connect starts with a `stream.opened` event whose id is the current head, so the browser
  has a resume point even before the first real event.
- Heartbeat: a `: ping` comment every 15 s (proxies drop idle connections; WHATWG §9.2.7).
- Headers: `Cache-Control: no-cache`, `X-Accel-Buffering: no` (nginx), no compression.
- A client that stops reading is disconnected once 1,000 events wait for it; it resumes with its
  Last-Event-ID like any reconnect.
- The token is verified at connect, and the stream ends when it expires: the reconnect needs a
  valid token (an expired one is a 401), so a leaked token does not follow events for ever.

Fan-out: one `EventHub` per gateway process follows the conversations `WatchEvents` stream with a
service token and hands every event to the matching subscribers' queues, so 1,000 SSE clients cost
one upstream stream, not 1,000. Backlog for a resuming client is read with `ListEvents` under the
client's own token.

Traces (when tracing is on, boss_common/tracing.py): handing a live event to a client is a short
"deliver sse event" span (until the server took the frame) linked to the trace context the event
carries, the span of conversations' batch that published it (services/shared/event_stream.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import grpc
from boss.common.v1 import events_pb2
from boss.conversations.v1 import conversations_pb2 as pb
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from google.protobuf import json_format
from opentelemetry import trace
from opentelemetry.context import Context

from boss_common.reconnection import Reconnection
from boss_common.tracing import link_to, tracing_enabled
from services.bff_gateway.chat.mapping import INTERNAL_EVENT_TYPES, client_event_data
from services.bff_gateway.problems import (
    ProblemError,
    error_responses,
    invalid_request,
    problem_for_boss_error,
    unauthenticated,
)
from services.shared.auth import SCOPE_EVENTS_READ, Principal, TokenAuthority, bearer_metadata
from services.shared.errors import BossError
from services.shared.retention import EVENTS_PRUNED
from services.shared.time import from_timestamp, isoformat_utc

log = logging.getLogger(__name__)

router = APIRouter(tags=["events"])

HEARTBEAT_SECONDS = 15.0
QUEUE_LIMIT = 1_000
RETRY_MILLISECONDS = 2_000
BACKFILL_PAGE = 1_000
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class HubEvent:
    """One event as the hub hands it out: sequence, type, owner, whether SSE clients may get it,
    and the ready-to-send SSE frame.

    The frame is built on first use and then shared by every subscriber, so an event no connected
    client may see (another owner's, or an internal one) costs only the payload parse that finds
    its owner.
    """

    __slots__ = ("_envelope", "_frame", "_payload", "for_clients", "owner_id", "sequence", "type")

    def __init__(self, envelope: events_pb2.EventEnvelope, payload: dict[str, Any]) -> None:
        self._envelope = envelope
        self._payload = payload
        self._frame: bytes | None = None
        self.sequence = int(envelope.sequence)
        self.type = envelope.type
        self.owner_id = str(payload.get("owner_id") or "")
        self.for_clients = self.type not in INTERNAL_EVENT_TYPES

    @property
    def frame(self) -> bytes:
        """The SSE frame: the client data of the payload (client_event_data) plus `sequence` and
        `occurred_at`. A chat payload the gateway cannot convert is logged and sent as it is,
        never dropped (the client would miss it for good)."""
        if self._frame is None:
            try:
                converted = client_event_data(self.type, self._payload)
            except (ValueError, json_format.ParseError):  # pydantic's ValidationError is a ValueError
                log.exception(
                    "event %d (%s) has a payload the gateway cannot convert", self.sequence, self.type
                )
                converted = None
            data = {
                **(converted if converted is not None else self._payload),
                "sequence": self.sequence,
                "occurred_at": isoformat_utc(from_timestamp(self._envelope.occurred_at)),
            }
            self._frame = sse_frame(self.sequence, self.type, data)
        return self._frame

    def delivery_span(self) -> trace.Span:
        """A started "deliver sse event" span linked to the event's trace context (tracing on): a
        trace of its own, never a child of the hours-long request of the SSE connection."""
        link = link_to(self._envelope.trace_context)
        return trace.get_tracer(__name__).start_span(
            "deliver sse event",
            context=Context(),
            links=[link] if link is not None else [],
            attributes={"event_type": self.type, "sequence": self.sequence},
        )


def sse_frame(sequence: int, event_type: str, data: dict[str, Any]) -> bytes:
    """One SSE event: `id`, `event`, one `data` line of compact JSON, blank line."""
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"id: {sequence}\nevent: {event_type}\ndata: {body}\n\n".encode()


def hub_event(envelope: events_pb2.EventEnvelope) -> HubEvent:
    """The hub's form of an envelope; the SSE data is the payload plus `sequence`, `occurred_at`."""
    payload = json.loads(envelope.payload_json or "{}")
    if not isinstance(payload, dict):
        payload = {}
    return HubEvent(envelope, payload)


@dataclass(eq=False)
class Subscriber:
    """One SSE client: its owner (None: every owner, for service tokens) and its queue."""

    owner_id: str | None
    # None in the queue: the gateway is shutting down, end the stream.
    queue: asyncio.Queue[HubEvent | None] = field(default_factory=lambda: asyncio.Queue(QUEUE_LIMIT))
    overflowed: bool = False

    def close(self) -> None:
        """Ends the client's stream once it has sent what is queued (the client resumes elsewhere
        with Last-Event-ID)."""
        try:
            self.queue.put_nowait(None)
        except asyncio.QueueFull:
            self.overflowed = True

    def offer(self, event: HubEvent) -> None:
        """Queues the event if it is this client's; marks the client overflowed when its queue is full."""
        if self.overflowed or (self.owner_id is not None and event.owner_id != self.owner_id):
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.overflowed = True


HUB_MAX_RECONNECT_SECONDS = 0.33
"""Most seconds the hub waits before trying conversations' stream again (jitter adds up to half)."""


class EventHub:
    """Follows the conversations stream once per process and fans it out to SSE subscribers.

    `position` is the sequence up to which every event has been handed to every subscriber; a
    subscriber registered at position p receives every event after p. Subscribers are kept by
    owner, so an event reaches only its owner's clients and the service-token ones (owner None)
    without a look at anyone else's: the cost of an event does not grow with other owners' clients.
    """

    def __init__(self, client: Any, authority: TokenAuthority) -> None:
        self._client = client
        self._authority = authority
        self._subscribers: dict[str | None, set[Subscriber]] = {}
        self._task: asyncio.Task[None] | None = None
        self._started = asyncio.Event()
        self.position = 0

    @property
    def subscriber_count(self) -> int:
        """Connected SSE clients."""
        return sum(len(group) for group in self._subscribers.values())

    async def ensure_started(self) -> None:
        """Starts following (in the running loop) and waits until the starting head is known.
        Raises ProblemError (503) when conversations cannot be reached."""
        if self._task is None or self._task.done():
            self._started = asyncio.Event()
            head = await self._head()
            self.position = head
            self._task = asyncio.create_task(self._follow(), name="sse-event-hub")
            self._started.set()
        await self._started.wait()

    async def _head(self) -> int:
        response = await self._client.call(
            "ListEvents", pb.ListEventsRequest(after_sequence=0, page_size=1), self._service_token()
        )
        return int(response.head_sequence)

    def _service_token(self) -> str:
        """A fresh service token for each connect: the stream ends when its token expires, and a
        gateway runs for longer than any one token lives."""
        return self._authority.issue_service("bff_gateway")

    def subscribe(self, owner_id: str | None) -> tuple[Subscriber, int]:
        """Registers a subscriber; returns it and the position after which its queue is complete."""
        subscriber = Subscriber(owner_id)
        self._subscribers.setdefault(owner_id, set()).add(subscriber)
        return subscriber, self.position

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Forgets a subscriber (idempotent)."""
        group = self._subscribers.get(subscriber.owner_id)
        if group is not None:
            group.discard(subscriber)
            if not group:
                del self._subscribers[subscriber.owner_id]

    def close_subscribers(self) -> None:
        """Ends every open stream (at shutdown: an endless response would otherwise hold the
        server's graceful shutdown until its timeout, and be cancelled)."""
        for group in self._subscribers.values():
            for subscriber in group:
                subscriber.close()

    def publish(self, event: HubEvent) -> None:
        """Hands an event to every subscriber that may see it (none for an internal event) and
        advances the position."""
        if event.sequence <= self.position:
            return
        if event.for_clients:
            for owner in (event.owner_id, None):
                for subscriber in list(self._subscribers.get(owner, ())):
                    subscriber.offer(event)
        self.position = event.sequence

    async def _follow(self) -> None:
        # At most half a second between attempts: SSE clients wait on this stream, so it must be
        # back within a second of conversations (the channel's own back-off is capped as well).
        reconnection = Reconnection(max_delay=HUB_MAX_RECONNECT_SECONDS)
        while True:
            reconnection.attempt_started()
            try:
                call = self._client.stub().WatchEvents(
                    pb.WatchEventsRequest(after_sequence=self.position),
                    metadata=bearer_metadata(self._service_token()),
                )
                async for response in call:
                    reconnection.delivered()
                    for envelope in response.events:
                        self.publish(hub_event(envelope))
                delay = reconnection.ended(log, "conversations event stream", "closed by the server")
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as error:
                delay = reconnection.ended(log, "conversations event stream", error.code())
                if error.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    # EVENTS_PRUNED: the hub was cut off for longer than conversations keeps events.
                    # Its clients reconnect and resync (their Last-Event-ID is pruned too); the hub
                    # starts again from the head.
                    log.warning(
                        "conversations no longer keeps events after %d: resyncing clients", self.position
                    )
                    self.close_subscribers()
                    with contextlib.suppress(ProblemError):
                        self.position = await self._head()
            except Exception:
                delay = reconnection.next_delay()
                log.exception("conversations event stream failed; retrying in %.1f s", delay)
            await asyncio.sleep(delay)

    async def stop(self) -> None:
        """Stops following."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None


def _verify(request: Request, authorization: str | None, access_token: str | None) -> tuple[Principal, str]:
    authority: TokenAuthority = request.app.state.gateway.authority
    token = ""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer":
            token = value.strip()
    token = token or (access_token or "")
    scheme = (authorization or "").strip().partition(" ")[0]
    if not token and scheme and scheme.lower() != "bearer":
        raise unauthenticated(
            f"unsupported authorization scheme {scheme!r}: send 'Authorization: Bearer <token>'",
            token_sent=True,
            reason="TOKEN_SCHEME_UNSUPPORTED",
        )
    if not token:
        raise unauthenticated(
            "missing token: send 'Authorization: Bearer <token>' or ?access_token=",
            token_sent=False,
            reason="TOKEN_MISSING",
        )
    try:
        principal = authority.verify(token)
        principal.require(SCOPE_EVENTS_READ)
    except BossError as error:
        raise problem_for_boss_error(error) from error
    return principal, token


def _parse_last_event_id(header: str | None, query: str | None) -> int | None:
    raw = header if header not in (None, "") else query
    if raw in (None, ""):
        return None
    text = str(raw).strip()
    # ASCII digits only: str.isdigit() also accepts other scripts' digits and superscripts, which
    # int() then turns into a number or refuses (a 500).
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        field_name = "Last-Event-ID" if header not in (None, "") else "last_event_id"
        raise invalid_request(
            field_name, f"must be a non-negative integer event id, got {raw!r}", reason="BAD_LAST_EVENT_ID"
        )
    return int(text)


def resync_frame(sequence: int, reason: str, last_event_id: int, head: int) -> bytes:
    """A `stream.resync` event: the client refetches everything and continues after `sequence`."""
    return sse_frame(
        sequence, "stream.resync", {"reason": reason, "last_event_id": last_event_id, "head_sequence": head}
    )


async def _backfill(
    client: Any, token: str, after: int, until: int, first_page: Any = None
) -> AsyncIterator[bytes]:
    """Frames of the caller's events in (after, until], read page by page with the caller's token;
    one chunk of frames per page. (Frame by frame, a replay to a client that has gone wrote hundreds
    of times into the closed socket before the event loop could notice the disconnect, each write
    logging a warning.) When events after `after` are no longer kept (EVENTS_PRUNED), the one frame
    is a `stream.resync` to `until` instead. `first_page`: the page after `after`, read already."""
    cursor = after
    while cursor < until:
        try:
            page = first_page or await client.call(
                "ListEvents", pb.ListEventsRequest(after_sequence=cursor, page_size=BACKFILL_PAGE), token
            )
        except ProblemError as error:
            if error.reason != EVENTS_PRUNED:
                raise
            yield resync_frame(until, "history_pruned", after, until)
            return
        first_page = None
        events = [hub_event(envelope) for envelope in page.events if envelope.sequence <= until]
        frames = [event.frame for event in events if event.for_clients]
        if frames:
            yield b"".join(frames)
        if len(events) < len(page.events) or page.scanned_through_sequence <= cursor:
            return
        cursor = int(page.scanned_through_sequence)


@router.get(
    "/api/v1/events",
    summary="Live events (Server-Sent Events), resumable with Last-Event-ID",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "description": "An endless text/event-stream.",
        },
        **error_responses(400, 401, 403, 503),
    },
)
async def stream_events(
    request: Request,
    last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    last_event_id: Annotated[str | None, Query(description="Resume point for a first connect.")] = None,
    access_token: Annotated[
        str | None, Query(description="The bearer token (EventSource cannot send headers).")
    ] = None,
    authorization: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    """Event types: conversation.context_indicator.updated, project.context_risk.updated,
    thread.handoff.required, thread.handoff.ready (CB-15), conversation.updated,
    conversation.message.created (`message`: a MessageView), task.updated (`task`: a ChatTaskView,
    and `collaborationGate`), thread.registered, plus stream.opened and stream.resync; never
    task.requested. See the module docstring for resume, heartbeat and error rules."""
    principal, token = _verify(request, authorization, access_token)
    resume_from = _parse_last_event_id(last_event_id_header, last_event_id)
    hub: EventHub = request.app.state.event_hub
    client = request.app.state.conversations
    await hub.ensure_started()
    owner = principal.owner_id if principal.kind == "client" else None
    subscriber, position = hub.subscribe(owner)
    head = position
    first_page = None
    if resume_from is not None:
        # Asked before the 200: a resume while conversations is down is a clean 503 (Retry-After),
        # not a stream that starts and is cut.
        try:
            first_page = await client.call(
                "ListEvents",
                pb.ListEventsRequest(after_sequence=min(resume_from, position), page_size=BACKFILL_PAGE),
                token,
            )
        except ProblemError as error:
            if error.reason != EVENTS_PRUNED:
                hub.unsubscribe(subscriber)
                raise
        else:
            head = max(position, int(first_page.head_sequence))
    heartbeat = float(getattr(request.app.state, "sse_heartbeat_seconds", HEARTBEAT_SECONDS))

    async def frames() -> AsyncIterator[bytes]:
        try:
            yield f"retry: {RETRY_MILLISECONDS}\n\n".encode()
            cursor = position
            if resume_from is None:
                yield sse_frame(position, "stream.opened", {"head_sequence": position})
            elif resume_from > head:
                yield resync_frame(max(head, position), "last_event_id_unknown", resume_from, head)
                cursor = max(head, position)
            elif resume_from < position:
                async for frame in _backfill(client, token, resume_from, position, first_page):
                    yield frame
            else:
                cursor = resume_from
            while True:
                if subscriber.overflowed:
                    log.warning("SSE client fell %d events behind; closing so it resumes", QUEUE_LIMIT)
                    return
                # The token was verified once, at connect: the stream ends when it expires, and the
                # client reconnects with a fresh one (its Last-Event-ID loses nothing).
                left = principal.seconds_until_expiry()
                if left <= 0:
                    log.info("SSE stream ended: its token expired")
                    return
                try:
                    async with asyncio.timeout(min(heartbeat, left)):
                        event = await subscriber.queue.get()
                except TimeoutError:
                    if principal.seconds_until_expiry() > 0:
                        yield b": ping\n\n"
                    continue
                if event is None:
                    return
                if event.sequence > cursor:
                    cursor = event.sequence
                    if not tracing_enabled():
                        yield event.frame
                        continue
                    span = event.delivery_span()
                    try:
                        yield event.frame
                    finally:
                        span.end()
        finally:
            hub.unsubscribe(subscriber)

    return StreamingResponse(frames(), media_type="text/event-stream; charset=utf-8", headers=SSE_HEADERS)
