"""A chat send may wait for the master model (its inline reply, a group plan's drafts) longer than
the gateway's deadline for other backend calls: it gets its own (`send_timeout_seconds`), so a slow
model does not cancel the send before anything is stored."""

from __future__ import annotations

import httpx

from tests.integration.bff_gateway.support import SEED_OWNER, Gateway, settings_for


async def send_taking(gateway: Gateway, seconds: float, client_message_id: str) -> httpx.Response:
    """A send that the conversations double takes `seconds` to store."""
    gateway.conversations.servicer.chat.send_delay_seconds = seconds
    return await gateway.http.post(
        "/api/v1/projects/proj-slow/messages",
        json={
            "text": f"plan this for the group ({client_message_id})",
            "client_message_id": client_message_id,
        },
        headers=gateway.client_headers(SEED_OWNER),
    )


async def test_a_send_slower_than_the_rpc_deadline_is_stored_and_answered(gateway: Gateway) -> None:
    settings = gateway.app.state.gateway.settings
    assert settings == settings_for(settings.context_budget_address)  # rpc deadline 2 s, send 30 s

    sent = await send_taking(gateway, settings.rpc_timeout_seconds + 0.5, "slow-1")

    assert sent.status_code == 201, sent.text
    assert sent.json()["message"]["text"] == "plan this for the group (slow-1)"


async def test_a_send_past_its_own_deadline_is_a_503_problem(gateway: Gateway) -> None:
    gateway.app.state.conversations.send_timeout_seconds = 0.2

    sent = await send_taking(gateway, 0.5, "slow-2")

    assert sent.status_code == 503, sent.text
    assert sent.headers["content-type"] == "application/problem+json"
