"""The gateway's handoff routes and CB-14's checklist seam, over real gRPC to a running scheduler
(SQLite and PostgreSQL). Thread t1 is the default owner "local"'s, both for the scheduler (its budget
events name no owner, as before events carried one, and its worker token names none) and for the
gateway's owner check of client tokens (a conversations double,
tests/integration/bff_gateway/conversations_double.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from boss.scheduler.v1 import scheduler_pb2 as pb

from services.bff_gateway.clients import open_channel
from services.bff_gateway.server import create_app
from services.bff_gateway.settings import GatewaySettings
from tests.conftest import DatabaseTarget
from tests.integration.bff_gateway.conversations_double import start_conversations
from tests.integration.scheduler.harness import SECRET, Running, budget_payload, running_scheduler
from tests.integration.scheduler.test_scheduler_service import next_commands


@pytest.fixture
async def stack(database_target: DatabaseTarget) -> AsyncIterator[tuple[Running, httpx.AsyncClient]]:
    async with running_scheduler(database_target) as running:
        owners = await start_conversations(running.authority, {"t1": "local"})
        budget = open_channel(running.upstream_address)
        scheduler = open_channel(f"127.0.0.1:{running.port}")
        conversations = open_channel(owners.address)
        settings = GatewaySettings(
            listen="127.0.0.1:0", context_budget_address=running.upstream_address, auth_secret=SECRET
        )
        app = create_app(
            settings,
            context_budget_channel=budget,
            scheduler_channel=scheduler,
            conversations_channel=conversations,
        )
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gw.test"
        ) as http:
            try:
                yield running, http
            finally:
                await budget.close()
                await scheduler.close()
                await conversations.close()
                await owners.stop()


async def test_package_read_consume_and_thread_checklist(stack: tuple[Running, httpx.AsyncClient]) -> None:
    running, http = stack
    client = {"authorization": f"Bearer {running.authority.issue_client('local')}"}
    await running.publish(budget_payload(1, "urgent", 30))
    prepare = (await next_commands(running, 3))[-1]
    assert prepare.command_type == pb.COMMAND_TYPE_PREPARE_HANDOFF

    view = (await http.get("/api/v1/threads/t1/context-budget", headers=client)).json()
    assert view["handoff_package"]["package_status"] == "draft"
    assert [item["status"] for item in view["wrap_up_checklist"]] == ["pending"] * 7
    assert view["handoff_package"]["relay_thread_id"].startswith("relay-")

    early = await http.post(f"/api/v1/handoff-packages/{prepare.handoff_package_id}/consume", headers=client)
    assert early.status_code == 409
    assert early.headers["content-type"].startswith("application/problem+json")

    upload = pb.HandoffPackage(
        handoff_package_id=prepare.handoff_package_id,
        summary_text="parser done",
        critical_files=["a.py"],
        checklist=[
            pb.ChecklistItem(item="files_touched", status=pb.CHECKLIST_ITEM_STATUS_DONE, detail="1 file")
        ],
    )
    await running.stub.UploadHandoffPackage(
        pb.UploadHandoffPackageRequest(
            worker_id="w1", node_id="n1", command_id=prepare.command_id, handoff_package=upload
        ),
        metadata=running.worker(),
    )

    view = (await http.get("/api/v1/threads/t1/context-budget", headers=client)).json()
    assert view["handoff_package"]["package_status"] == "ready"
    assert view["wrap_up_checklist"][0] == {
        "key": "files_touched",
        "label": "Files touched by the current change",
        "status": "done",
        "detail": "1 file",
    }
    assert view["wrap_up_checklist"][1] == {
        "key": "patches",
        "label": "Patches done and not done",
        "status": "missing",
        "detail": "not reported by the worker",
    }

    package = (
        await http.get(f"/api/v1/handoff-packages/{prepare.handoff_package_id}", headers=client)
    ).json()
    assert package["summary_text"] == "parser done" and package["critical_files"] == ["a.py"]
    assert "patches" in package["missing_items"]
    assert package["checklist"] == view["wrap_up_checklist"]

    consumed = await http.post(
        f"/api/v1/handoff-packages/{prepare.handoff_package_id}/consume",
        headers=client,
        json={"consumed_by_thread_id": "relay-x"},
    )
    assert consumed.status_code == 200 and consumed.json()["package_status"] == "consumed"
    assert consumed.json()["consumed_by_thread_id"] == "relay-x"
    again = await http.post(f"/api/v1/handoff-packages/{prepare.handoff_package_id}/consume", headers=client)
    assert again.status_code == 409

    missing = await http.get("/api/v1/handoff-packages/nope", headers=client)
    assert missing.status_code == 404
    anonymous = await http.get(f"/api/v1/handoff-packages/{prepare.handoff_package_id}")
    assert anonymous.status_code == 401


async def test_another_owners_package_is_404_like_an_unknown_one(
    stack: tuple[Running, httpx.AsyncClient],
) -> None:
    running, http = stack
    stranger = {"authorization": f"Bearer {running.authority.issue_client('someone-else')}"}
    owner = {"authorization": f"Bearer {running.authority.issue_client('local')}"}
    await running.publish(budget_payload(1, "urgent", 30))
    prepare = (await next_commands(running, 3))[-1]
    await running.stub.UploadHandoffPackage(
        pb.UploadHandoffPackageRequest(
            worker_id="w1",
            node_id="n1",
            command_id=prepare.command_id,
            handoff_package=pb.HandoffPackage(handoff_package_id=prepare.handoff_package_id),
        ),
        metadata=running.worker(),
    )
    path = f"/api/v1/handoff-packages/{prepare.handoff_package_id}"

    foreign = await http.get(path, headers=stranger)
    unknown = await http.get("/api/v1/handoff-packages/hp-unknown", headers=stranger)
    foreign_consume = await http.post(path + "/consume", headers=stranger)
    foreign_thread = await http.get("/api/v1/threads/t1/context-budget", headers=stranger)

    assert (foreign.status_code, unknown.status_code, foreign_consume.status_code) == (404, 404, 404)
    assert foreign.json()["detail"] == f"handoff package {prepare.handoff_package_id} does not exist"
    assert unknown.json()["detail"] == "handoff package hp-unknown does not exist"
    assert foreign.json()["reason"] == unknown.json()["reason"] == "PACKAGE_NOT_FOUND"
    assert foreign_consume.json()["detail"] == foreign.json()["detail"]
    assert foreign_thread.status_code == 404
    assert (await http.get(path, headers=owner)).json()["package_status"] == "ready"
