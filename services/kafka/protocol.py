"""Kafka's wire framing, the APIs this broker answers, and the error-code table. Pure.

A Kafka request on the wire is a 4-byte big-endian size, then a request header (v1: api key,
api version, correlation id, client id; v2 adds tagged fields and is used by flexible API
versions), then the request body. An answer is a 4-byte size, a response header (v0: the
correlation id; v1 adds tagged fields, for flexible versions, except ApiVersions, whose answer
always has header v0 so that a client can read it before it knows what the broker speaks),
then the response body. The message classes, their readers and writers are kio's, generated
from Kafka's own message definitions (pyproject.toml says why kio).

Nothing here touches a socket: the listener (listener.py) cuts frames and hands them here.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import io
import pkgutil
import struct
import sys
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import DecodeError
from kio.static.constants import EntityType

from clients.common.errors import check
from protos.highwater.v1 import common_pb2

T = TypeVar("T")

# Kafka's API keys, as Kafka numbers them (kio.schema.index.api_key_map has them all).
PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
API_VERSIONS = 18
CREATE_TOPICS = 19
DELETE_TOPICS = 20
DELETE_RECORDS = 21
INIT_PRODUCER_ID = 22
OFFSET_FOR_LEADER_EPOCH = 23
DESCRIBE_CONFIGS = 32
ALTER_CONFIGS = 33
DESCRIBE_LOG_DIRS = 35
CREATE_PARTITIONS = 37
INCREMENTAL_ALTER_CONFIGS = 44
DESCRIBE_CLUSTER = 60
ADD_PARTITIONS_TO_TXN = 24
ADD_OFFSETS_TO_TXN = 25
END_TXN = 26
TXN_OFFSET_COMMIT = 28
DESCRIBE_TRANSACTIONS = 65
LIST_TRANSACTIONS = 66
DELETE_GROUPS = 42
OFFSET_DELETE = 47

# The versions answered, per API key: the one table ApiVersions advertises and decode_request
# checks. Ranges are where kio's classes start (Kafka 4 dropped older versions) up to the last
# version whose fields we fill in; newer versions name topics by id (Fetch 13+, Produce 13+) or
# carry transaction and share-group fields we do not implement (docs/KAFKA.md lists the rest).
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 9),
    FETCH: (4, 12),
    LIST_OFFSETS: (1, 7),
    METADATA: (0, 12),
    API_VERSIONS: (0, 3),
    INIT_PRODUCER_ID: (0, 4),
    OFFSET_FOR_LEADER_EPOCH: (2, 4),
    # Admin requests, forwarded to the active controller (DescribeConfigs and DescribeCluster are
    # answered from this broker's metadata). DeleteTopics 6+ names topics by id.
    CREATE_TOPICS: (2, 7),
    DELETE_TOPICS: (1, 5),
    # Answered by this broker for the partitions it leads (clients send one to each leader).
    DELETE_RECORDS: (0, 2),
    # This broker's replicas, leaders and followers, in its one log directory (kio has no v0).
    DESCRIBE_LOG_DIRS: (1, 4),
    CREATE_PARTITIONS: (0, 3),
    DESCRIBE_CONFIGS: (1, 4),
    # Topic configs changed through the controller's AlterTopicConfigs (config_changes.py).
    ALTER_CONFIGS: (0, 2),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    DESCRIBE_CLUSTER: (0, 1),
    # Offsets of groups committed from outside a group's membership (generation -1, as
    # assign()-based consumers and admin tools commit); every broker is every group's
    # coordinator. OffsetCommit 9+ and OffsetFetch 8+ carry KIP-848 member epochs and batched
    # groups; FindCoordinator 4+ batches keys (served).
    FIND_COORDINATOR: (0, 4),
    OFFSET_COMMIT: (2, 8),
    OFFSET_FETCH: (1, 7),
    # The classic group protocol (classic_groups.py). JoinGroup 8+ adds a leave reason and 9
    # KIP-814's skip_assignment; LeaveGroup 5 a reason; ListGroups 5 group types.
    JOIN_GROUP: (2, 7),
    SYNC_GROUP: (1, 5),
    HEARTBEAT: (1, 4),
    LEAVE_GROUP: (1, 4),
    LIST_GROUPS: (1, 4),
    DESCRIBE_GROUPS: (1, 5),
    # Group admin (services/kafka/backend.py): a group without members is deleted, offsets of
    # topics the live group does not subscribe to are deleted.
    DELETE_GROUPS: (0, 2),
    OFFSET_DELETE: (0, 0),
    # Transactions (txn_calls.py; the coordinator is services/transactions/). Newer versions are
    # KIP-890 part 2 (an epoch bump at every EndTxn; AddPartitionsToTxn 4 is broker-to-broker),
    # not served: clients fall back to these. FindCoordinator answers key_type 1 (transaction).
    ADD_PARTITIONS_TO_TXN: (0, 3),
    ADD_OFFSETS_TO_TXN: (0, 3),
    END_TXN: (0, 4),
    TXN_OFFSET_COMMIT: (0, 4),
    DESCRIBE_TRANSACTIONS: (0, 0),
    LIST_TRANSACTIONS: (0, 1),
}

# Kafka answers the requests of one connection one at a time, in order, and clients rely on
# it (a consumer's last OffsetCommit before its LeaveGroup). These APIs may overlap the ones
# before them all the same: whatever they change, they change in the first step of their
# task, before anything waits, so tasks started in order act in order (a long-polling Fetch
# then does not hold back the Produce behind it). Every other API (etcd, the controller,
# group state) waits for all before it and holds back all after it (listener.py).
PIPELINED_APIS = frozenset({PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS, OFFSET_FOR_LEADER_EPOCH})

# ApiVersions' answer to a version it does not know is written as v0, the one version every
# client can read (Kafka does the same; the client then retries with a version it finds there).
API_VERSIONS_FALLBACK_VERSION = 0

_SIZE = struct.Struct(">i")
_HEADER_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id


class KafkaProtocolError(Exception):
    """The peer sent bytes that are not a Kafka request we can read: the connection is closed."""


@dataclass(frozen=True)
class UnsupportedVersion(Exception):
    """A request for an API or version not in SUPPORTED_VERSIONS (answered, or the connection closed)."""

    api_key: int
    api_version: int
    correlation_id: int

    def __str__(self) -> str:
        return (
            f"UNSUPPORTED_VERSION: api key {self.api_key} version {self.api_version} is not served here "
            f"(served: {SUPPORTED_VERSIONS.get(self.api_key, 'none')})"
        )


@dataclass(frozen=True)
class Request:
    """One decoded request: its header's fields and kio's body object."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any


def peek_api_key(frame: bytes) -> int:
    """A request frame's API key, read before it is decoded (-1: too short to say)."""
    return int(struct.unpack_from(">h", frame)[0]) if len(frame) >= 2 else -1


def frame_size(prefix: bytes) -> int:
    """The body size a 4-byte size prefix announces; KafkaProtocolError if it is negative."""
    (size,) = _SIZE.unpack(prefix)
    if size < 0:
        raise KafkaProtocolError(f"negative request size {size}")
    return int(size)


@functools.cache
def _payload_class(
    api_key: int, version: int, entity: Literal[EntityType.request, EntityType.response]
) -> Any:
    module = load_payload_module(api_key, version, entity)
    # The module also holds the nested structures (PartitionProduceResponse...): the payload is
    # the one class whose entity type is the request or response itself.
    return next(
        v for v in vars(module).values() if isinstance(v, type) and getattr(v, "__type__", None) == entity
    )


def request_class(api_key: int, version: int) -> Any:
    return _payload_class(api_key, version, EntityType.request)


def response_class(api_key: int, version: int) -> Any:
    return _payload_class(api_key, version, EntityType.response)


# Requests whose trailing bytes are ignored, as Kafka's own parser ignores them: librdkafka 2.x
# sends some Metadata v12 requests (on TLS connections, asking the cluster's authorized operations)
# with v10's include_cluster_authorized_operations still in, three bytes more than v12 has.
TRAILING_BYTES_TOLERATED = frozenset({METADATA})


def decode_request(frame: bytes) -> Request:
    """A request frame (without its size prefix) -> Request.

    Raises UnsupportedVersion for an API or version not served (its correlation id is known, so
    it may be answered) and KafkaProtocolError for bytes that cannot be read at all.
    """
    if len(frame) < _HEADER_PREFIX.size:
        raise KafkaProtocolError(f"request of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id = _HEADER_PREFIX.unpack_from(frame)
    served = SUPPORTED_VERSIONS.get(api_key)
    if served is None or not served[0] <= api_version <= served[1]:
        raise UnsupportedVersion(api_key, api_version, correlation_id)
    cls = request_class(api_key, api_version)
    header_cls: type[RequestHeaderV1] | type[RequestHeaderV2] = (
        RequestHeaderV2 if cls.__flexible__ else RequestHeaderV1
    )
    try:
        header, offset = entity_reader(header_cls)(frame, 0)
        body, size = entity_reader(cls)(frame, offset)
    except (DecodeError, ValueError, TypeError, KeyError) as exc:
        # KeyError: kio's answer to a tagged field it does not know ("Unknown tagged field tag").
        raise KafkaProtocolError(
            f"api key {api_key} v{api_version}: cannot decode the request: {exc}"
        ) from exc
    if offset + size != len(frame) and not (
        api_key in TRAILING_BYTES_TOLERATED and offset + size < len(frame)
    ):
        raise KafkaProtocolError(
            f"api key {api_key} v{api_version}: {len(frame) - offset - size} bytes left after the request"
        )
    return Request(api_key, api_version, correlation_id, header.client_id, body)


def encode_response(api_key: int, correlation_id: int, response: Any) -> bytes:
    """The size-prefixed frame of one answer, with the response header its version needs."""
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    buf.write(_SIZE.pack(correlation_id))
    if response.__flexible__ and api_key != API_VERSIONS:
        buf.write(b"\0")  # the response header v1's tagged fields: none
    entity_writer(type(response))(buf, response)
    frame = buf.getbuffer()
    _SIZE.pack_into(frame, 0, len(frame) - _SIZE.size)
    return bytes(frame)


# ---- building kio's classes across versions --------------------------------------------------


def build(cls: type[T], **values: Any) -> T:
    """An instance of one version's class from values named as in any version: the fields this
    version lacks are dropped, the ones it has but values lack take their defaults. One mapping
    then serves every version of an API (their classes differ only by fields added or removed).

    Raises InvariantViolation for a name that no version of the message has: a misspelt field
    would otherwise be dropped like a field of another version, and its value never sent."""
    message: Any = cls  # functools.cache's typing will not take a type[T] as a key
    every_version = _field_names_of_every_version(message)
    unknown = sorted(set(values) - every_version)
    check(
        not unknown,
        "build(%s.%s): no version of %s has the field(s) %s; its fields in any version are %s",
        cls.__module__,
        cls.__qualname__,
        cls.__qualname__,
        unknown,
        sorted(every_version),
    )
    names = _field_names(message)
    return cls(**{k: v for k, v in values.items() if k in names})


@functools.cache
def _field_names(cls: Any) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


@functools.cache
def _field_names_of_every_version(cls: Any) -> frozenset[str]:
    """The field names of `cls`'s message in every version kio has: kio generates one module per
    API, version and entity (kio.schema.<api>.v<N>.<entity>), each defining the message and its
    nested structures under the same class names. A class outside that layout has only its own."""
    *api, version, entity = cls.__module__.split(".")
    if api[:2] != ["kio", "schema"] or not version.startswith("v"):
        return _field_names(cls)
    package = importlib.import_module(".".join(api))
    names: set[str] = set()
    for sibling in pkgutil.iter_modules(package.__path__):
        try:
            module = importlib.import_module(f"{package.__name__}.{sibling.name}.{entity}")
        except ModuleNotFoundError:
            continue  # a version with no such entity
        other = getattr(module, cls.__name__, None)
        if isinstance(other, type) and dataclasses.is_dataclass(other):
            names |= _field_names(other)
    return frozenset(names)


def nested(cls: type[Any], name: str) -> Any:
    """The class `name` defined beside `cls` (a nested structure of the same API version)."""
    return getattr(sys.modules[cls.__module__], name)


def has_field(cls: type[Any], name: str) -> bool:
    return any(f.name == name for f in dataclasses.fields(cls))


# ---- error codes -----------------------------------------------------------------------------


# Our names that Kafka spells otherwise. INVALID_COMMIT_OFFSET (an offset below 0, or past the
# log end) has no Kafka twin: Kafka accepts any offset, so OFFSET_OUT_OF_RANGE is the nearest.
_KAFKA_NAMES = {
    "INVALID_TOPIC": "invalid_topic_exception",
    "STORAGE_ERROR": "kafka_storage_error",
    "INVALID_COMMIT_OFFSET": "offset_out_of_range",
}


def _kafka_code_table() -> dict[int, KafkaErrorCode]:
    """Our ErrorCode values mirror Kafka's by name (clients/common/errors.py); the numbers differ,
    so the table is made by name once and a name Kafka lacks is a bug caught at import."""
    table: dict[int, KafkaErrorCode] = {}
    for name, number in common_pb2.ErrorCode.items():
        try:
            table[number] = KafkaErrorCode[_KAFKA_NAMES.get(name, name.lower())]
        except KeyError:
            raise RuntimeError(f"ErrorCode {name} has no Kafka error code of the same name") from None
    return table


_KAFKA_CODES = _kafka_code_table()


def kafka_error(code: int) -> KafkaErrorCode:
    """Kafka's error code for one of ours (common_pb2.ErrorCode)."""
    return _KAFKA_CODES.get(code, KafkaErrorCode.unknown_server_error)
