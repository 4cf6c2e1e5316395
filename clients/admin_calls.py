"""The admin client's transport: one gateway connection and the call every admin API family
makes (clients/admin.py puts the families together as AsyncAdmin).

Every call goes to a gateway, which passes admin calls to the active controller
(DESIGN.md section 3). NOT_CONTROLLER (a controller election in progress) is retried
within request_timeout_ms; a per-topic or per-partition error in an answer is raised by
the family's method with raise_first, after the whole answer was read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from clients.config import DEFAULT_BOOTSTRAP, ConnectionConfig, build_config
from clients.connection import GatewayConnection
from clients.errors import HighwaterError, error_for_code
from clients.metadata import now_ms
from clients.types import TopicPartition
from protos.highwater.v1 import common_pb2

_V = TypeVar("_V")


def raise_first(errors: list[HighwaterError]) -> None:
    """Raise the first of the per-topic or per-partition errors an answer carried, if any."""
    if errors:
        raise errors[0]


def per_partition(response: Any, what: str, value: Callable[[Any], _V]) -> dict[TopicPartition, _V]:
    """Each partition's `value` from a per-topic, per-partition answer (ListOffsets,
    DeleteRecords), or the first partition's error: `what` names the call in its message."""
    result: dict[TopicPartition, _V] = {}
    errors: list[HighwaterError] = []
    for topic in response.topics:
        for p in topic.partitions:
            tp = TopicPartition(topic.topic, p.partition)
            if p.error_code != common_pb2.NONE:
                errors.append(error_for_code(p.error_code, p.error_message or f"{what} for {tp}"))
            else:
                result[tp] = value(p)
    raise_first(errors)
    return result


class AdminCalls:
    """What every admin API family shares: the settings, the gateway connection, `_call`."""

    def __init__(self, bootstrap: str | list[str] = DEFAULT_BOOTSTRAP, **settings: Any) -> None:
        self.config: ConnectionConfig = build_config(ConnectionConfig, bootstrap, settings)
        self._connection: GatewayConnection | None = None

    def _conn(self) -> GatewayConnection:
        if self._connection is None:
            self._connection = GatewayConnection.from_config(self.config)
        return self._connection

    async def _call(self, method: str, request: Any) -> Any:
        """Call and check the whole-request error, retrying NOT_CONTROLLER within the timeout."""
        deadline = now_ms() + self.config.request_timeout_ms
        attempts = 0
        while True:
            response = await self._conn().call(method, request)
            code = getattr(response, "error_code", common_pb2.NONE)
            if code == common_pb2.NONE:
                return response
            error = error_for_code(code, getattr(response, "error_message", "") or method)
            attempts += 1
            if not error.retriable or now_ms() >= deadline:
                raise error
            pause_ms = min(self.config.retry_backoff_max_ms, self.config.retry_backoff_ms * attempts)
            await asyncio.sleep(pause_ms / 1000)

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None
