"""Conversation endpoints (SPEC CB-12..CB-14, CB-16) over the conversations service, and the wiring
of the conversations features into a gateway app (`install`: these routes, the chat routes, the SSE
stream and the web console).

| method and path | what |
|---|---|
| GET /api/v1/conversations | the home list, pinned first then latest reply (AIP-158 paging) |
| GET /api/v1/projects/{project_id} | the project detail with every thread's budget (CB-13) |
| POST /api/v1/projects | create a group project from threads |
| PATCH /api/v1/projects/{project_id} | rename (`project_title`) |
| PUT / DELETE /api/v1/projects/{project_id}/pin | pin / unpin (`manual_pinned`) |
| GET /api/v1/threads/{thread_id}/context-summary | the thread page from the projection (CB-14) |
| POST /api/v1/threads/{thread_id}/archive | archive a thread |

The caller's token is forwarded, so the conversations service applies its owner rule: another
owner's project or thread is 404, never shown. `project_id` "master-agent" names the caller's
master agent conversation.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path as FilePath
from typing import Annotated, Any, Literal

import grpc
from boss.conversations.v1 import conversations_pb2 as pb
from boss.conversations.v1 import conversations_pb2_grpc as pb_grpc
from fastapi import APIRouter, FastAPI, Path, Query, Request, Response
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles
from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from services.bff_gateway.auth import CallerDep
from services.bff_gateway.chat.mapping import dispatch_plan_view, gate_view
from services.bff_gateway.chat.schemas import CollaborationGateView, DispatchPlanView
from services.bff_gateway.clients import ChannelSlot, health_status
from services.bff_gateway.mapping import projection_checklist_item
from services.bff_gateway.problems import ProblemError, error_responses, problem_for_rpc_error
from services.bff_gateway.request_body import json_body_openapi, read_json_body
from services.bff_gateway.schemas import ChecklistItemView
from services.bff_gateway.state import GatewayDep
from services.shared import config
from services.shared.auth import SCOPE_CONVERSATIONS_READ, SCOPE_CONVERSATIONS_WRITE, bearer_metadata
from services.shared.identifiers import control_character_problem
from services.shared.time import from_timestamp

CONVERSATIONS_SERVICE = pb.DESCRIPTOR.services_by_name["ConversationsService"].full_name

ID_MAX_LENGTH = 200
CONSOLE_DIR = FilePath(__file__).resolve().parent.parent / "console"

router = APIRouter(tags=["conversations"])

ConversationTypeName = Literal["master_agent", "single_device", "group"]
LevelName = Literal["safe", "watch", "urgent", "critical", ""]
HandoffStatusName = Literal["none", "required", "ready"]
CompactionLimitSourceName = Literal["configured", "model_default", "assumed"]

_TYPE_NAMES: dict[int, ConversationTypeName] = {
    pb.CONVERSATION_TYPE_MASTER_AGENT: "master_agent",
    pb.CONVERSATION_TYPE_SINGLE_DEVICE: "single_device",
    pb.CONVERSATION_TYPE_GROUP: "group",
}


# --- JSON shapes -----------------------------------------------------------------------------------


class ContextBudgetIndicatorView(BaseModel):
    """The home-list ring (CB-12, CB-16): a neutral grey ring plus percent; hidden for groups."""

    visible: bool
    style: Literal["ring_percent"] = "ring_percent"
    percent: int = Field(ge=0, le=100, description="Whole percent of usable context left (rounded down).")
    level: LevelName = Field(description="safe | watch | urgent | critical; empty when not visible.")
    awaiting_reading_after_compaction: bool = Field(
        default=False,
        description=(
            "Codex compacted the shown thread after its last reading and has not answered since: "
            "'compacted, waiting for the first reading'. The percent (100) is then a placeholder, not "
            "a measurement: show 'compacted' instead until the next real reading sets this false."
        ),
    )


class ConversationView(BaseModel):
    """One home-list row (CB-12; seed §6.1 example)."""

    conversation_id: str
    project_id: str
    conversation_type: ConversationTypeName
    project_title: str
    manual_pinned: bool
    latest_reply_at: datetime | None = Field(description="UTC; null before the first message.")
    context_budget_indicator: ContextBudgetIndicatorView
    context_budget_source_node_id: str = Field(
        description="Node that reported the shown budget; empty if hidden."
    )
    context_budget_updated_at: datetime | None
    must_finish_before_compaction: bool
    context_budget_thread_id: str = Field(description="Thread whose budget the ring shows; empty if hidden.")


class ConversationPage(BaseModel):
    """A page of the home list."""

    conversations: list[ConversationView]
    next_page_token: str = Field(description="Pass as page_token for the next page; empty at the end.")


class ThreadContextSummaryView(BaseModel):
    """One thread's budget, the same figures on the home list, project detail and thread page."""

    thread_id: str
    title: str
    node_id: str
    worker_id: str
    reported: bool = Field(description="False until the thread's first budget report.")
    percent: int = Field(ge=0, le=100)
    remaining_pct: float = Field(ge=0, le=100, description="The exact percent as reported.")
    level: LevelName
    must_finish_before_compaction: bool
    must_finish_reason: str
    compaction_expected_at: datetime | None
    last_compaction_at: datetime | None
    compaction_count: int = Field(ge=0)
    awaiting_reading_after_compaction: bool = Field(
        default=False,
        description=(
            "Codex compacted the thread after its last reading: 'compacted, waiting for the first "
            "reading' (the percent is then 100, not a measurement)."
        ),
    )
    compaction_limit_source: CompactionLimitSourceName | None = Field(
        default=None, description="Where the auto-compact limit came from; null when not reported."
    )
    updated_at: datetime | None
    handoff_status: HandoffStatusName


class ProjectDetailView(ConversationView):
    """The project detail (CB-13): the conversation row plus every active thread's budget."""

    active_thread_contexts: list[ThreadContextSummaryView]
    next_compaction_risk_thread_id: str
    threads_requiring_handoff: list[str]
    master_context_strategy_summary: str
    pending_dispatch_plan: DispatchPlanView | None = Field(
        default=None,
        description="Groups: the dispatch plan waiting for confirmation (the resource of "
        "GET /api/v1/dispatch-plans/{planId}, camelCase), so a client returns to "
        "pending_dispatch_plan after a reconnect or restart; null when none waits.",
    )
    collaboration_gate: CollaborationGateView | None = Field(
        default=None, description="Groups: where the group stands (camelCase, as on the chat routes)."
    )
    executing_dispatch_plans: list[DispatchPlanView] = Field(
        default_factory=list,
        description="Groups: the confirmed dispatch plans whose summary is not posted yet (camelCase, "
        "newest first), each target with its task's status, so any client shows their progress "
        '"k of N done" after a reload or in another tab; empty otherwise.',
    )


class ThreadPageView(BaseModel):
    """The thread page (CB-14) from the conversations projection."""

    thread_id: str
    title: str
    node_id: str
    worker_id: str
    codex_folder: str
    codex_thread_ref: str
    context: ThreadContextSummaryView
    wrap_up_checklist: list[ChecklistItemView] = Field(
        description=(
            "The wrap-up checklist in force (CB-18), `{key, label, status, detail}` as on "
            "/context-budget; empty while nothing needs wrapping up."
        )
    )
    handoff_status: HandoffStatusName
    handoff_package_id: str
    handoff_reason: str
    project_ids: list[str]
    archived: bool


def _title_characters(title: str) -> str:
    """Refuses a title holding a control or bidirectional formatting character, as conversations
    does (services/shared/identifiers.py), so the 422 names the body's own field."""
    if (problem := control_character_problem(title)) is not None:
        raise ValueError(problem)
    return title


ProjectTitle = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_title_characters)]


class CreateGroupBody(BaseModel):
    """A new group project from at least two of the caller's threads."""

    model_config = ConfigDict(extra="forbid")
    project_title: ProjectTitle
    thread_ids: list[Annotated[str, Field(min_length=1, max_length=ID_MAX_LENGTH)]] = Field(
        min_length=2, max_length=100
    )


class RenameBody(BaseModel):
    """A new title."""

    model_config = ConfigDict(extra="forbid")
    project_title: ProjectTitle


# --- proto -> JSON ---------------------------------------------------------------------------------


def _instant(message: Any, field: str) -> datetime | None:
    if not message.HasField(field):
        return None
    stamp: Timestamp = getattr(message, field)
    return from_timestamp(stamp)


def conversation_view(row: pb.Conversation) -> dict[str, Any]:
    """The JSON fields of a home-list row."""
    indicator = row.context_budget_indicator
    return {
        "conversation_id": row.conversation_id,
        "project_id": row.project_id,
        "conversation_type": _TYPE_NAMES.get(row.conversation_type, "single_device"),
        "project_title": row.project_title,
        "manual_pinned": row.manual_pinned,
        "latest_reply_at": _instant(row, "latest_reply_at"),
        "context_budget_indicator": ContextBudgetIndicatorView(
            visible=indicator.visible,
            percent=indicator.percent,
            level=indicator.level,  # type: ignore[arg-type]
            awaiting_reading_after_compaction=indicator.awaiting_reading_after_compaction,
        ),
        "context_budget_source_node_id": row.context_budget_source_node_id,
        "context_budget_updated_at": _instant(row, "context_budget_updated_at"),
        "must_finish_before_compaction": row.must_finish_before_compaction,
        "context_budget_thread_id": row.context_budget_thread_id,
    }


def summary_view(summary: pb.ThreadContextSummary) -> ThreadContextSummaryView:
    """A thread's budget summary."""
    return ThreadContextSummaryView(
        thread_id=summary.thread_id,
        title=summary.title,
        node_id=summary.node_id,
        worker_id=summary.worker_id,
        reported=summary.reported,
        percent=summary.percent,
        remaining_pct=summary.remaining_pct,
        level=summary.level,  # type: ignore[arg-type]
        must_finish_before_compaction=summary.must_finish_before_compaction,
        must_finish_reason=summary.must_finish_reason,
        compaction_expected_at=_instant(summary, "compaction_expected_at"),
        last_compaction_at=_instant(summary, "last_compaction_at"),
        compaction_count=summary.compaction_count,
        awaiting_reading_after_compaction=summary.awaiting_reading_after_compaction,
        compaction_limit_source=summary.compaction_limit_source or None,  # type: ignore[arg-type]
        updated_at=_instant(summary, "updated_at"),
        handoff_status=summary.handoff_status or "none",  # type: ignore[arg-type]
    )


def detail_view(detail: pb.ProjectDetail) -> ProjectDetailView:
    """The project detail."""
    return ProjectDetailView(
        **conversation_view(detail.conversation),
        active_thread_contexts=[summary_view(s) for s in detail.active_thread_contexts],
        next_compaction_risk_thread_id=detail.next_compaction_risk_thread_id,
        threads_requiring_handoff=list(detail.threads_requiring_handoff),
        master_context_strategy_summary=detail.master_context_strategy_summary,
        pending_dispatch_plan=dispatch_plan_view(detail.pending_dispatch_plan)
        if detail.HasField("pending_dispatch_plan")
        else None,
        collaboration_gate=gate_view(detail.collaboration_gate)
        if detail.HasField("collaboration_gate")
        else None,
        executing_dispatch_plans=[dispatch_plan_view(plan) for plan in detail.executing_dispatch_plans],
    )


def thread_page_view(page: pb.ThreadContextBudget) -> ThreadPageView:
    """The thread page."""
    return ThreadPageView(
        thread_id=page.thread.thread_id,
        title=page.thread.title,
        node_id=page.thread.node_id,
        worker_id=page.thread.worker_id,
        codex_folder=page.thread.codex_folder,
        codex_thread_ref=page.thread.codex_thread_ref,
        context=summary_view(page.context),
        wrap_up_checklist=[
            ChecklistItemView(
                **projection_checklist_item(i.key, i.label, i.done, page.handoff_status, i.detail)
            )
            for i in page.wrap_up_checklist
        ],
        handoff_status=page.handoff_status or "none",  # type: ignore[arg-type]
        handoff_package_id=page.handoff_package_id,
        handoff_reason=page.handoff_reason,
        project_ids=list(page.project_ids),
        archived=page.thread.HasField("archived_at"),
    )


# --- client and wiring -----------------------------------------------------------------------------


@dataclass
class ConversationsClient:
    """Calls boss.conversations.v1.ConversationsService as the caller holding `token`.
    Failed calls raise ProblemError (problem+json), never a raw gRPC error."""

    slot: ChannelSlot
    timeout_seconds: float = 5.0
    retry_after_seconds: int = 5
    send_timeout_seconds: float = 30.0

    def stub(self) -> pb_grpc.ConversationsServiceStub:
        """A stub on the (lazily opened) channel."""
        return pb_grpc.ConversationsServiceStub(self.slot.get())

    async def health(self, timeout_seconds: float) -> str:
        """ConversationsService's gRPC health status name (see `clients.health_status`)."""
        return await health_status(self.slot, CONVERSATIONS_SERVICE, timeout_seconds)

    async def call(self, method: str, request: Any, token: str) -> Any:
        """Invokes unary `method` with `request` (deadline `timeout_seconds`; PostMessage, which may
        wait for the master model, `send_timeout_seconds`); maps gRPC errors to problems."""
        timeout = self.send_timeout_seconds if method == "PostMessage" else self.timeout_seconds
        try:
            return await getattr(self.stub(), method)(
                request, metadata=bearer_metadata(token), timeout=timeout
            )
        except grpc.aio.AioRpcError as error:
            raise problem_for_rpc_error(
                "conversations", error, retry_after_seconds=self.retry_after_seconds
            ) from error


def conversations_client(request: Request) -> ConversationsClient:
    """The app's conversations client (see `install`)."""
    client: ConversationsClient = request.app.state.conversations
    return client


def install(app: FastAPI, channel: grpc.aio.Channel | None = None) -> None:
    """Adds the conversation routes, the chat routes (routers/chat.py), the SSE stream
    (routers/events.py) and the web console at /console (with / redirecting there) to a gateway app.

    Args:
        app: the app from create_app (its `state.gateway` holds settings and the token authority).
        channel: a channel to conversations owned by the caller; None opens one on first use to
            BOSS_CONVERSATIONS_ADDRESS (default 127.0.0.1:50053).
    """
    from services.bff_gateway.routers import chat, devices, dispatch_plans, events

    settings = app.state.gateway.settings
    slot = ChannelSlot(target=config.service_address("conversations"), channel=channel)
    app.state.conversations = ConversationsClient(
        slot, settings.rpc_timeout_seconds, settings.retry_after_seconds, settings.send_timeout_seconds
    )
    app.state.event_hub = events.EventHub(app.state.conversations, app.state.gateway.authority)
    app.include_router(router)
    app.include_router(chat.router)
    app.include_router(dispatch_plans.router)
    app.include_router(devices.router)
    app.include_router(events.router)
    app.mount("/console", StaticFiles(directory=CONSOLE_DIR, html=True), name="console")

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/console/")


ProjectId = Annotated[
    str, Path(min_length=1, max_length=ID_MAX_LENGTH, description="A project id, or master-agent.")
]
ThreadId = Annotated[str, Path(min_length=1, max_length=ID_MAX_LENGTH, description="The Codex thread's id.")]
READ_ERRORS = error_responses(401, 403, 404, 422, 502, 503)


# --- routes ------------------------------------------------------------------------------------------


@router.get(
    "/api/v1/conversations",
    response_model=ConversationPage,
    summary="The home list with each conversation's budget ring",
    responses=error_responses(400, 401, 403, 422, 502, 503),
)
async def list_conversations(
    request: Request,
    caller: CallerDep,
    _gateway: GatewayDep,
    page_size: Annotated[int, Query(ge=0, le=200, description="0 means 50; at most 200.")] = 0,
    page_token: Annotated[
        str, Query(max_length=2000, description="next_page_token of the previous page.")
    ] = "",
) -> ConversationPage:
    """Pinned conversations first, then the latest reply first (CB-12, CB-16): single_device
    projects show their thread's ring, a group shows none, the master agent shows its main thread's.
    400 for a page_token this API did not hand out (or made for another owner)."""
    caller.require(SCOPE_CONVERSATIONS_READ)
    client = conversations_client(request)
    try:
        response = await client.call(
            "ListConversations",
            pb.ListConversationsRequest(page_size=page_size, page_token=page_token),
            caller.token,
        )
    except ProblemError as problem:
        problem.as_invalid_request("page_token")
        raise
    return ConversationPage(
        conversations=[ConversationView(**conversation_view(row)) for row in response.conversations],
        next_page_token=response.next_page_token,
    )


@router.get(
    "/api/v1/projects/{project_id}",
    response_model=ProjectDetailView,
    responses=READ_ERRORS,
    summary="A project with every thread's context budget",
)
async def get_project(project_id: ProjectId, request: Request, caller: CallerDep) -> ProjectDetailView:
    """CB-13: the conversation row plus `active_thread_contexts` (most at risk first),
    `next_compaction_risk_thread_id`, `threads_requiring_handoff`, `master_context_strategy_summary`.
    404 for an unknown project or another owner's."""
    caller.require(SCOPE_CONVERSATIONS_READ)
    response = await conversations_client(request).call(
        "GetProject", pb.GetProjectRequest(project_id=project_id), caller.token
    )
    return detail_view(response.project)


@router.post(
    "/api/v1/projects",
    response_model=ProjectDetailView,
    status_code=201,
    responses=error_responses(400, 401, 403, 404, 422, 502, 503),
    summary="Create a group project from threads",
    openapi_extra=json_body_openapi(CreateGroupBody),
)
async def create_group(request: Request, caller: CallerDep) -> ProjectDetailView:
    """A group of at least two of the caller's threads (possibly on several nodes); it shows no ring
    on the home list (CB-5). 404 when a thread is unknown; 422 names a bad field."""
    # The scope before the body: a token without it is 403 whatever it sends (request_body.py).
    caller.require(SCOPE_CONVERSATIONS_WRITE)
    body = await read_json_body(request, CreateGroupBody)
    response = await conversations_client(request).call(
        "CreateGroupProject",
        pb.CreateGroupProjectRequest(title=body.project_title, thread_ids=body.thread_ids),
        caller.token,
    )
    return detail_view(response.project)


@router.patch(
    "/api/v1/projects/{project_id}",
    response_model=ConversationView,
    responses=error_responses(400, 401, 403, 404, 422, 502, 503),
    summary="Rename a project",
    openapi_extra=json_body_openapi(RenameBody),
)
async def rename_project(project_id: ProjectId, request: Request, caller: CallerDep) -> ConversationView:
    """Sets `project_title` (1-200 characters, no control or bidirectional formatting characters)."""
    # The scope before the body: a token without it is 403 whatever it sends (request_body.py).
    caller.require(SCOPE_CONVERSATIONS_WRITE)
    body = await read_json_body(request, RenameBody)
    response = await conversations_client(request).call(
        "RenameProject",
        pb.RenameProjectRequest(project_id=project_id, title=body.project_title),
        caller.token,
    )
    return ConversationView(**conversation_view(response.conversation))


async def _pin(project_id: str, pinned: bool, request: Request, caller: Any) -> ConversationView:
    caller.require(SCOPE_CONVERSATIONS_WRITE)
    response = await conversations_client(request).call(
        "SetConversationPinned",
        pb.SetConversationPinnedRequest(project_id=project_id, pinned=pinned),
        caller.token,
    )
    return ConversationView(**conversation_view(response.conversation))


@router.put(
    "/api/v1/projects/{project_id}/pin",
    response_model=ConversationView,
    responses=READ_ERRORS,
    summary="Pin a conversation",
)
async def pin(project_id: ProjectId, request: Request, caller: CallerDep) -> ConversationView:
    """Sets `manual_pinned` (pinned conversations come first). Idempotent."""
    return await _pin(project_id, True, request, caller)


@router.delete(
    "/api/v1/projects/{project_id}/pin",
    response_model=ConversationView,
    responses=READ_ERRORS,
    summary="Unpin a conversation",
)
async def unpin(project_id: ProjectId, request: Request, caller: CallerDep) -> ConversationView:
    """Clears `manual_pinned`. Idempotent."""
    return await _pin(project_id, False, request, caller)


@router.get(
    "/api/v1/threads/{thread_id}/context-summary",
    response_model=ThreadPageView,
    responses=READ_ERRORS,
    summary="The thread page: budget, wrap-up checklist, handoff status",
)
async def get_thread_page(thread_id: ThreadId, request: Request, caller: CallerDep) -> ThreadPageView:
    """CB-14 from the conversations projection: the same percent and level as the home-list ring and
    the project detail, expected and last compaction, the wrap-up checklist and the handoff status.
    404 for an unknown thread or another owner's."""
    caller.require(SCOPE_CONVERSATIONS_READ)
    response = await conversations_client(request).call(
        "GetThreadContextBudget", pb.GetThreadContextBudgetRequest(thread_id=thread_id), caller.token
    )
    return thread_page_view(response.thread_context_budget)


@router.post(
    "/api/v1/threads/{thread_id}/archive",
    response_model=ThreadPageView,
    responses=READ_ERRORS,
    summary="Archive a thread",
)
async def archive_thread(
    thread_id: ThreadId, request: Request, caller: CallerDep, response: Response
) -> ThreadPageView:
    """Removes the thread's conversation from the home list. Idempotent."""
    caller.require(SCOPE_CONVERSATIONS_WRITE)
    client = conversations_client(request)
    await client.call("ArchiveThread", pb.ArchiveThreadRequest(thread_id=thread_id), caller.token)
    page = await client.call(
        "GetThreadContextBudget", pb.GetThreadContextBudgetRequest(thread_id=thread_id), caller.token
    )
    return thread_page_view(page.thread_context_budget)
