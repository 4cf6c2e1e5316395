from protos.highwater.v1 import broker_pb2 as _broker_pb2
from protos.highwater.v1 import common_pb2 as _common_pb2
from protos.highwater.v1 import controller_pb2 as _controller_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OffsetCommitPartition(_message.Message):
    __slots__ = ("partition", "offset", "metadata", "leader_epoch")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    partition: int
    offset: int
    metadata: str
    leader_epoch: int
    def __init__(self, partition: _Optional[int] = ..., offset: _Optional[int] = ..., metadata: _Optional[str] = ..., leader_epoch: _Optional[int] = ...) -> None: ...

class OffsetCommitTopic(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[OffsetCommitPartition]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[OffsetCommitPartition, _Mapping]]] = ...) -> None: ...

class CommitOffsetsRequest(_message.Message):
    __slots__ = ("group_id", "topics", "member_id", "member_epoch")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    topics: _containers.RepeatedCompositeFieldContainer[OffsetCommitTopic]
    member_id: str
    member_epoch: int
    def __init__(self, group_id: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[OffsetCommitTopic, _Mapping]]] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ...) -> None: ...

class CommitOffsetsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "partitions")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.PartitionResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[_common_pb2.PartitionResult, _Mapping]]] = ...) -> None: ...

class ConsumerGroupHeartbeatRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "member_epoch", "instance_id", "rack_id", "rebalance_timeout_ms", "subscribed_topics", "subscription_unchanged", "server_assignor", "owned", "owned_unchanged", "session_timeout_ms", "client_id")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_ID_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_TOPICS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    SERVER_ASSIGNOR_FIELD_NUMBER: _ClassVar[int]
    OWNED_FIELD_NUMBER: _ClassVar[int]
    OWNED_UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str
    rack_id: str
    rebalance_timeout_ms: int
    subscribed_topics: _containers.RepeatedScalarFieldContainer[str]
    subscription_unchanged: bool
    server_assignor: str
    owned: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartition]
    owned_unchanged: bool
    session_timeout_ms: int
    client_id: str
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., instance_id: _Optional[str] = ..., rack_id: _Optional[str] = ..., rebalance_timeout_ms: _Optional[int] = ..., subscribed_topics: _Optional[_Iterable[str]] = ..., subscription_unchanged: _Optional[bool] = ..., server_assignor: _Optional[str] = ..., owned: _Optional[_Iterable[_Union[_common_pb2.TopicPartition, _Mapping]]] = ..., owned_unchanged: _Optional[bool] = ..., session_timeout_ms: _Optional[int] = ..., client_id: _Optional[str] = ...) -> None: ...

class ConsumerGroupHeartbeatResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "member_id", "member_epoch", "heartbeat_interval_ms", "assignment")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartition]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., assignment: _Optional[_Iterable[_Union[_common_pb2.TopicPartition, _Mapping]]] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GroupListing(_message.Message):
    __slots__ = ("group_id", "state", "members", "group_epoch")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    state: str
    members: int
    group_epoch: int
    def __init__(self, group_id: _Optional[str] = ..., state: _Optional[str] = ..., members: _Optional[int] = ..., group_epoch: _Optional[int] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "groups")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    groups: _containers.RepeatedCompositeFieldContainer[GroupListing]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[GroupListing, _Mapping]]] = ...) -> None: ...

class DescribeGroupsRequest(_message.Message):
    __slots__ = ("group_ids",)
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GroupMemberDescription(_message.Message):
    __slots__ = ("member_id", "instance_id", "client_id", "client_host", "member_epoch", "assignment", "target_assignment", "subscribed_topics", "state")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    TARGET_ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_TOPICS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    instance_id: str
    client_id: str
    client_host: str
    member_epoch: int
    assignment: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartition]
    target_assignment: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartition]
    subscribed_topics: _containers.RepeatedScalarFieldContainer[str]
    state: str
    def __init__(self, member_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., client_id: _Optional[str] = ..., client_host: _Optional[str] = ..., member_epoch: _Optional[int] = ..., assignment: _Optional[_Iterable[_Union[_common_pb2.TopicPartition, _Mapping]]] = ..., target_assignment: _Optional[_Iterable[_Union[_common_pb2.TopicPartition, _Mapping]]] = ..., subscribed_topics: _Optional[_Iterable[str]] = ..., state: _Optional[str] = ...) -> None: ...

class GroupDescription(_message.Message):
    __slots__ = ("error_code", "error_message", "group_id", "state", "group_epoch", "target_epoch", "assignor", "members")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TARGET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ASSIGNOR_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    group_id: str
    state: str
    group_epoch: int
    target_epoch: int
    assignor: str
    members: _containers.RepeatedCompositeFieldContainer[GroupMemberDescription]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., group_id: _Optional[str] = ..., state: _Optional[str] = ..., group_epoch: _Optional[int] = ..., target_epoch: _Optional[int] = ..., assignor: _Optional[str] = ..., members: _Optional[_Iterable[_Union[GroupMemberDescription, _Mapping]]] = ...) -> None: ...

class DescribeGroupsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "groups")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    groups: _containers.RepeatedCompositeFieldContainer[GroupDescription]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[GroupDescription, _Mapping]]] = ...) -> None: ...

class DeleteGroupsRequest(_message.Message):
    __slots__ = ("group_ids",)
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteGroupResult(_message.Message):
    __slots__ = ("group_id", "error_code", "error_message")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, group_id: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class DeleteGroupsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "results")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    results: _containers.RepeatedCompositeFieldContainer[DeleteGroupResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., results: _Optional[_Iterable[_Union[DeleteGroupResult, _Mapping]]] = ...) -> None: ...

class FetchCommittedOffsetsRequest(_message.Message):
    __slots__ = ("group_id", "partitions")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartition]
    def __init__(self, group_id: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[_common_pb2.TopicPartition, _Mapping]]] = ...) -> None: ...

class CommittedOffset(_message.Message):
    __slots__ = ("topic", "partition", "offset", "metadata", "leader_epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    metadata: str
    leader_epoch: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., metadata: _Optional[str] = ..., leader_epoch: _Optional[int] = ...) -> None: ...

class FetchCommittedOffsetsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "offsets")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    offsets: _containers.RepeatedCompositeFieldContainer[CommittedOffset]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., offsets: _Optional[_Iterable[_Union[CommittedOffset, _Mapping]]] = ...) -> None: ...

class SubscribePartition(_message.Message):
    __slots__ = ("topic", "partition", "start_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    start_offset: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., start_offset: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("partitions", "max_bytes")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[SubscribePartition]
    max_bytes: int
    def __init__(self, partitions: _Optional[_Iterable[_Union[SubscribePartition, _Mapping]]] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "records", "high_watermark", "next_offset", "error_message")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    records: bytes
    high_watermark: int
    next_offset: int
    error_message: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., records: _Optional[bytes] = ..., high_watermark: _Optional[int] = ..., next_offset: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class RecordHeader(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class ProducerRecord(_message.Message):
    __slots__ = ("key", "value", "headers", "timestamp_ms", "partition")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    headers: _containers.RepeatedCompositeFieldContainer[RecordHeader]
    timestamp_ms: int
    partition: int
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Iterable[_Union[RecordHeader, _Mapping]]] = ..., timestamp_ms: _Optional[int] = ..., partition: _Optional[int] = ...) -> None: ...

class ProduceRecordsRequest(_message.Message):
    __slots__ = ("topic", "records", "request_id", "timeout_ms", "compression", "transactional_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    records: _containers.RepeatedCompositeFieldContainer[ProducerRecord]
    request_id: str
    timeout_ms: int
    compression: str
    transactional_id: str
    def __init__(self, topic: _Optional[str] = ..., records: _Optional[_Iterable[_Union[ProducerRecord, _Mapping]]] = ..., request_id: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., compression: _Optional[str] = ..., transactional_id: _Optional[str] = ...) -> None: ...

class RecordResult(_message.Message):
    __slots__ = ("partition", "offset", "error_code", "error_message", "timestamp_ms")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    offset: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    timestamp_ms: int
    def __init__(self, partition: _Optional[int] = ..., offset: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class ProduceRecordsResponse(_message.Message):
    __slots__ = ("topic", "results", "throttle_time_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    results: _containers.RepeatedCompositeFieldContainer[RecordResult]
    throttle_time_ms: int
    def __init__(self, topic: _Optional[str] = ..., results: _Optional[_Iterable[_Union[RecordResult, _Mapping]]] = ..., throttle_time_ms: _Optional[int] = ...) -> None: ...

class ConsumePartition(_message.Message):
    __slots__ = ("partition", "start_offset")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    partition: int
    start_offset: int
    def __init__(self, partition: _Optional[int] = ..., start_offset: _Optional[int] = ...) -> None: ...

class ConsumeRecordsRequest(_message.Message):
    __slots__ = ("topic", "partitions", "default_start_offset", "group_id", "max_records", "max_records_per_message", "partition_max_bytes", "stop_at_end", "isolation_level")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_PER_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    STOP_AT_END_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[ConsumePartition]
    default_start_offset: int
    group_id: str
    max_records: int
    max_records_per_message: int
    partition_max_bytes: int
    stop_at_end: bool
    isolation_level: int
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[ConsumePartition, _Mapping]]] = ..., default_start_offset: _Optional[int] = ..., group_id: _Optional[str] = ..., max_records: _Optional[int] = ..., max_records_per_message: _Optional[int] = ..., partition_max_bytes: _Optional[int] = ..., stop_at_end: _Optional[bool] = ..., isolation_level: _Optional[int] = ...) -> None: ...

class ConsumedRecord(_message.Message):
    __slots__ = ("topic", "partition", "offset", "timestamp_ms", "timestamp_type", "key", "value", "headers")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_TYPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    timestamp_type: int
    key: bytes
    value: bytes
    headers: _containers.RepeatedCompositeFieldContainer[RecordHeader]
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., timestamp_type: _Optional[int] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Iterable[_Union[RecordHeader, _Mapping]]] = ...) -> None: ...

class ConsumePartitionError(_message.Message):
    __slots__ = ("partition", "error_code", "error_message", "next_offset")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    next_offset: int
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., next_offset: _Optional[int] = ...) -> None: ...

class ConsumeRecordsResponse(_message.Message):
    __slots__ = ("records", "errors")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[ConsumedRecord]
    errors: _containers.RepeatedCompositeFieldContainer[ConsumePartitionError]
    def __init__(self, records: _Optional[_Iterable[_Union[ConsumedRecord, _Mapping]]] = ..., errors: _Optional[_Iterable[_Union[ConsumePartitionError, _Mapping]]] = ...) -> None: ...

class AddPartitionsToTxnRequest(_message.Message):
    __slots__ = ("transactional_id", "producer_id", "producer_epoch", "partitions")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartition]
    def __init__(self, transactional_id: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[_common_pb2.TopicPartition, _Mapping]]] = ...) -> None: ...

class AddPartitionsToTxnResponse(_message.Message):
    __slots__ = ("error_code", "error_message")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class AddOffsetsToTxnRequest(_message.Message):
    __slots__ = ("transactional_id", "producer_id", "producer_epoch", "group_id")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str
    def __init__(self, transactional_id: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., group_id: _Optional[str] = ...) -> None: ...

class AddOffsetsToTxnResponse(_message.Message):
    __slots__ = ("error_code", "error_message")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class TxnOffsetCommitRequest(_message.Message):
    __slots__ = ("transactional_id", "producer_id", "producer_epoch", "group_id", "member_id", "member_epoch", "topics")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str
    member_id: str
    member_epoch: int
    topics: _containers.RepeatedCompositeFieldContainer[OffsetCommitTopic]
    def __init__(self, transactional_id: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[OffsetCommitTopic, _Mapping]]] = ...) -> None: ...

class TxnOffsetCommitResponse(_message.Message):
    __slots__ = ("error_code", "error_message")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class EndTxnRequest(_message.Message):
    __slots__ = ("transactional_id", "producer_id", "producer_epoch", "commit")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    def __init__(self, transactional_id: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., commit: _Optional[bool] = ...) -> None: ...

class EndTxnResponse(_message.Message):
    __slots__ = ("error_code", "error_message")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class ListTransactionsRequest(_message.Message):
    __slots__ = ("states", "producer_ids", "older_than_ms")
    STATES_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_IDS_FIELD_NUMBER: _ClassVar[int]
    OLDER_THAN_MS_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[str]
    producer_ids: _containers.RepeatedScalarFieldContainer[int]
    older_than_ms: int
    def __init__(self, states: _Optional[_Iterable[str]] = ..., producer_ids: _Optional[_Iterable[int]] = ..., older_than_ms: _Optional[int] = ...) -> None: ...

class TransactionListing(_message.Message):
    __slots__ = ("transactional_id", "producer_id", "state")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    producer_id: int
    state: str
    def __init__(self, transactional_id: _Optional[str] = ..., producer_id: _Optional[int] = ..., state: _Optional[str] = ...) -> None: ...

class ListTransactionsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "transactions", "unknown_state_filters")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_STATE_FILTERS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    transactions: _containers.RepeatedCompositeFieldContainer[TransactionListing]
    unknown_state_filters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., transactions: _Optional[_Iterable[_Union[TransactionListing, _Mapping]]] = ..., unknown_state_filters: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeTransactionsRequest(_message.Message):
    __slots__ = ("transactional_ids",)
    TRANSACTIONAL_IDS_FIELD_NUMBER: _ClassVar[int]
    transactional_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, transactional_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class TransactionDescription(_message.Message):
    __slots__ = ("transactional_id", "error_code", "error_message", "state", "producer_id", "producer_epoch", "transaction_timeout_ms", "transaction_start_time_ms", "partitions", "groups")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_START_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_time_ms: int
    partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartition]
    groups: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, transactional_id: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., state: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., transaction_timeout_ms: _Optional[int] = ..., transaction_start_time_ms: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[_common_pb2.TopicPartition, _Mapping]]] = ..., groups: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeTransactionsResponse(_message.Message):
    __slots__ = ("transactions",)
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    transactions: _containers.RepeatedCompositeFieldContainer[TransactionDescription]
    def __init__(self, transactions: _Optional[_Iterable[_Union[TransactionDescription, _Mapping]]] = ...) -> None: ...

class AbortTransactionRequest(_message.Message):
    __slots__ = ("transactional_id",)
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    def __init__(self, transactional_id: _Optional[str] = ...) -> None: ...

class AbortTransactionResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "producer_id", "producer_epoch")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    producer_id: int
    producer_epoch: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ...) -> None: ...
