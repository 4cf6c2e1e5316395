"""Errors a client raises: the wire errors of services/common/errors.py plus a few of its own.

Every operating error a client raises is a `HighwaterError`, so a caller (and the
CLI) needs one `except` clause, and each carries `retriable` / `refresh_metadata`
like the server's. The classes defined here exist only on the client side: they
have no wire code of their own, so each borrows the closest one and names itself
with `code_name()` (what the CLI prints before the message).

- GatewayUnavailable: no gateway in the bootstrap list answered in time.
- InvalidArgument: the caller passed something wrong (type, range, empty name);
  it is also a ValueError and a TypeError so plain Python code can catch it.
- ClientClosed: a method was called on a closed Producer/Consumer/Admin.

`error_from_status` turns a whole-request gRPC failure into one of these.
"""

from __future__ import annotations

import grpc

from protos.highwater.v1 import common_pb2
from services.common.errors import (
    ClusterAuthorizationFailed,
    HighwaterError,
    InvalidRequest,
    MessageTooLarge,
    RequestTimedOut,
    UnknownServerError,
    error_for_code,
    raise_for_code,
)

__all__ = [
    "ClientClosed",
    "GatewayUnavailable",
    "HighwaterError",
    "InvalidArgument",
    "MessageTooLarge",
    "RequestTimedOut",
    "error_for_code",
    "error_from_status",
    "raise_for_code",
]


class GatewayUnavailable(HighwaterError):
    """No gateway named in the bootstrap list (or learnt from Metadata) answered in time.

    Retriable: gateways are stateless, so a restarted or another one will do.
    """

    code = common_pb2.BROKER_NOT_AVAILABLE
    retriable = True
    refresh_metadata = False

    @classmethod
    def code_name(cls) -> str:
        return "GATEWAY_UNAVAILABLE"


class InvalidArgument(InvalidRequest, ValueError, TypeError):
    """The caller passed a value of the wrong type or out of range; the message names it.

    Raised before anything is sent, so nothing half-done is left behind.
    """

    @classmethod
    def code_name(cls) -> str:
        return "INVALID_ARGUMENT"


class ClientClosed(HighwaterError):
    """The Producer, Consumer or Admin was closed; create a new one."""

    code = common_pb2.INVALID_REQUEST

    @classmethod
    def code_name(cls) -> str:
        return "CLIENT_CLOSED"


def error_from_status(error: grpc.aio.AioRpcError | grpc.RpcError, method: str, address: str) -> HighwaterError:
    """The typed error for a whole-request gRPC failure other than UNAVAILABLE.

    UNAVAILABLE is not mapped here: the connection fails over to the next gateway
    and raises GatewayUnavailable only when none is left.
    """
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else "") or ""
    where = f"{method} at gateway {address}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestTimedOut(f"{where}: no answer before the deadline")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequest(f"{where}: {details}")
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return ClusterAuthorizationFailed(f"{where}: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return MessageTooLarge(f"{where}: {details}")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return UnknownServerError(f"{where}: the gateway does not implement this call")
    return UnknownServerError(f"{where}: {code.name if code else 'UNKNOWN'}: {details}")
