"""Alert lifecycle RPCs and threshold policy overrides."""

from __future__ import annotations

from typing import Any

import grpc
from boss.context_budget.v1 import context_budget_pb2 as pb
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc
from sqlalchemy import select

from services.context_budget.adapters.tables import thread_context_threshold_policies
from services.context_budget.server import ContextBudgetService
from services.shared.errors import reason_of
from tests.integration.context_budget.conftest import Tokens
from tests.integration.context_budget.support import (
    auth,
    read_events,
    report,
    rpc_failure,
    snapshot,
    violation_fields,
)


async def _open_watch_alert(stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens) -> pb.ThreadContextAlert:
    await report(stub, tokens.worker, snapshot(pct=45))
    (alert,) = (
        await stub.ListAlerts(pb.ListAlertsRequest(thread_id="thread-abc"), metadata=auth(tokens.client))
    ).alerts
    return alert


async def test_alert_acknowledge_then_resolve_and_illegal_transitions(
    stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    alert = await _open_watch_alert(stub, tokens)
    assert (alert.alert_type, alert.alert_status) == (pb.ALERT_TYPE_CONTEXT_WATCH, pb.ALERT_STATUS_OPENED)
    assert alert.reason == "context budget 45% is at level watch"
    admin = auth(tokens.admin)

    acked = (
        await stub.AcknowledgeAlert(pb.AcknowledgeAlertRequest(alert_id=alert.alert_id), metadata=admin)
    ).alert
    assert acked.alert_status == pb.ALERT_STATUS_ACKED and acked.HasField("acked_at")
    code, _ = await rpc_failure(
        stub.AcknowledgeAlert(pb.AcknowledgeAlertRequest(alert_id=alert.alert_id), metadata=admin)
    )
    assert code is grpc.StatusCode.FAILED_PRECONDITION

    context = (
        await stub.GetThreadContext(
            pb.GetThreadContextRequest(thread_id="thread-abc"), metadata=auth(tokens.client)
        )
    ).thread_context
    assert [(a.alert_id, a.alert_status) for a in context.open_alerts] == [
        (alert.alert_id, pb.ALERT_STATUS_ACKED)
    ]

    resolved = (
        await stub.ResolveAlert(pb.ResolveAlertRequest(alert_id=alert.alert_id), metadata=admin)
    ).alert
    assert resolved.alert_status == pb.ALERT_STATUS_RESOLVED and resolved.HasField("resolved_at")
    for call in (
        stub.ResolveAlert(pb.ResolveAlertRequest(alert_id=alert.alert_id), metadata=admin),
        stub.AcknowledgeAlert(pb.AcknowledgeAlertRequest(alert_id=alert.alert_id), metadata=admin),
    ):
        code, _ = await rpc_failure(call)
        assert code is grpc.StatusCode.FAILED_PRECONDITION

    code, status = await rpc_failure(
        stub.ResolveAlert(pb.ResolveAlertRequest(alert_id="no-such-alert"), metadata=admin)
    )
    assert code is grpc.StatusCode.NOT_FOUND and reason_of(status) == "ALERT_NOT_FOUND"
    code, status = await rpc_failure(stub.ResolveAlert(pb.ResolveAlertRequest(), metadata=admin))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and violation_fields(status) == ["alert_id"]

    changes = await read_events(stub, tokens.admin, 0, 3, types=["thread.context.alert_changed"])
    assert [p["alert_status"] for _s, _k, p in changes] == ["opened", "acked", "resolved"]
    assert {p["alert_id"] for _s, _k, p in changes} == {alert.alert_id}

    # The thread stays at watch: a resolved level alert is not reopened until the level changes.
    await report(stub, tokens.worker, snapshot(pct=44, version=2))
    listed = (
        await stub.ListAlerts(
            pb.ListAlertsRequest(thread_id="thread-abc", alert_statuses=[pb.ALERT_STATUS_OPENED]),
            metadata=auth(tokens.client),
        )
    ).alerts
    assert list(listed) == []


async def test_alert_changes_need_the_admin_scope(
    stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    alert = await _open_watch_alert(stub, tokens)
    for token in (tokens.worker, tokens.client):
        code, _ = await rpc_failure(
            stub.AcknowledgeAlert(pb.AcknowledgeAlertRequest(alert_id=alert.alert_id), metadata=auth(token))
        )
        assert code is grpc.StatusCode.PERMISSION_DENIED


async def test_list_alerts_pages_newest_first_and_filters(
    stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    for version, pct in enumerate((45, 30, 10, 45), start=1):
        await report(stub, tokens.worker, snapshot(pct=pct, version=version))
    await report(stub, tokens.worker, snapshot("other-thread", pct=45, project_id="proj-002"))
    client = auth(tokens.client)
    seen: list[pb.ThreadContextAlert] = []
    token = ""
    while True:
        page = await stub.ListAlerts(
            pb.ListAlertsRequest(project_id="proj-001", page_size=1, page_token=token), metadata=client
        )
        seen.extend(page.alerts)
        token = page.next_page_token
        if not token:
            break
    assert [a.alert_type for a in seen] == [
        pb.ALERT_TYPE_CONTEXT_WATCH,
        pb.ALERT_TYPE_CONTEXT_CRITICAL,
        pb.ALERT_TYPE_CONTEXT_URGENT,
        pb.ALERT_TYPE_CONTEXT_WATCH,
    ]
    assert [a.alert_status for a in seen] == [pb.ALERT_STATUS_OPENED] + [pb.ALERT_STATUS_RESOLVED] * 3
    opened = (
        await stub.ListAlerts(pb.ListAlertsRequest(alert_statuses=[pb.ALERT_STATUS_OPENED]), metadata=client)
    ).alerts
    assert sorted(a.thread_id for a in opened) == ["other-thread", "thread-abc"]

    first = await stub.ListAlerts(pb.ListAlertsRequest(project_id="proj-001", page_size=1), metadata=client)
    code, status = await rpc_failure(
        stub.ListAlerts(
            pb.ListAlertsRequest(project_id="proj-002", page_size=1, page_token=first.next_page_token),
            metadata=client,
        )
    )
    assert code is grpc.StatusCode.INVALID_ARGUMENT and violation_fields(status) == ["page_token"]
    unknown_statuses: list[Any] = [0, 9]  # unspecified, and a number no enum value has
    code, status = await rpc_failure(
        stub.ListAlerts(pb.ListAlertsRequest(alert_statuses=unknown_statuses), metadata=client)
    )
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert violation_fields(status) == ["alert_statuses[0]", "alert_statuses[1]"]


async def test_project_policy_override_changes_classification(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    client, admin = auth(tokens.client), auth(tokens.admin)
    default = await stub.GetThresholdPolicy(
        pb.GetThresholdPolicyRequest(project_id="proj-001"), metadata=admin
    )
    assert not default.project_override
    assert (default.policy.safe_min_pct, default.policy.watch_min_pct, default.policy.urgent_min_pct) == (
        60,
        40,
        25,
    )

    before = await report(stub, tokens.worker, snapshot(pct=65, version=1))
    assert before.context_budget_level == pb.CONTEXT_BUDGET_LEVEL_SAFE

    stored = await stub.SetThresholdPolicy(
        pb.SetThresholdPolicyRequest(
            policy=pb.ThresholdPolicy(
                project_id="proj-001", safe_min_pct=70, watch_min_pct=50, urgent_min_pct=30
            )
        ),
        metadata=admin,
    )
    assert stored.policy.HasField("updated_at")
    after = await report(stub, tokens.worker, snapshot(pct=65, version=2))
    assert after.context_budget_level == pb.CONTEXT_BUDGET_LEVEL_WATCH
    elsewhere = await report(stub, tokens.worker, snapshot("t-other", pct=65, project_id="proj-002"))
    assert elsewhere.context_budget_level == pb.CONTEXT_BUDGET_LEVEL_SAFE

    override = await stub.GetThresholdPolicy(
        pb.GetThresholdPolicyRequest(project_id="proj-001"), metadata=admin
    )
    assert override.project_override and override.policy.safe_min_pct == 70
    # A client token reads the default policy, not a project's (policies are the operator's).
    code, _status = await rpc_failure(
        stub.GetThresholdPolicy(pb.GetThresholdPolicyRequest(project_id="proj-001"), metadata=client)
    )
    assert code is grpc.StatusCode.PERMISSION_DENIED
    default_for_client = await stub.GetThresholdPolicy(pb.GetThresholdPolicyRequest(), metadata=client)
    assert not default_for_client.project_override and default_for_client.policy.safe_min_pct == 60
    async with service.database.read() as connection:
        rows = (await connection.execute(select(thread_context_threshold_policies))).mappings().all()
    assert [(r["project_id"], r["safe_min_pct"], r["watch_min_pct"], r["urgent_min_pct"]) for r in rows] == [
        ("proj-001", 70, 50, 30)
    ]

    # Replacing the default policy changes every project without an override.
    await stub.SetThresholdPolicy(
        pb.SetThresholdPolicyRequest(
            policy=pb.ThresholdPolicy(project_id="", safe_min_pct=90, watch_min_pct=80, urgent_min_pct=70)
        ),
        metadata=admin,
    )
    strict = await report(stub, tokens.worker, snapshot("t-other", pct=65, version=2, project_id="proj-002"))
    assert strict.context_budget_level == pb.CONTEXT_BUDGET_LEVEL_CRITICAL


async def test_invalid_policies_and_missing_scope_are_rejected(
    stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    bad = pb.ThresholdPolicy(project_id="p", safe_min_pct=50, watch_min_pct=50, urgent_min_pct=-1)
    code, status = await rpc_failure(
        stub.SetThresholdPolicy(pb.SetThresholdPolicyRequest(policy=bad), metadata=auth(tokens.admin))
    )
    assert code is grpc.StatusCode.INVALID_ARGUMENT and violation_fields(status) == ["policy.urgent_min_pct"]
    code, status = await rpc_failure(
        stub.SetThresholdPolicy(pb.SetThresholdPolicyRequest(), metadata=auth(tokens.admin))
    )
    assert code is grpc.StatusCode.INVALID_ARGUMENT and violation_fields(status) == ["policy"]
    good = pb.ThresholdPolicy(project_id="p", safe_min_pct=70, watch_min_pct=50, urgent_min_pct=30)
    code, _ = await rpc_failure(
        stub.SetThresholdPolicy(pb.SetThresholdPolicyRequest(policy=good), metadata=auth(tokens.client))
    )
    assert code is grpc.StatusCode.PERMISSION_DENIED
