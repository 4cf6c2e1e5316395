"""Errors a client raises: the wire errors of clients/common/errors.py plus a few of its own.

Every operating error a client raises is a `HighwaterError`, so a caller (and the
CLI) needs one `except` clause, and each carries `retriable` / `refresh_metadata`
like the server's. The classes defined here exist only on the client side: they
have no wire code of their own, so each borrows the closest one and names itself
with `code_name()` (what the CLI prints before the message).

- GatewayUnavailable: no gateway in the bootstrap list answered in time.
- LeaderMoved: a request to a leader went unanswered while Metadata came to name
  another leader for its partitions (a paused or cut-off broker); sent again there.
- LeaderUnavailable: the broker Metadata named as a partition's leader could not be
  reached (a client sending straight to leaders asks for new Metadata and tries again).
- InvalidArgument: the caller passed something wrong (type, range, empty name);
  it is also a ValueError and a TypeError so plain Python code can catch it.
- ClientClosed: a method was called on a closed Producer/Consumer/Admin.
- TransactionAbortRequired: a record of the producer's transaction failed (or a call of the
  transaction did), so it cannot commit: call abort_transaction() and run it again.

Pure: imports no grpc (clients/connection.py maps gRPC statuses to these), so the
accumulator and the partitioner stay free of I/O imports.
"""

from __future__ import annotations

from clients.common.errors import (
    ConcurrentTransactions,
    CoordinatorNotAvailable,
    HighwaterError,
    InvalidRequest,
    InvalidTxnState,
    MessageTooLarge,
    ProducerFenced,
    RequestTimedOut,
    error_for_code,
    raise_for_code,
)
from protos.highwater.v1 import common_pb2

__all__ = [
    "ClientClosed",
    "ConcurrentTransactions",
    "CoordinatorNotAvailable",
    "GatewayUnavailable",
    "HighwaterError",
    "InvalidArgument",
    "InvalidTxnState",
    "LeaderMoved",
    "LeaderUnavailable",
    "MessageTooLarge",
    "ProducerFenced",
    "RequestTimedOut",
    "TransactionAbortRequired",
    "check_no_positional_timeout",
    "error_for_code",
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


class LeaderUnavailable(HighwaterError):
    """The broker Metadata named as a partition's leader did not answer (stopped, restarting,
    unreachable). Retriable with new Metadata: the controller moves the leadership of a
    broker that is gone, and the client sends to the new leader.
    """

    code = common_pb2.BROKER_NOT_AVAILABLE
    retriable = True
    refresh_metadata = True

    @classmethod
    def code_name(cls) -> str:
        return "LEADER_UNAVAILABLE"


class LeaderMoved(HighwaterError):
    """A request to a partition's leader went unanswered while the controller moved the
    leadership elsewhere (the old leader is paused, overloaded or cut off). Retriable: the
    client sends it to the new leader that its (already fresh) Metadata names.
    """

    code = common_pb2.NOT_LEADER_OR_FOLLOWER
    retriable = True
    refresh_metadata = False

    @classmethod
    def code_name(cls) -> str:
        return "LEADER_MOVED"


# InvalidRequest is made at run time by _error() in clients/common/errors.py, so mypy sees a
# variable of type type[HighwaterError], not a class it can derive from.
class InvalidArgument(InvalidRequest, ValueError, TypeError):  # type: ignore[misc, valid-type]
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


def check_no_positional_timeout(method: str, args: tuple[object, ...]) -> None:
    """InvalidArgument (a TypeError) for flush(10.0) or close(5): timeouts are keyword only.

    confluent-kafka's flush(timeout) takes seconds, ours milliseconds, so a positional value
    would silently mean a thousand times less; the methods take `*args` only to say so.
    """
    if args:
        raise InvalidArgument(
            f"{method}() takes its timeout as a keyword in milliseconds, e.g. {method}(timeout_ms=10_000); "
            f"got {method}({', '.join(map(repr, args))}) (confluent-kafka's {method}(10.0) means seconds)"
        )


class TransactionAbortRequired(HighwaterError):
    """The transaction cannot commit (a record or call of it failed, named in the message):
    abort_transaction(), then run the transaction again. Kafka's abortable error."""

    code = common_pb2.INVALID_TXN_STATE

    @classmethod
    def code_name(cls) -> str:
        return "TRANSACTION_ABORT_REQUIRED"
