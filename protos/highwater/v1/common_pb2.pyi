from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NONE: _ClassVar[ErrorCode]
    NOT_LEADER_OR_FOLLOWER: _ClassVar[ErrorCode]
    UNKNOWN_TOPIC_OR_PARTITION: _ClassVar[ErrorCode]
    OFFSET_OUT_OF_RANGE: _ClassVar[ErrorCode]
    FENCED_LEADER_EPOCH: _ClassVar[ErrorCode]
    UNKNOWN_LEADER_EPOCH: _ClassVar[ErrorCode]
    STALE_CONTROLLER_EPOCH: _ClassVar[ErrorCode]
    STALE_BROKER_EPOCH: _ClassVar[ErrorCode]
    NOT_ENOUGH_REPLICAS: _ClassVar[ErrorCode]
    NOT_ENOUGH_REPLICAS_AFTER_APPEND: _ClassVar[ErrorCode]
    REQUEST_TIMED_OUT: _ClassVar[ErrorCode]
    CORRUPT_MESSAGE: _ClassVar[ErrorCode]
    MESSAGE_TOO_LARGE: _ClassVar[ErrorCode]
    INVALID_TOPIC: _ClassVar[ErrorCode]
    TOPIC_ALREADY_EXISTS: _ClassVar[ErrorCode]
    INVALID_REPLICATION_FACTOR: _ClassVar[ErrorCode]
    INVALID_PARTITIONS: _ClassVar[ErrorCode]
    NOT_CONTROLLER: _ClassVar[ErrorCode]
    TOPIC_AUTHORIZATION_FAILED: _ClassVar[ErrorCode]
    CLUSTER_AUTHORIZATION_FAILED: _ClassVar[ErrorCode]
    OUT_OF_ORDER_SEQUENCE_NUMBER: _ClassVar[ErrorCode]
    DUPLICATE_SEQUENCE_NUMBER: _ClassVar[ErrorCode]
    INVALID_PRODUCER_EPOCH: _ClassVar[ErrorCode]
    STORAGE_ERROR: _ClassVar[ErrorCode]
    INVALID_REQUEST: _ClassVar[ErrorCode]
    INVALID_REPLICA_ASSIGNMENT: _ClassVar[ErrorCode]
    NO_REASSIGNMENT_IN_PROGRESS: _ClassVar[ErrorCode]
    ELECTION_NOT_NEEDED: _ClassVar[ErrorCode]
    PREFERRED_LEADER_NOT_AVAILABLE: _ClassVar[ErrorCode]
    ELIGIBLE_LEADERS_NOT_AVAILABLE: _ClassVar[ErrorCode]
    LEADER_NOT_AVAILABLE: _ClassVar[ErrorCode]
    INVALID_CONFIG: _ClassVar[ErrorCode]
    TOPIC_DELETION_DISABLED: _ClassVar[ErrorCode]
    BROKER_NOT_AVAILABLE: _ClassVar[ErrorCode]
    UNKNOWN_SERVER_ERROR: _ClassVar[ErrorCode]
    INVALID_UPDATE_VERSION: _ClassVar[ErrorCode]
    UNKNOWN_MEMBER_ID: _ClassVar[ErrorCode]
    INVALID_COMMIT_OFFSET: _ClassVar[ErrorCode]
    INVALID_TIMESTAMP: _ClassVar[ErrorCode]
    INVALID_RECORD: _ClassVar[ErrorCode]
    POLICY_VIOLATION: _ClassVar[ErrorCode]
    NON_EMPTY_GROUP: _ClassVar[ErrorCode]
    GROUP_ID_NOT_FOUND: _ClassVar[ErrorCode]
    GROUP_MAX_SIZE_REACHED: _ClassVar[ErrorCode]
    FENCED_MEMBER_EPOCH: _ClassVar[ErrorCode]
    UNRELEASED_INSTANCE_ID: _ClassVar[ErrorCode]
    UNSUPPORTED_ASSIGNOR: _ClassVar[ErrorCode]
    STALE_MEMBER_EPOCH: _ClassVar[ErrorCode]
    INVALID_TXN_STATE: _ClassVar[ErrorCode]
    INVALID_PRODUCER_ID_MAPPING: _ClassVar[ErrorCode]
    INVALID_TRANSACTION_TIMEOUT: _ClassVar[ErrorCode]
    CONCURRENT_TRANSACTIONS: _ClassVar[ErrorCode]
    PRODUCER_FENCED: _ClassVar[ErrorCode]
    TRANSACTIONAL_ID_NOT_FOUND: _ClassVar[ErrorCode]
    COORDINATOR_NOT_AVAILABLE: _ClassVar[ErrorCode]
    FETCH_SESSION_ID_NOT_FOUND: _ClassVar[ErrorCode]
    INVALID_FETCH_SESSION_EPOCH: _ClassVar[ErrorCode]
    INCONSISTENT_TOPIC_ID: _ClassVar[ErrorCode]

class ElectionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PREFERRED: _ClassVar[ElectionType]
    UNCLEAN: _ClassVar[ElectionType]
NONE: ErrorCode
NOT_LEADER_OR_FOLLOWER: ErrorCode
UNKNOWN_TOPIC_OR_PARTITION: ErrorCode
OFFSET_OUT_OF_RANGE: ErrorCode
FENCED_LEADER_EPOCH: ErrorCode
UNKNOWN_LEADER_EPOCH: ErrorCode
STALE_CONTROLLER_EPOCH: ErrorCode
STALE_BROKER_EPOCH: ErrorCode
NOT_ENOUGH_REPLICAS: ErrorCode
NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode
REQUEST_TIMED_OUT: ErrorCode
CORRUPT_MESSAGE: ErrorCode
MESSAGE_TOO_LARGE: ErrorCode
INVALID_TOPIC: ErrorCode
TOPIC_ALREADY_EXISTS: ErrorCode
INVALID_REPLICATION_FACTOR: ErrorCode
INVALID_PARTITIONS: ErrorCode
NOT_CONTROLLER: ErrorCode
TOPIC_AUTHORIZATION_FAILED: ErrorCode
CLUSTER_AUTHORIZATION_FAILED: ErrorCode
OUT_OF_ORDER_SEQUENCE_NUMBER: ErrorCode
DUPLICATE_SEQUENCE_NUMBER: ErrorCode
INVALID_PRODUCER_EPOCH: ErrorCode
STORAGE_ERROR: ErrorCode
INVALID_REQUEST: ErrorCode
INVALID_REPLICA_ASSIGNMENT: ErrorCode
NO_REASSIGNMENT_IN_PROGRESS: ErrorCode
ELECTION_NOT_NEEDED: ErrorCode
PREFERRED_LEADER_NOT_AVAILABLE: ErrorCode
ELIGIBLE_LEADERS_NOT_AVAILABLE: ErrorCode
LEADER_NOT_AVAILABLE: ErrorCode
INVALID_CONFIG: ErrorCode
TOPIC_DELETION_DISABLED: ErrorCode
BROKER_NOT_AVAILABLE: ErrorCode
UNKNOWN_SERVER_ERROR: ErrorCode
INVALID_UPDATE_VERSION: ErrorCode
UNKNOWN_MEMBER_ID: ErrorCode
INVALID_COMMIT_OFFSET: ErrorCode
INVALID_TIMESTAMP: ErrorCode
INVALID_RECORD: ErrorCode
POLICY_VIOLATION: ErrorCode
NON_EMPTY_GROUP: ErrorCode
GROUP_ID_NOT_FOUND: ErrorCode
GROUP_MAX_SIZE_REACHED: ErrorCode
FENCED_MEMBER_EPOCH: ErrorCode
UNRELEASED_INSTANCE_ID: ErrorCode
UNSUPPORTED_ASSIGNOR: ErrorCode
STALE_MEMBER_EPOCH: ErrorCode
INVALID_TXN_STATE: ErrorCode
INVALID_PRODUCER_ID_MAPPING: ErrorCode
INVALID_TRANSACTION_TIMEOUT: ErrorCode
CONCURRENT_TRANSACTIONS: ErrorCode
PRODUCER_FENCED: ErrorCode
TRANSACTIONAL_ID_NOT_FOUND: ErrorCode
COORDINATOR_NOT_AVAILABLE: ErrorCode
FETCH_SESSION_ID_NOT_FOUND: ErrorCode
INVALID_FETCH_SESSION_EPOCH: ErrorCode
INCONSISTENT_TOPIC_ID: ErrorCode
PREFERRED: ElectionType
UNCLEAN: ElectionType

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    message: str
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class TopicPartition(_message.Message):
    __slots__ = ("topic", "partition")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...

class BrokerNode(_message.Message):
    __slots__ = ("broker_id", "host", "port", "rack", "metrics_port", "broker_epoch")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    host: str
    port: int
    rack: str
    metrics_port: int
    broker_epoch: int
    def __init__(self, broker_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., rack: _Optional[str] = ..., metrics_port: _Optional[int] = ..., broker_epoch: _Optional[int] = ...) -> None: ...

class GatewayNode(_message.Message):
    __slots__ = ("gateway_id", "host", "port")
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    gateway_id: int
    host: str
    port: int
    def __init__(self, gateway_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class PartitionState(_message.Message):
    __slots__ = ("topic", "partition", "leader", "leader_epoch", "isr", "replicas", "controller_epoch", "partition_epoch", "adding_replicas", "removing_replicas", "topic_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ADDING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REMOVING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    isr: _containers.RepeatedScalarFieldContainer[int]
    replicas: _containers.RepeatedScalarFieldContainer[int]
    controller_epoch: int
    partition_epoch: int
    adding_replicas: _containers.RepeatedScalarFieldContainer[int]
    removing_replicas: _containers.RepeatedScalarFieldContainer[int]
    topic_id: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., leader: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., isr: _Optional[_Iterable[int]] = ..., replicas: _Optional[_Iterable[int]] = ..., controller_epoch: _Optional[int] = ..., partition_epoch: _Optional[int] = ..., adding_replicas: _Optional[_Iterable[int]] = ..., removing_replicas: _Optional[_Iterable[int]] = ..., topic_id: _Optional[str] = ...) -> None: ...

class TopicConfig(_message.Message):
    __slots__ = ("min_insync_replicas", "unclean_leader_election_enable", "retention_ms", "retention_bytes", "segment_bytes", "segment_ms", "max_message_bytes", "message_timestamp_type", "message_timestamp_before_max_ms", "message_timestamp_after_max_ms", "cleanup_policy", "unserved_configs", "min_cleanable_dirty_ratio", "min_compaction_lag_ms", "max_compaction_lag_ms", "delete_retention_ms")
    class UnservedConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MIN_INSYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    UNCLEAN_LEADER_ELECTION_ENABLE_FIELD_NUMBER: _ClassVar[int]
    RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_BYTES_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TIMESTAMP_TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TIMESTAMP_BEFORE_MAX_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TIMESTAMP_AFTER_MAX_MS_FIELD_NUMBER: _ClassVar[int]
    CLEANUP_POLICY_FIELD_NUMBER: _ClassVar[int]
    UNSERVED_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    MIN_CLEANABLE_DIRTY_RATIO_FIELD_NUMBER: _ClassVar[int]
    MIN_COMPACTION_LAG_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_COMPACTION_LAG_MS_FIELD_NUMBER: _ClassVar[int]
    DELETE_RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    min_insync_replicas: int
    unclean_leader_election_enable: bool
    retention_ms: int
    retention_bytes: int
    segment_bytes: int
    segment_ms: int
    max_message_bytes: int
    message_timestamp_type: str
    message_timestamp_before_max_ms: int
    message_timestamp_after_max_ms: int
    cleanup_policy: str
    unserved_configs: _containers.ScalarMap[str, str]
    min_cleanable_dirty_ratio: float
    min_compaction_lag_ms: int
    max_compaction_lag_ms: int
    delete_retention_ms: int
    def __init__(self, min_insync_replicas: _Optional[int] = ..., unclean_leader_election_enable: _Optional[bool] = ..., retention_ms: _Optional[int] = ..., retention_bytes: _Optional[int] = ..., segment_bytes: _Optional[int] = ..., segment_ms: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., message_timestamp_type: _Optional[str] = ..., message_timestamp_before_max_ms: _Optional[int] = ..., message_timestamp_after_max_ms: _Optional[int] = ..., cleanup_policy: _Optional[str] = ..., unserved_configs: _Optional[_Mapping[str, str]] = ..., min_cleanable_dirty_ratio: _Optional[float] = ..., min_compaction_lag_ms: _Optional[int] = ..., max_compaction_lag_ms: _Optional[int] = ..., delete_retention_ms: _Optional[int] = ...) -> None: ...

class ControllerHeader(_message.Message):
    __slots__ = ("controller_id", "controller_epoch", "broker_epoch")
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    controller_id: int
    controller_epoch: int
    broker_epoch: int
    def __init__(self, controller_id: _Optional[int] = ..., controller_epoch: _Optional[int] = ..., broker_epoch: _Optional[int] = ...) -> None: ...

class PartitionMetadata(_message.Message):
    __slots__ = ("partition", "leader", "leader_epoch", "replicas", "isr", "offline_replicas", "error_code")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    OFFLINE_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    partition: int
    leader: int
    leader_epoch: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    isr: _containers.RepeatedScalarFieldContainer[int]
    offline_replicas: _containers.RepeatedScalarFieldContainer[int]
    error_code: ErrorCode
    def __init__(self, partition: _Optional[int] = ..., leader: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., isr: _Optional[_Iterable[int]] = ..., offline_replicas: _Optional[_Iterable[int]] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ...) -> None: ...

class TopicMetadata(_message.Message):
    __slots__ = ("name", "topic_id", "error_code", "error_message", "partitions", "config")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    name: str
    topic_id: str
    error_code: ErrorCode
    error_message: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionMetadata]
    config: TopicConfig
    def __init__(self, name: _Optional[str] = ..., topic_id: _Optional[str] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionMetadata, _Mapping]]] = ..., config: _Optional[_Union[TopicConfig, _Mapping]] = ...) -> None: ...

class MetadataRequest(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class MetadataResponse(_message.Message):
    __slots__ = ("brokers", "controller_id", "topics", "gateways", "cluster_id")
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    GATEWAYS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerNode]
    controller_id: int
    topics: _containers.RepeatedCompositeFieldContainer[TopicMetadata]
    gateways: _containers.RepeatedCompositeFieldContainer[GatewayNode]
    cluster_id: str
    def __init__(self, brokers: _Optional[_Iterable[_Union[BrokerNode, _Mapping]]] = ..., controller_id: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[TopicMetadata, _Mapping]]] = ..., gateways: _Optional[_Iterable[_Union[GatewayNode, _Mapping]]] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class ProducePartitionData(_message.Message):
    __slots__ = ("partition", "records")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    records: bytes
    def __init__(self, partition: _Optional[int] = ..., records: _Optional[bytes] = ...) -> None: ...

class ProduceTopicData(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[ProducePartitionData]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[ProducePartitionData, _Mapping]]] = ...) -> None: ...

class ProduceRequest(_message.Message):
    __slots__ = ("acks", "timeout_ms", "topics", "transactional_id")
    ACKS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    acks: int
    timeout_ms: int
    topics: _containers.RepeatedCompositeFieldContainer[ProduceTopicData]
    transactional_id: str
    def __init__(self, acks: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[ProduceTopicData, _Mapping]]] = ..., transactional_id: _Optional[str] = ...) -> None: ...

class ProducePartitionResponse(_message.Message):
    __slots__ = ("partition", "error_code", "base_offset", "log_append_time_ms", "log_start_offset", "error_message")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_APPEND_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: ErrorCode
    base_offset: int
    log_append_time_ms: int
    log_start_offset: int
    error_message: str
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., base_offset: _Optional[int] = ..., log_append_time_ms: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class ProduceTopicResponse(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[ProducePartitionResponse]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[ProducePartitionResponse, _Mapping]]] = ...) -> None: ...

class ProduceResponse(_message.Message):
    __slots__ = ("topics", "throttle_time_ms")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[ProduceTopicResponse]
    throttle_time_ms: int
    def __init__(self, topics: _Optional[_Iterable[_Union[ProduceTopicResponse, _Mapping]]] = ..., throttle_time_ms: _Optional[int] = ...) -> None: ...

class FetchPartition(_message.Message):
    __slots__ = ("partition", "fetch_offset", "partition_max_bytes", "current_leader_epoch", "log_start_offset")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    FETCH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PARTITION_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int
    log_start_offset: int
    def __init__(self, partition: _Optional[int] = ..., fetch_offset: _Optional[int] = ..., partition_max_bytes: _Optional[int] = ..., current_leader_epoch: _Optional[int] = ..., log_start_offset: _Optional[int] = ...) -> None: ...

class FetchTopic(_message.Message):
    __slots__ = ("topic", "partitions", "topic_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[FetchPartition]
    topic_id: str
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[FetchPartition, _Mapping]]] = ..., topic_id: _Optional[str] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("replica_id", "max_wait_ms", "min_bytes", "max_bytes", "topics", "replica_epoch", "isolation_level", "locate_records", "session")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    LOCATE_RECORDS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    topics: _containers.RepeatedCompositeFieldContainer[FetchTopic]
    replica_epoch: int
    isolation_level: int
    locate_records: bool
    session: FetchSession
    def __init__(self, replica_id: _Optional[int] = ..., max_wait_ms: _Optional[int] = ..., min_bytes: _Optional[int] = ..., max_bytes: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[FetchTopic, _Mapping]]] = ..., replica_epoch: _Optional[int] = ..., isolation_level: _Optional[int] = ..., locate_records: _Optional[bool] = ..., session: _Optional[_Union[FetchSession, _Mapping]] = ...) -> None: ...

class FetchSession(_message.Message):
    __slots__ = ("id", "epoch", "forgotten")
    ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FORGOTTEN_FIELD_NUMBER: _ClassVar[int]
    id: int
    epoch: int
    forgotten: _containers.RepeatedCompositeFieldContainer[TopicPartition]
    def __init__(self, id: _Optional[int] = ..., epoch: _Optional[int] = ..., forgotten: _Optional[_Iterable[_Union[TopicPartition, _Mapping]]] = ...) -> None: ...

class RecordsLocation(_message.Message):
    __slots__ = ("path", "position", "size", "device", "inode", "host_id")
    PATH_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    path: str
    position: int
    size: int
    device: int
    inode: int
    host_id: str
    def __init__(self, path: _Optional[str] = ..., position: _Optional[int] = ..., size: _Optional[int] = ..., device: _Optional[int] = ..., inode: _Optional[int] = ..., host_id: _Optional[str] = ...) -> None: ...

class FetchPartitionResponse(_message.Message):
    __slots__ = ("partition", "error_code", "high_watermark", "log_start_offset", "log_end_offset", "records", "error_message", "leader_epoch", "records_location", "last_stable_offset", "aborted_transactions")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    RECORDS_LOCATION_FIELD_NUMBER: _ClassVar[int]
    LAST_STABLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ABORTED_TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: ErrorCode
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    records: bytes
    error_message: str
    leader_epoch: int
    records_location: RecordsLocation
    last_stable_offset: int
    aborted_transactions: _containers.RepeatedCompositeFieldContainer[AbortedTransaction]
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., high_watermark: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., log_end_offset: _Optional[int] = ..., records: _Optional[bytes] = ..., error_message: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., records_location: _Optional[_Union[RecordsLocation, _Mapping]] = ..., last_stable_offset: _Optional[int] = ..., aborted_transactions: _Optional[_Iterable[_Union[AbortedTransaction, _Mapping]]] = ...) -> None: ...

class AbortedTransaction(_message.Message):
    __slots__ = ("producer_id", "first_offset")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    first_offset: int
    def __init__(self, producer_id: _Optional[int] = ..., first_offset: _Optional[int] = ...) -> None: ...

class FetchTopicResponse(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[FetchPartitionResponse]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[FetchPartitionResponse, _Mapping]]] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("topics", "throttle_time_ms", "error_code", "session_id")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[FetchTopicResponse]
    throttle_time_ms: int
    error_code: ErrorCode
    session_id: int
    def __init__(self, topics: _Optional[_Iterable[_Union[FetchTopicResponse, _Mapping]]] = ..., throttle_time_ms: _Optional[int] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., session_id: _Optional[int] = ...) -> None: ...

class ListOffsetsPartition(_message.Message):
    __slots__ = ("partition", "timestamp", "current_leader_epoch")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    partition: int
    timestamp: int
    current_leader_epoch: int
    def __init__(self, partition: _Optional[int] = ..., timestamp: _Optional[int] = ..., current_leader_epoch: _Optional[int] = ...) -> None: ...

class ListOffsetsTopic(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[ListOffsetsPartition]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[ListOffsetsPartition, _Mapping]]] = ...) -> None: ...

class ListOffsetsRequest(_message.Message):
    __slots__ = ("replica_id", "topics", "isolation_level")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    replica_id: int
    topics: _containers.RepeatedCompositeFieldContainer[ListOffsetsTopic]
    isolation_level: int
    def __init__(self, replica_id: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[ListOffsetsTopic, _Mapping]]] = ..., isolation_level: _Optional[int] = ...) -> None: ...

class ListOffsetsPartitionResponse(_message.Message):
    __slots__ = ("partition", "error_code", "timestamp", "offset", "leader_epoch", "error_message")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: ErrorCode
    timestamp: int
    offset: int
    leader_epoch: int
    error_message: str
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., timestamp: _Optional[int] = ..., offset: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class ListOffsetsTopicResponse(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[ListOffsetsPartitionResponse]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[ListOffsetsPartitionResponse, _Mapping]]] = ...) -> None: ...

class ListOffsetsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[ListOffsetsTopicResponse]
    def __init__(self, topics: _Optional[_Iterable[_Union[ListOffsetsTopicResponse, _Mapping]]] = ...) -> None: ...

class DeleteRecordsPartition(_message.Message):
    __slots__ = ("partition", "offset")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    partition: int
    offset: int
    def __init__(self, partition: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class DeleteRecordsTopic(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[DeleteRecordsPartition]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[DeleteRecordsPartition, _Mapping]]] = ...) -> None: ...

class DeleteRecordsRequest(_message.Message):
    __slots__ = ("topics", "timeout_ms")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[DeleteRecordsTopic]
    timeout_ms: int
    def __init__(self, topics: _Optional[_Iterable[_Union[DeleteRecordsTopic, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class DeleteRecordsPartitionResponse(_message.Message):
    __slots__ = ("partition", "error_code", "low_watermark", "error_message")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    LOW_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: ErrorCode
    low_watermark: int
    error_message: str
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., low_watermark: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class DeleteRecordsTopicResponse(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[DeleteRecordsPartitionResponse]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[DeleteRecordsPartitionResponse, _Mapping]]] = ...) -> None: ...

class DeleteRecordsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[DeleteRecordsTopicResponse]
    def __init__(self, topics: _Optional[_Iterable[_Union[DeleteRecordsTopicResponse, _Mapping]]] = ...) -> None: ...

class DescribeLogDirsPartition(_message.Message):
    __slots__ = ("partition",)
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    partition: int
    def __init__(self, partition: _Optional[int] = ...) -> None: ...

class DescribeLogDirsTopic(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[DescribeLogDirsPartition]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[DescribeLogDirsPartition, _Mapping]]] = ...) -> None: ...

class DescribeLogDirsRequest(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[DescribeLogDirsTopic]
    def __init__(self, topics: _Optional[_Iterable[_Union[DescribeLogDirsTopic, _Mapping]]] = ...) -> None: ...

class DescribeLogDirsPartitionResponse(_message.Message):
    __slots__ = ("partition", "error_code", "error_message", "broker_id", "log_dir", "size_bytes", "log_start_offset", "log_end_offset", "high_watermark", "cleanup_policy", "compacted", "dirty_ratio", "cleaner_lag_ms", "first_dirty_offset", "uncleanable", "uncleanable_reason", "last_cleaned_ms", "last_stable_offset")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    LOG_DIR_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    CLEANUP_POLICY_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_FIELD_NUMBER: _ClassVar[int]
    DIRTY_RATIO_FIELD_NUMBER: _ClassVar[int]
    CLEANER_LAG_MS_FIELD_NUMBER: _ClassVar[int]
    FIRST_DIRTY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    UNCLEANABLE_FIELD_NUMBER: _ClassVar[int]
    UNCLEANABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    LAST_CLEANED_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_STABLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: ErrorCode
    error_message: str
    broker_id: int
    log_dir: str
    size_bytes: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    cleanup_policy: str
    compacted: bool
    dirty_ratio: float
    cleaner_lag_ms: int
    first_dirty_offset: int
    uncleanable: bool
    uncleanable_reason: str
    last_cleaned_ms: int
    last_stable_offset: int
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., broker_id: _Optional[int] = ..., log_dir: _Optional[str] = ..., size_bytes: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., log_end_offset: _Optional[int] = ..., high_watermark: _Optional[int] = ..., cleanup_policy: _Optional[str] = ..., compacted: _Optional[bool] = ..., dirty_ratio: _Optional[float] = ..., cleaner_lag_ms: _Optional[int] = ..., first_dirty_offset: _Optional[int] = ..., uncleanable: _Optional[bool] = ..., uncleanable_reason: _Optional[str] = ..., last_cleaned_ms: _Optional[int] = ..., last_stable_offset: _Optional[int] = ...) -> None: ...

class DescribeLogDirsTopicResponse(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[DescribeLogDirsPartitionResponse]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[DescribeLogDirsPartitionResponse, _Mapping]]] = ...) -> None: ...

class DescribeLogDirsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[DescribeLogDirsTopicResponse]
    def __init__(self, topics: _Optional[_Iterable[_Union[DescribeLogDirsTopicResponse, _Mapping]]] = ...) -> None: ...

class CreatableTopic(_message.Message):
    __slots__ = ("name", "num_partitions", "replication_factor", "assignments", "configs")
    class AssignmentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: ReplicaList
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[ReplicaList, _Mapping]] = ...) -> None: ...
    class ConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    num_partitions: int
    replication_factor: int
    assignments: _containers.MessageMap[int, ReplicaList]
    configs: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., num_partitions: _Optional[int] = ..., replication_factor: _Optional[int] = ..., assignments: _Optional[_Mapping[int, ReplicaList]] = ..., configs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ReplicaList(_message.Message):
    __slots__ = ("replicas",)
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, replicas: _Optional[_Iterable[int]] = ...) -> None: ...

class CreateTopicsRequest(_message.Message):
    __slots__ = ("topics", "timeout_ms", "validate_only")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[CreatableTopic]
    timeout_ms: int
    validate_only: bool
    def __init__(self, topics: _Optional[_Iterable[_Union[CreatableTopic, _Mapping]]] = ..., timeout_ms: _Optional[int] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class TopicResult(_message.Message):
    __slots__ = ("name", "error_code", "error_message", "topic_id", "num_partitions", "replication_factor")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    error_code: ErrorCode
    error_message: str
    topic_id: str
    num_partitions: int
    replication_factor: int
    def __init__(self, name: _Optional[str] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., topic_id: _Optional[str] = ..., num_partitions: _Optional[int] = ..., replication_factor: _Optional[int] = ...) -> None: ...

class CreateTopicsResponse(_message.Message):
    __slots__ = ("topics", "error_code", "error_message", "active_controller")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicResult]
    error_code: ErrorCode
    error_message: str
    active_controller: NotControllerInfo
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicResult, _Mapping]]] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., active_controller: _Optional[_Union[NotControllerInfo, _Mapping]] = ...) -> None: ...

class DeleteTopicsRequest(_message.Message):
    __slots__ = ("names", "timeout_ms")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    timeout_ms: int
    def __init__(self, names: _Optional[_Iterable[str]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class DeleteTopicsResponse(_message.Message):
    __slots__ = ("topics", "error_code", "error_message", "active_controller")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicResult]
    error_code: ErrorCode
    error_message: str
    active_controller: NotControllerInfo
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicResult, _Mapping]]] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., active_controller: _Optional[_Union[NotControllerInfo, _Mapping]] = ...) -> None: ...

class CreatePartitionsTopic(_message.Message):
    __slots__ = ("name", "count", "assignments")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    assignments: _containers.RepeatedCompositeFieldContainer[ReplicaList]
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ..., assignments: _Optional[_Iterable[_Union[ReplicaList, _Mapping]]] = ...) -> None: ...

class CreatePartitionsRequest(_message.Message):
    __slots__ = ("topics", "timeout_ms", "validate_only")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[CreatePartitionsTopic]
    timeout_ms: int
    validate_only: bool
    def __init__(self, topics: _Optional[_Iterable[_Union[CreatePartitionsTopic, _Mapping]]] = ..., timeout_ms: _Optional[int] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class CreatePartitionsResponse(_message.Message):
    __slots__ = ("topics", "error_code", "error_message", "active_controller")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicResult]
    error_code: ErrorCode
    error_message: str
    active_controller: NotControllerInfo
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicResult, _Mapping]]] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., active_controller: _Optional[_Union[NotControllerInfo, _Mapping]] = ...) -> None: ...

class AlterTopicConfigsTopic(_message.Message):
    __slots__ = ("name", "set_configs", "delete_configs", "replace")
    class SetConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    SET_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    DELETE_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    name: str
    set_configs: _containers.ScalarMap[str, str]
    delete_configs: _containers.RepeatedScalarFieldContainer[str]
    replace: bool
    def __init__(self, name: _Optional[str] = ..., set_configs: _Optional[_Mapping[str, str]] = ..., delete_configs: _Optional[_Iterable[str]] = ..., replace: _Optional[bool] = ...) -> None: ...

class AlterTopicConfigsRequest(_message.Message):
    __slots__ = ("topics", "timeout_ms", "validate_only")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[AlterTopicConfigsTopic]
    timeout_ms: int
    validate_only: bool
    def __init__(self, topics: _Optional[_Iterable[_Union[AlterTopicConfigsTopic, _Mapping]]] = ..., timeout_ms: _Optional[int] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class AlterTopicConfigsResponse(_message.Message):
    __slots__ = ("topics", "error_code", "error_message", "active_controller")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicResult]
    error_code: ErrorCode
    error_message: str
    active_controller: NotControllerInfo
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicResult, _Mapping]]] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., active_controller: _Optional[_Union[NotControllerInfo, _Mapping]] = ...) -> None: ...

class ReassignablePartition(_message.Message):
    __slots__ = ("partition", "replicas", "cancel")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    cancel: bool
    def __init__(self, partition: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., cancel: _Optional[bool] = ...) -> None: ...

class ReassignableTopic(_message.Message):
    __slots__ = ("name", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: _containers.RepeatedCompositeFieldContainer[ReassignablePartition]
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[ReassignablePartition, _Mapping]]] = ...) -> None: ...

class AlterPartitionReassignmentsRequest(_message.Message):
    __slots__ = ("topics", "timeout_ms")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[ReassignableTopic]
    timeout_ms: int
    def __init__(self, topics: _Optional[_Iterable[_Union[ReassignableTopic, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class PartitionResult(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: ErrorCode
    error_message: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class AlterPartitionReassignmentsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "partitions", "active_controller")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionResult]
    active_controller: NotControllerInfo
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionResult, _Mapping]]] = ..., active_controller: _Optional[_Union[NotControllerInfo, _Mapping]] = ...) -> None: ...

class ListPartitionReassignmentsRequest(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[TopicPartition]
    def __init__(self, partitions: _Optional[_Iterable[_Union[TopicPartition, _Mapping]]] = ...) -> None: ...

class OngoingReassignment(_message.Message):
    __slots__ = ("topic", "partition", "replicas", "adding_replicas", "removing_replicas")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ADDING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REMOVING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    adding_replicas: _containers.RepeatedScalarFieldContainer[int]
    removing_replicas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., adding_replicas: _Optional[_Iterable[int]] = ..., removing_replicas: _Optional[_Iterable[int]] = ...) -> None: ...

class ListPartitionReassignmentsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "reassignments", "active_controller")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    reassignments: _containers.RepeatedCompositeFieldContainer[OngoingReassignment]
    active_controller: NotControllerInfo
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., reassignments: _Optional[_Iterable[_Union[OngoingReassignment, _Mapping]]] = ..., active_controller: _Optional[_Union[NotControllerInfo, _Mapping]] = ...) -> None: ...

class ElectLeadersRequest(_message.Message):
    __slots__ = ("election_type", "partitions", "timeout_ms")
    ELECTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    election_type: ElectionType
    partitions: _containers.RepeatedCompositeFieldContainer[TopicPartition]
    timeout_ms: int
    def __init__(self, election_type: _Optional[_Union[ElectionType, str]] = ..., partitions: _Optional[_Iterable[_Union[TopicPartition, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ElectLeadersResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "partitions", "active_controller")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionResult]
    active_controller: NotControllerInfo
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionResult, _Mapping]]] = ..., active_controller: _Optional[_Union[NotControllerInfo, _Mapping]] = ...) -> None: ...

class DescribeClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeClusterResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "cluster_id", "controller_id", "controller_epoch", "brokers", "gateways", "controller_host", "controller_port", "partitions", "topic_configs", "active_controller", "etcd_space")
    class TopicConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: TopicConfig
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[TopicConfig, _Mapping]] = ...) -> None: ...
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    GATEWAYS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_HOST_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_PORT_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    ETCD_SPACE_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    cluster_id: str
    controller_id: int
    controller_epoch: int
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerNode]
    gateways: _containers.RepeatedCompositeFieldContainer[GatewayNode]
    controller_host: str
    controller_port: int
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionState]
    topic_configs: _containers.MessageMap[str, TopicConfig]
    active_controller: NotControllerInfo
    etcd_space: EtcdSpace
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., cluster_id: _Optional[str] = ..., controller_id: _Optional[int] = ..., controller_epoch: _Optional[int] = ..., brokers: _Optional[_Iterable[_Union[BrokerNode, _Mapping]]] = ..., gateways: _Optional[_Iterable[_Union[GatewayNode, _Mapping]]] = ..., controller_host: _Optional[str] = ..., controller_port: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[PartitionState, _Mapping]]] = ..., topic_configs: _Optional[_Mapping[str, TopicConfig]] = ..., active_controller: _Optional[_Union[NotControllerInfo, _Mapping]] = ..., etcd_space: _Optional[_Union[EtcdSpace, _Mapping]] = ...) -> None: ...

class EtcdSpace(_message.Message):
    __slots__ = ("db_size_bytes", "db_size_in_use_bytes", "quota_bytes", "nospace_alarm")
    DB_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DB_SIZE_IN_USE_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    NOSPACE_ALARM_FIELD_NUMBER: _ClassVar[int]
    db_size_bytes: int
    db_size_in_use_bytes: int
    quota_bytes: int
    nospace_alarm: bool
    def __init__(self, db_size_bytes: _Optional[int] = ..., db_size_in_use_bytes: _Optional[int] = ..., quota_bytes: _Optional[int] = ..., nospace_alarm: _Optional[bool] = ...) -> None: ...

class InitProducerIdRequest(_message.Message):
    __slots__ = ("transactional_id", "transaction_timeout_ms", "producer_id", "producer_epoch")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    transaction_timeout_ms: int
    producer_id: int
    producer_epoch: int
    def __init__(self, transactional_id: _Optional[str] = ..., transaction_timeout_ms: _Optional[int] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ...) -> None: ...

class InitProducerIdResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "producer_id", "producer_epoch", "active_controller")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    producer_id: int
    producer_epoch: int
    active_controller: NotControllerInfo
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., active_controller: _Optional[_Union[NotControllerInfo, _Mapping]] = ...) -> None: ...

class NotControllerInfo(_message.Message):
    __slots__ = ("controller_id", "host", "port")
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    controller_id: int
    host: str
    port: int
    def __init__(self, controller_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...
