"""Kafka's cluster and admin calls: Metadata and DescribeCluster (this broker's metadata cache and
the brokers' registrations), DescribeConfigs (the cache's topic configs), and CreateTopics,
DeleteTopics, CreatePartitions, AlterConfigs and IncrementalAlterConfigs, forwarded to the active
controller.

Every broker names itself as the controller, since Kafka admin clients send admin requests
there and each broker forwards them. Topics the request's ACL decision refuses are answered
TOPIC_AUTHORIZATION_FAILED and never sent to the controller. Pure: the backend does the I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode as K

from clients.common.topics import TOPIC_CONFIG_SCHEMA, effective_topic_configs, topic_configs_from_proto
from protos.highwater.v1 import common_pb2
from services.kafka import config_changes, protocol
from services.kafka.handler_common import (
    NO_THROTTLE,
    NOT_AUTHORIZED,
    BackendUnavailable,
    ConnectionContext,
    Refused,
    RequestAcl,
    log,
    ms,
    topic_uuid,
    without_topics,
)
from services.kafka.protocol import Request, build, kafka_error, nested
from services.security import authz


class AdminCalls:
    """Metadata, DescribeCluster, DescribeConfigs and the admin calls forwarded to the controller,
    for one connection (its ConnectionContext)."""

    def __init__(self, context: ConnectionContext) -> None:
        self.context = context

    # ---- Metadata ----------------------------------------------------------------------------

    async def metadata(self, request: Request, acl: RequestAcl) -> Any:
        cls = protocol.response_class(protocol.METADATA, request.api_version)
        body = request.body
        try:
            brokers = await self.context.backend.kafka_brokers()
            cluster_id = await self.context.backend.cluster_id()
        except BackendUnavailable as exc:
            # Without etcd this broker cannot say where the others listen; its own address is
            # still right, and a client retries Metadata (every topic LEADER_NOT_AVAILABLE).
            log.warning("Metadata without the broker list: %s", exc)
            brokers, cluster_id = [], ""
        cache = self.context.backend.metadata
        if body.topics is None or (request.api_version == 0 and not body.topics):
            # A full listing leaves out the topics the principal may not describe.
            names = [
                n for n in sorted(cache.topics()) if acl.allowed(authz.Operation.DESCRIBE, authz.topic(n))
            ]
        else:
            names = []
            for t in body.topics:
                name = getattr(t, "name", None)
                if name is None and getattr(t, "topic_id", None) is not None:
                    name = next(
                        (n for n, tid in cache.topic_ids.items() if topic_uuid(tid) == t.topic_id), None
                    )
                if name is not None:
                    names.append(name)
        broker_cls = nested(cls, "MetadataResponseBroker")
        topic_cls = nested(cls, "MetadataResponseTopic")
        partition_cls = nested(cls, "MetadataResponsePartition")
        live = {b.broker_id for b in brokers}
        topics = []
        for name in names:
            parts = cache.partitions_of(name)
            if name in acl.decision.topics_refused:
                topics.append(
                    build(
                        topic_cls,
                        error_code=K.topic_authorization_failed,
                        name=name,
                        topic_id=uuid.UUID(int=0),
                        partitions=(),
                    )
                )
                continue
            if not parts:
                topics.append(
                    build(
                        topic_cls,
                        error_code=K.unknown_topic_or_partition,
                        name=name,
                        topic_id=uuid.UUID(int=0),
                        partitions=(),
                    )
                )
                continue
            topics.append(
                build(
                    topic_cls,
                    error_code=K.none,
                    name=name,
                    topic_id=topic_uuid(cache.topic_ids.get(name, "")),
                    is_internal=False,
                    partitions=tuple(
                        build(
                            partition_cls,
                            error_code=K.none if s.leader >= 0 else K.leader_not_available,
                            partition_index=s.partition,
                            leader_id=s.leader,
                            leader_epoch=s.leader_epoch,
                            replica_nodes=tuple(s.replicas),
                            isr_nodes=tuple(s.isr),
                            offline_replicas=tuple(r for r in s.replicas if r not in live),
                        )
                        for s in parts
                    ),
                )
            )
        return build(
            cls,
            throttle_time=NO_THROTTLE,
            brokers=tuple(
                build(broker_cls, node_id=b.broker_id, host=b.host, port=b.kafka_port, rack=b.rack or None)
                for b in brokers
            ),
            cluster_id=cluster_id or None,
            # Kafka clients send admin requests to the controller named here, which must be a
            # broker they can reach: every broker forwards them to the active controller.
            controller_id=self.context.backend.broker_id,
            topics=tuple(topics),
        )

    # ---- admin: forwarded to the active controller ------------------------------------------

    async def _admin_authorized(
        self, rpc: str, request: Any, names: Callable[[Any], list[str]], refused_names: frozenset[str]
    ) -> tuple[Any, K, str | None, list[str]]:
        """_admin for the topics the principal may act on; the names among `refused_names` come
        back apart (answered TOPIC_AUTHORIZATION_FAILED, never sent to the controller)."""
        refused = [n for n in names(request) if n in refused_names]
        if not refused:
            return (*await self._admin(rpc, request), [])
        if len(refused) == len(names(request)):
            return None, K.none, None, refused
        return (*await self._admin(rpc, without_topics(request, refused_names)), refused)

    async def _admin(self, rpc: str, request: Any) -> tuple[Any, K, str | None]:
        """The controller's answer, or (None, a whole-request code, message). NOT_CONTROLLER is what
        Kafka's admin clients retry after refreshing metadata, for a standby's answer and for a
        controller that cannot be reached alike."""
        try:
            resp = await self.context.backend.call_controller(rpc, request)
        except BackendUnavailable as exc:
            log.warning("%s: %s", rpc, exc)
            return None, K.not_controller, str(exc)
        if resp.error_code != common_pb2.NONE:
            return None, kafka_error(resp.error_code), resp.error_message or None
        return resp, K.none, None

    async def create_topics(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.CREATE_TOPICS, request.api_version)
        result_cls = nested(cls, "CreatableTopicResult")
        resp, code, message, refused = await self._admin_authorized(
            "CreateTopics",
            common_pb2.CreateTopicsRequest(
                topics=[
                    common_pb2.CreatableTopic(
                        name=t.name,
                        num_partitions=t.num_partitions,
                        replication_factor=t.replication_factor,
                        assignments={
                            a.partition_index: common_pb2.ReplicaList(replicas=list(a.broker_ids))
                            for a in t.assignments
                        },
                        configs={c.name: c.value for c in t.configs if c.value is not None},
                    )
                    for t in body.topics
                ],
                timeout_ms=max(0, ms(body.timeout)),
                validate_only=getattr(body, "validate_only", False),
            ),
            lambda r: [t.name for t in r.topics],
            acl.decision.topics_refused,
        )
        results: list[tuple[str, K, str | None, str, int, int]] = [
            (n, K.topic_authorization_failed, NOT_AUTHORIZED, "", -1, -1) for n in refused
        ]
        if resp is None:
            results += [(t.name, code, message, "", -1, -1) for t in body.topics if t.name not in refused]
        else:
            results += [
                (
                    r.name,
                    kafka_error(r.error_code),
                    r.error_message or None,
                    r.topic_id,
                    r.num_partitions or -1,
                    r.replication_factor or -1,
                )
                for r in resp.topics
            ]
        return build(
            cls,
            throttle_time=NO_THROTTLE,
            topics=tuple(
                build(
                    result_cls,
                    name=name,
                    topic_id=topic_uuid(topic_id),
                    error_code=err,
                    error_message=msg,
                    num_partitions=partitions if err == K.none else -1,
                    replication_factor=factor if err == K.none else -1,
                    configs=None,  # not returned: DescribeConfigs says them
                )
                for name, err, msg, topic_id, partitions, factor in results
            ),
        )

    async def delete_topics(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.DELETE_TOPICS, request.api_version)
        result_cls = nested(cls, "DeletableTopicResult")
        names = list(body.topic_names)
        resp, code, message, refused = await self._admin_authorized(
            "DeleteTopics",
            common_pb2.DeleteTopicsRequest(names=names, timeout_ms=max(0, ms(body.timeout))),
            lambda r: list(r.names),
            acl.decision.topics_refused,
        )
        results = [(n, K.topic_authorization_failed, NOT_AUTHORIZED) for n in refused] + (
            [(n, code, message) for n in names if n not in refused]
            if resp is None
            else [(r.name, kafka_error(r.error_code), r.error_message or None) for r in resp.topics]
        )
        return build(
            cls,
            throttle_time=NO_THROTTLE,
            responses=tuple(
                build(result_cls, name=n, error_code=err, error_message=msg) for n, err, msg in results
            ),
        )

    async def create_partitions(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.CREATE_PARTITIONS, request.api_version)
        result_cls = nested(cls, "CreatePartitionsTopicResult")
        resp, code, message, refused = await self._admin_authorized(
            "CreatePartitions",
            common_pb2.CreatePartitionsRequest(
                topics=[
                    common_pb2.CreatePartitionsTopic(
                        name=t.name,
                        count=t.count,
                        assignments=[
                            common_pb2.ReplicaList(replicas=list(a.broker_ids)) for a in (t.assignments or ())
                        ],
                    )
                    for t in body.topics
                ],
                timeout_ms=max(0, ms(body.timeout)),
                validate_only=body.validate_only,
            ),
            lambda r: [t.name for t in r.topics],
            acl.decision.topics_refused,
        )
        results = [(n, K.topic_authorization_failed, NOT_AUTHORIZED) for n in refused] + (
            [(t.name, code, message) for t in body.topics if t.name not in refused]
            if resp is None
            else [(r.name, kafka_error(r.error_code), r.error_message or None) for r in resp.topics]
        )
        return build(
            cls,
            throttle_time=NO_THROTTLE,
            results=tuple(
                build(result_cls, name=n, error_code=err, error_message=msg) for n, err, msg in results
            ),
        )

    # ---- AlterConfigs and IncrementalAlterConfigs: topic configs, through the controller ------

    async def alter_configs(self, request: Request, acl: RequestAcl) -> Any:
        """AlterConfigs (33): each topic's whole config replaced; what it does not name returns to
        its default, as in Kafka."""
        return await self._alter_configs(request, acl, protocol.ALTER_CONFIGS, incremental=False)

    async def incremental_alter_configs(self, request: Request, acl: RequestAcl) -> Any:
        """IncrementalAlterConfigs (44): SET and DELETE the keys named, keep the rest."""
        return await self._alter_configs(request, acl, protocol.INCREMENTAL_ALTER_CONFIGS, incremental=True)

    async def _alter_configs(
        self, request: Request, acl: RequestAcl, api_key: int, *, incremental: bool
    ) -> Any:
        """Topic resources go to the controller's AlterTopicConfigs in one request; the rest are
        answered here (config_changes.py's table), each resource on its own, in request order."""
        body = request.body
        cls = protocol.response_class(api_key, request.api_version)
        result_cls = nested(cls, "AlterConfigsResourceResponse")
        refused = acl.decision.topics_refused
        answers: list[tuple[K, str | None]] = [(K.none, None)] * len(body.resources)
        sent: list[tuple[int, common_pb2.AlterTopicConfigsTopic]] = []
        for i, resource in enumerate(body.resources):
            try:
                refusal = config_changes.refusal_of_resource_type(
                    resource.resource_type, resource.resource_name
                )
                if refusal is not None:
                    raise refusal
                if resource.resource_name in refused:
                    raise config_changes.Refused(K.topic_authorization_failed, NOT_AUTHORIZED)
                sent.append((i, config_changes.topic_change(resource, incremental=incremental)))
            except config_changes.Refused as exc:
                answers[i] = (exc.code, exc.message)
        if sent:
            resp, code, message = await self._admin(
                "AlterTopicConfigs",
                common_pb2.AlterTopicConfigsRequest(
                    topics=[change for _, change in sent], validate_only=body.validate_only
                ),
            )
            for n, (i, _) in enumerate(sent):
                if resp is None:
                    answers[i] = (code, message)
                else:
                    r = resp.topics[n]
                    answers[i] = (kafka_error(r.error_code), r.error_message or None)
        return build(
            cls,
            throttle_time=NO_THROTTLE,
            responses=tuple(
                build(
                    result_cls,
                    error_code=code,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                )
                for resource, (code, message) in zip(body.resources, answers, strict=True)
            ),
        )

    # ---- DescribeConfigs and DescribeCluster: this broker's metadata ---------------------------

    async def describe_configs(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.DESCRIBE_CONFIGS, request.api_version)
        result_cls = nested(cls, "DescribeConfigsResult")
        entry_cls = nested(cls, "DescribeConfigsResourceResult")
        cache = self.context.backend.metadata
        results = []
        for resource in body.resources:
            wanted = set(resource.configuration_keys) if resource.configuration_keys is not None else None
            code, message, entries = K.none, None, []
            if resource.resource_type == RESOURCE_TOPIC:
                if resource.resource_name in acl.decision.topics_refused:
                    code, message = K.topic_authorization_failed, NOT_AUTHORIZED
                elif resource.resource_name not in cache.topics():
                    code, message = (
                        K.unknown_topic_or_partition,
                        f"topic {resource.resource_name!r} does not exist",
                    )
                else:
                    config = cache.topic_configs.get(resource.resource_name, common_pb2.TopicConfig())
                    entries = [
                        build(
                            entry_cls,
                            name=name,
                            value=value,
                            read_only=False,
                            config_source=SOURCE_TOPIC_CONFIG if set_here else SOURCE_DEFAULT_CONFIG,
                            is_sensitive=False,
                            synonyms=(),
                            config_type=TOPIC_CONFIG_SCHEMA[name].kafka_config_type,
                            # Why an accepted config has no effect here; None for one honoured.
                            documentation=TOPIC_CONFIG_SCHEMA[name].note or None,
                        )
                        for name, value, set_here in topic_config_entries(config)
                        if wanted is None or name in wanted
                    ]
            elif resource.resource_type != RESOURCE_BROKER:
                # Broker resources are answered with no entries (no broker config is dynamic here).
                code, message = (
                    K.invalid_request,
                    f"resource type {resource.resource_type} is not described here",
                )
            results.append(
                build(
                    result_cls,
                    error_code=code,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=tuple(entries),
                )
            )
        return build(cls, throttle_time=NO_THROTTLE, results=tuple(results))

    async def describe_cluster(self, request: Request, acl: RequestAcl) -> Any:
        cls = protocol.response_class(protocol.DESCRIBE_CLUSTER, request.api_version)
        broker_cls = nested(cls, "DescribeClusterBroker")
        try:
            if acl.decision.cluster_refused:
                raise Refused(K.cluster_authorization_failed, "not authorized to Describe the cluster")
            brokers = await self.context.backend.kafka_brokers()
            cluster_id = await self.context.backend.cluster_id()
        except (BackendUnavailable, Refused) as exc:
            return build(
                cls,
                throttle_time=NO_THROTTLE,
                error_code=exc.code if isinstance(exc, Refused) else K.request_timed_out,
                error_message=str(exc),
                cluster_id="",
                controller_id=-1,
                brokers=(),
            )
        return build(
            cls,
            throttle_time=NO_THROTTLE,
            error_code=K.none,
            error_message=None,
            endpoint_type=1,  # brokers: the only endpoints a Kafka client reaches here
            cluster_id=cluster_id,
            # As in Metadata: this broker forwards admin requests.
            controller_id=self.context.backend.broker_id,
            brokers=tuple(
                build(broker_cls, broker_id=b.broker_id, host=b.host, port=b.kafka_port, rack=b.rack or None)
                for b in brokers
            ),
        )


# Kafka's DescribeConfigs resource types and config sources (DescribeConfigsResponse.json).
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
SOURCE_TOPIC_CONFIG = 1
SOURCE_DEFAULT_CONFIG = 5


def topic_config_entries(config: common_pb2.TopicConfig) -> list[tuple[str, str, bool]]:
    """(name, effective value, set on the topic) for every topic config Highwater keeps; an unset
    one shows its default (clients/common/topics.py, the one schema), as Kafka's DescribeConfigs does."""
    return [
        (entry.name, entry.value, not entry.is_default)
        for entry in effective_topic_configs(topic_configs_from_proto(config))
    ]
