"""What the routes of one gateway app share: settings, token authority and backend clients.

create_app builds one GatewayState and stores it as `app.state.gateway`; routes reach it through
the `GatewayDep` dependency (so tests can build apps side by side without globals).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from services.bff_gateway.clients import ContextBudgetClient, WrapUpSource
from services.bff_gateway.settings import GatewaySettings
from services.shared.auth import TokenAuthority


@dataclass(frozen=True)
class GatewayState:
    """The app's shared, stateless collaborators (no durable state lives in the gateway)."""

    settings: GatewaySettings
    authority: TokenAuthority
    context_budget: ContextBudgetClient
    wrap_up: WrapUpSource


def gateway_state(request: Request) -> GatewayState:
    """The GatewayState of the app serving `request`."""
    state: GatewayState = request.app.state.gateway
    return state


GatewayDep = Annotated[GatewayState, Depends(gateway_state)]
