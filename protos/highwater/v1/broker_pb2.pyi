from protos.highwater.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LeaderAndIsrPartition(_message.Message):
    __slots__ = ("state", "is_new", "config")
    STATE_FIELD_NUMBER: _ClassVar[int]
    IS_NEW_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    state: _common_pb2.PartitionState
    is_new: bool
    config: _common_pb2.TopicConfig
    def __init__(self, state: _Optional[_Union[_common_pb2.PartitionState, _Mapping]] = ..., is_new: _Optional[bool] = ..., config: _Optional[_Union[_common_pb2.TopicConfig, _Mapping]] = ...) -> None: ...

class LeaderAndIsrRequest(_message.Message):
    __slots__ = ("header", "partitions", "live_leaders")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    LIVE_LEADERS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ControllerHeader
    partitions: _containers.RepeatedCompositeFieldContainer[LeaderAndIsrPartition]
    live_leaders: _containers.RepeatedCompositeFieldContainer[_common_pb2.BrokerNode]
    def __init__(self, header: _Optional[_Union[_common_pb2.ControllerHeader, _Mapping]] = ..., partitions: _Optional[_Iterable[_Union[LeaderAndIsrPartition, _Mapping]]] = ..., live_leaders: _Optional[_Iterable[_Union[_common_pb2.BrokerNode, _Mapping]]] = ...) -> None: ...

class LeaderAndIsrResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "partitions")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.PartitionResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[_common_pb2.PartitionResult, _Mapping]]] = ...) -> None: ...

class UpdateMetadataRequest(_message.Message):
    __slots__ = ("header", "live_brokers", "partitions", "full", "deleted_topics", "live_gateways", "topic_configs", "topic_ids")
    class TopicConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _common_pb2.TopicConfig
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_common_pb2.TopicConfig, _Mapping]] = ...) -> None: ...
    class TopicIdsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LIVE_BROKERS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    DELETED_TOPICS_FIELD_NUMBER: _ClassVar[int]
    LIVE_GATEWAYS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_IDS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ControllerHeader
    live_brokers: _containers.RepeatedCompositeFieldContainer[_common_pb2.BrokerNode]
    partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.PartitionState]
    full: bool
    deleted_topics: _containers.RepeatedScalarFieldContainer[str]
    live_gateways: _containers.RepeatedCompositeFieldContainer[_common_pb2.GatewayNode]
    topic_configs: _containers.MessageMap[str, _common_pb2.TopicConfig]
    topic_ids: _containers.ScalarMap[str, str]
    def __init__(self, header: _Optional[_Union[_common_pb2.ControllerHeader, _Mapping]] = ..., live_brokers: _Optional[_Iterable[_Union[_common_pb2.BrokerNode, _Mapping]]] = ..., partitions: _Optional[_Iterable[_Union[_common_pb2.PartitionState, _Mapping]]] = ..., full: _Optional[bool] = ..., deleted_topics: _Optional[_Iterable[str]] = ..., live_gateways: _Optional[_Iterable[_Union[_common_pb2.GatewayNode, _Mapping]]] = ..., topic_configs: _Optional[_Mapping[str, _common_pb2.TopicConfig]] = ..., topic_ids: _Optional[_Mapping[str, str]] = ...) -> None: ...

class UpdateMetadataResponse(_message.Message):
    __slots__ = ("error_code", "error_message")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class StopReplicaPartition(_message.Message):
    __slots__ = ("topic", "partition", "leader_epoch", "delete_partition")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    DELETE_PARTITION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    leader_epoch: int
    delete_partition: bool
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., delete_partition: _Optional[bool] = ...) -> None: ...

class StopReplicaRequest(_message.Message):
    __slots__ = ("header", "partitions")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ControllerHeader
    partitions: _containers.RepeatedCompositeFieldContainer[StopReplicaPartition]
    def __init__(self, header: _Optional[_Union[_common_pb2.ControllerHeader, _Mapping]] = ..., partitions: _Optional[_Iterable[_Union[StopReplicaPartition, _Mapping]]] = ...) -> None: ...

class StopReplicaResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "partitions")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.PartitionResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[_common_pb2.PartitionResult, _Mapping]]] = ...) -> None: ...

class OffsetsForLeaderEpochPartition(_message.Message):
    __slots__ = ("partition", "current_leader_epoch", "leader_epoch")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    partition: int
    current_leader_epoch: int
    leader_epoch: int
    def __init__(self, partition: _Optional[int] = ..., current_leader_epoch: _Optional[int] = ..., leader_epoch: _Optional[int] = ...) -> None: ...

class OffsetsForLeaderEpochTopic(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[OffsetsForLeaderEpochPartition]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[OffsetsForLeaderEpochPartition, _Mapping]]] = ...) -> None: ...

class OffsetsForLeaderEpochRequest(_message.Message):
    __slots__ = ("replica_id", "topics")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    replica_id: int
    topics: _containers.RepeatedCompositeFieldContainer[OffsetsForLeaderEpochTopic]
    def __init__(self, replica_id: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[OffsetsForLeaderEpochTopic, _Mapping]]] = ...) -> None: ...

class EpochEndOffset(_message.Message):
    __slots__ = ("partition", "error_code", "leader_epoch", "end_offset")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: _common_pb2.ErrorCode
    leader_epoch: int
    end_offset: int
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., leader_epoch: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class OffsetsForLeaderEpochTopicResult(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[EpochEndOffset]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[EpochEndOffset, _Mapping]]] = ...) -> None: ...

class OffsetsForLeaderEpochResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[OffsetsForLeaderEpochTopicResult]
    def __init__(self, topics: _Optional[_Iterable[_Union[OffsetsForLeaderEpochTopicResult, _Mapping]]] = ...) -> None: ...

class TxnMarkerTopic(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class TxnMarker(_message.Message):
    __slots__ = ("producer_id", "producer_epoch", "committed", "coordinator_epoch", "topics")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    producer_epoch: int
    committed: bool
    coordinator_epoch: int
    topics: _containers.RepeatedCompositeFieldContainer[TxnMarkerTopic]
    def __init__(self, producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., committed: _Optional[bool] = ..., coordinator_epoch: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[TxnMarkerTopic, _Mapping]]] = ...) -> None: ...

class WriteTxnMarkersRequest(_message.Message):
    __slots__ = ("markers", "timeout_ms")
    MARKERS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    markers: _containers.RepeatedCompositeFieldContainer[TxnMarker]
    timeout_ms: int
    def __init__(self, markers: _Optional[_Iterable[_Union[TxnMarker, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class TxnMarkerPartitionResult(_message.Message):
    __slots__ = ("partition", "error_code", "error_message")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class TxnMarkerTopicResult(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[TxnMarkerPartitionResult]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[TxnMarkerPartitionResult, _Mapping]]] = ...) -> None: ...

class TxnMarkerResult(_message.Message):
    __slots__ = ("producer_id", "topics")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    topics: _containers.RepeatedCompositeFieldContainer[TxnMarkerTopicResult]
    def __init__(self, producer_id: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[TxnMarkerTopicResult, _Mapping]]] = ...) -> None: ...

class WriteTxnMarkersResponse(_message.Message):
    __slots__ = ("markers",)
    MARKERS_FIELD_NUMBER: _ClassVar[int]
    markers: _containers.RepeatedCompositeFieldContainer[TxnMarkerResult]
    def __init__(self, markers: _Optional[_Iterable[_Union[TxnMarkerResult, _Mapping]]] = ...) -> None: ...
