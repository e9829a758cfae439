"""Group chat values as ConversationsService protobuf messages (the servicer's conversions)."""

from __future__ import annotations

from datetime import datetime

from boss.conversations.v1 import conversations_pb2 as pb
from google.protobuf import json_format

from services.conversations.groups.plans import DispatchPlan


def plan_message(plan: DispatchPlan, now: datetime) -> pb.DispatchPlan:
    """A dispatch plan as of `now` (its status effective then: a proposed plan past its expiry is
    expired). Built from `DispatchPlan.as_payload`, the same JSON `dispatch_plan.updated` carries,
    so the RPCs and the events never differ."""
    return json_format.ParseDict(plan.as_payload(now), pb.DispatchPlan())
