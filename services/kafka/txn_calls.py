"""Kafka's transaction calls (KIP-98, KIP-447, KIP-890 part 1): InitProducerId with a
transactional id, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn,
DescribeTransactions and ListTransactions, and the partition leader's check of a transactional
Produce.

The coordinator is services/transactions/ (pure rules, a driver over etcd, its host on this
broker: backend.transactions). These calls turn kio's requests into the rules' requests and the
rules' answers (TxnError, named as Kafka's codes) into kio's responses of the asked version. A
request for a transactional id this broker does not coordinate answers NOT_COORDINATOR, as
Kafka's, which sends the client to FindCoordinator (key_type 1) again; TxnOffsetCommit goes to
the group's coordinator, which checks the member (KIP-447) before the transaction's bookkeeping.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from kio.schema.errors import ErrorCode as K

from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2
from services.groups.errors import GroupError, kafka_code
from services.kafka import protocol
from services.kafka.handler_common import (
    NO_THROTTLE,
    BackendUnavailable,
    ConnectionContext,
    RequestAcl,
    group_refusal,
    log,
    ms,
    not_coordinator,
)
from services.kafka.protocol import Request, build, nested
from services.transactions import coordinator as rules
from services.transactions.coordinator import PendingOffset, TxnAnswer, TxnError
from services.transactions.produce_check import produce_refusal_message, transactional_batches

# KIP-588 gave fenced producers their own code (PRODUCER_FENCED) from these versions on; older
# clients know only INVALID_PRODUCER_EPOCH for it, as Kafka answers them.
PRODUCER_FENCED_FROM_VERSION: dict[int, int] = {
    protocol.INIT_PRODUCER_ID: 4,
    protocol.ADD_PARTITIONS_TO_TXN: 2,
    protocol.ADD_OFFSETS_TO_TXN: 2,
    protocol.END_TXN: 2,
    protocol.TXN_OFFSET_COMMIT: 3,
}
TRANSACTIONAL_ID_REFUSED = "not authorized to use this transactional id (docs/KAFKA.md, Security)"
# DescribeTransactions' start time of an id with no open transaction: Kafka sends -1, which
# kio's non-nullable timestamp cannot carry; the epoch reads as "long ago" to every tool.
NO_START_TIME = datetime.datetime.fromtimestamp(0, datetime.UTC)


def kafka_txn_code(error: TxnError, api_key: int, version: int) -> K:
    """The wire code of a coordinator answer for this API and version."""
    if error is TxnError.PRODUCER_FENCED and version < PRODUCER_FENCED_FROM_VERSION.get(api_key, 0):
        return K.invalid_producer_epoch
    return K[error.value.lower()]


# A transactional Produce's refusal by the leader's KIP-890 check, as Produce's codes.
_PRODUCE_CODES: dict[TxnError, K] = {
    TxnError.PRODUCER_FENCED: K.invalid_producer_epoch,
    TxnError.INVALID_PRODUCER_EPOCH: K.invalid_producer_epoch,
    TxnError.INVALID_PRODUCER_ID_MAPPING: K.invalid_producer_id_mapping,
}


class TxnCalls:
    """The transaction calls of one connection (its ConnectionContext)."""

    def __init__(self, context: ConnectionContext) -> None:
        self.context = context

    async def _refusal(self, transactional_id: str, acl: RequestAcl) -> tuple[K, str] | None:
        """Why a request for this id is refused before the coordinator sees it (None: it is not)."""
        if acl.decision.transactional_refused:
            return K.transactional_id_authorization_failed, TRANSACTIONAL_ID_REFUSED
        if not transactional_id:
            return K.invalid_request, "the transactional id is empty"
        code = await not_coordinator(self.context, transactional_id, "transactional id")
        if code is not None:
            return code, "this broker does not coordinate the transactional id: ask FindCoordinator"
        return None

    async def _handle(self, request: rules.TxnRequest) -> TxnAnswer:
        try:
            answer = await self.context.backend.transactions.handle(request)
        except BackendUnavailable as exc:
            log.warning("transactional id %r: %s", request.transactional_id, exc)
            return TxnAnswer(TxnError.COORDINATOR_NOT_AVAILABLE, f"etcd could not be reached ({exc}): retry")
        if answer.error is not TxnError.NONE:
            log.debug("transactional id %r: %s %s", request.transactional_id, answer.error, answer.message)
        return answer

    # ---- InitProducerId (with a transactional id; DataCalls answers the others) ---------------

    async def init_producer_id(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.INIT_PRODUCER_ID, request.api_version)
        refused = await self._refusal(body.transactional_id, acl)
        if refused is not None:
            return build(
                cls, throttle_time=NO_THROTTLE, error_code=refused[0], producer_id=-1, producer_epoch=-1
            )
        answer = await self._handle(
            rules.InitProducerId(
                body.transactional_id,
                ms(body.transaction_timeout),
                getattr(body, "producer_id", rules.NO_PRODUCER_ID),
                getattr(body, "producer_epoch", rules.NO_PRODUCER_EPOCH),
            )
        )
        ok = answer.error is TxnError.NONE
        return build(
            cls,
            throttle_time=NO_THROTTLE,
            error_code=kafka_txn_code(answer.error, protocol.INIT_PRODUCER_ID, request.api_version),
            producer_id=answer.producer_id if ok else -1,
            producer_epoch=answer.producer_epoch if ok else -1,
        )

    # ---- AddPartitionsToTxn -------------------------------------------------------------------

    async def add_partitions_to_txn(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.ADD_PARTITIONS_TO_TXN, request.api_version)
        named = [(t.name, p) for t in body.v3_and_below_topics for p in t.partitions]
        codes = await self._add_partitions_codes(body, named, acl, request.api_version)
        topic_cls = nested(cls, "AddPartitionsToTxnTopicResult")
        part_cls = nested(cls, "AddPartitionsToTxnPartitionResult")
        by_topic: dict[str, list[int]] = {}
        for topic, partition in named:
            by_topic.setdefault(topic, []).append(partition)
        return build(
            cls,
            throttle_time=NO_THROTTLE,
            results_by_topic_v3_and_below=tuple(
                build(
                    topic_cls,
                    name=topic,
                    results_by_partition=tuple(
                        build(part_cls, partition_index=p, partition_error_code=codes[(topic, p)])
                        for p in partitions
                    ),
                )
                for topic, partitions in by_topic.items()
            ),
        )

    async def _add_partitions_codes(
        self, body: Any, named: Sequence[TopicPartitionKey], acl: RequestAcl, version: int
    ) -> dict[TopicPartitionKey, K]:
        """Each partition's code: Kafka refuses the whole request when any partition is refused
        (unauthorized or unknown), answering the others OPERATION_NOT_ATTEMPTED."""
        refused = await self._refusal(body.v3_and_below_transactional_id, acl)
        if refused is not None:
            return dict.fromkeys(named, refused[0])
        known = self.context.backend.metadata.partitions
        bad: dict[TopicPartitionKey, K] = {}
        for tp in named:
            if tp[0] in acl.decision.topics_refused:
                bad[tp] = K.topic_authorization_failed
            elif tp not in known:
                bad[tp] = K.unknown_topic_or_partition
        if bad:
            return {tp: bad.get(tp, K.operation_not_attempted) for tp in named}
        answer = await self._handle(
            rules.AddPartitionsToTxn(
                body.v3_and_below_transactional_id,
                body.v3_and_below_producer_id,
                body.v3_and_below_producer_epoch,
                frozenset(named),
            )
        )
        return dict.fromkeys(named, kafka_txn_code(answer.error, protocol.ADD_PARTITIONS_TO_TXN, version))

    # ---- AddOffsetsToTxn, TxnOffsetCommit -----------------------------------------------------

    async def add_offsets_to_txn(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.ADD_OFFSETS_TO_TXN, request.api_version)
        refused = await self._refusal(body.transactional_id, acl)
        if refused is not None:
            code = refused[0]
        elif (group_code := group_refusal(body.group_id, acl)) is not None:
            code = group_code
        else:
            answer = await self._handle(
                rules.AddOffsetsToTxn(
                    body.transactional_id, body.producer_id, body.producer_epoch, body.group_id
                )
            )
            code = kafka_txn_code(answer.error, protocol.ADD_OFFSETS_TO_TXN, request.api_version)
        return build(cls, throttle_time=NO_THROTTLE, error_code=code)

    async def txn_offset_commit(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.TXN_OFFSET_COMMIT, request.api_version)
        named = [(t.name, p.partition_index) for t in body.topics for p in t.partitions]
        codes = await self._txn_offset_commit_codes(body, acl, request.api_version)
        topic_cls = nested(cls, "TxnOffsetCommitResponseTopic")
        part_cls = nested(cls, "TxnOffsetCommitResponsePartition")
        return (
            build(
                cls,
                throttle_time=NO_THROTTLE,
                topics=tuple(
                    build(
                        topic_cls,
                        name=t.name,
                        partitions=tuple(
                            build(
                                part_cls,
                                partition_index=p.partition_index,
                                error_code=codes.get((t.name, p.partition_index), K.none),
                            )
                            for p in t.partitions
                        ),
                    )
                    for t in body.topics
                ),
            )
            if named
            else build(cls, throttle_time=NO_THROTTLE, topics=())
        )

    async def _txn_offset_commit_codes(
        self, body: Any, acl: RequestAcl, version: int
    ) -> Mapping[TopicPartitionKey, K]:
        """Each partition's code. The group's coordinator (this broker, or NOT_COORDINATOR)
        checks the member first (KIP-447), then the transaction takes the offsets; they become
        the group's only when it commits."""
        named = [(t.name, p.partition_index) for t in body.topics for p in t.partitions]
        whole: K | None = None
        if acl.decision.transactional_refused:
            whole = K.transactional_id_authorization_failed
        elif (group_code := group_refusal(body.group_id, acl)) is not None:
            whole = group_code
        elif (coordinator_code := await not_coordinator(self.context, body.group_id, "group")) is not None:
            whole = coordinator_code
        else:
            member = await self._member_check(
                body.group_id, getattr(body, "member_id", ""), getattr(body, "generation_id", -1)
            )
            whole = None if member is GroupError.NONE else kafka_code(member)
        if whole is not None:
            return dict.fromkeys(named, whole)
        known = self.context.backend.metadata.partitions
        codes: dict[TopicPartitionKey, K] = {}
        offsets: dict[TopicPartitionKey, PendingOffset] = {}
        for t in body.topics:
            for p in t.partitions:
                tp = (t.name, p.partition_index)
                if t.name in acl.decision.topics_refused:
                    codes[tp] = K.topic_authorization_failed
                elif tp not in known:
                    codes[tp] = K.unknown_topic_or_partition
                else:
                    offsets[tp] = PendingOffset(
                        p.committed_offset,
                        p.committed_metadata or "",
                        getattr(p, "committed_leader_epoch", -1),
                    )
        if offsets:
            answer = await self._handle(
                rules.TxnOffsetCommit(
                    body.transactional_id, body.producer_id, body.producer_epoch, body.group_id, offsets
                )
            )
            code = kafka_txn_code(answer.error, protocol.TXN_OFFSET_COMMIT, version)
            codes.update(dict.fromkeys(offsets, code))
        return codes

    async def _member_check(self, group_id: str, member_id: str, generation: int) -> GroupError:
        """KIP-447: a commit that names its consumer's member must come from a current member.
        One without a member id (TxnOffsetCommit before v3, or a producer not given the
        consumer's group metadata) is not checked, as in Kafka."""
        if not member_id:
            return GroupError.NONE
        backend = self.context.backend
        classic = backend.classic_groups.group(group_id)
        if classic is not None and classic.members:
            return backend.classic_groups.commit_check(group_id, member_id, generation)
        try:
            return await backend.consumer_group_member_check(group_id, member_id, generation)
        except BackendUnavailable as exc:
            log.warning("TxnOffsetCommit for group %r: %s", group_id, exc)
            return GroupError.COORDINATOR_NOT_AVAILABLE

    # ---- EndTxn -------------------------------------------------------------------------------

    async def end_txn(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.END_TXN, request.api_version)
        refused = await self._refusal(body.transactional_id, acl)
        if refused is not None:
            return build(cls, throttle_time=NO_THROTTLE, error_code=refused[0])
        answer = await self._handle(
            rules.EndTxn(body.transactional_id, body.producer_id, body.producer_epoch, body.committed)
        )
        return build(
            cls,
            throttle_time=NO_THROTTLE,
            error_code=kafka_txn_code(answer.error, protocol.END_TXN, request.api_version),
        )

    # ---- DescribeTransactions, ListTransactions -----------------------------------------------

    async def describe_transactions(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.DESCRIBE_TRANSACTIONS, request.api_version)
        state_cls = nested(cls, "TransactionState")
        topic_cls = nested(cls, "TopicData")

        def empty(tid: str, code: K) -> Any:
            return build(
                state_cls,
                error_code=code,
                transactional_id=tid,
                transaction_state="",
                transaction_timeout=datetime.timedelta(0),
                transaction_start_time=NO_START_TIME,
                producer_id=-1,
                producer_epoch=-1,
                topics=(),
            )

        ids = list(body.transactional_ids)
        if acl.decision.transactional_refused:
            return build(
                cls,
                throttle_time=NO_THROTTLE,
                transaction_states=tuple(empty(t, K.transactional_id_authorization_failed) for t in ids),
            )
        try:
            described = await self.context.backend.transactions.describe(ids)
        except BackendUnavailable as exc:
            log.warning("DescribeTransactions: %s", exc)
            return build(
                cls,
                throttle_time=NO_THROTTLE,
                transaction_states=tuple(empty(t, K.coordinator_not_available) for t in ids),
            )
        states = []
        for d in described:
            if d.description is None:
                states.append(empty(d.transactional_id, K[d.error.value.lower()]))
                continue
            by_topic: dict[str, list[int]] = {}
            for topic, partition in d.description.partitions:
                by_topic.setdefault(topic, []).append(partition)
            start_ms = d.description.transaction_start_time_ms
            states.append(
                build(
                    state_cls,
                    error_code=K.none,
                    transactional_id=d.transactional_id,
                    transaction_state=d.description.state,
                    transaction_timeout=datetime.timedelta(milliseconds=d.description.transaction_timeout_ms),
                    transaction_start_time=(
                        datetime.datetime.fromtimestamp(start_ms / 1000, datetime.UTC)
                        if start_ms >= 0
                        else NO_START_TIME
                    ),
                    producer_id=d.description.producer_id,
                    producer_epoch=d.description.producer_epoch,
                    topics=tuple(
                        build(topic_cls, topic=t, partitions=tuple(ps)) for t, ps in by_topic.items()
                    ),
                )
            )
        return build(cls, throttle_time=NO_THROTTLE, transaction_states=tuple(states))

    async def list_transactions(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.LIST_TRANSACTIONS, request.api_version)
        state_cls = nested(cls, "TransactionState")
        if acl.decision.transactional_refused:
            # Kafka leaves out the ids the principal may not describe; with our stand-in that is all.
            return build(
                cls,
                throttle_time=NO_THROTTLE,
                error_code=K.none,
                unknown_state_filters=(),
                transaction_states=(),
            )
        try:
            listed, unknown = await self.context.backend.transactions.listing(
                list(body.state_filters), list(body.producer_id_filters), getattr(body, "duration_filter", -1)
            )
        except BackendUnavailable as exc:
            log.warning("ListTransactions: %s", exc)
            return build(
                cls,
                throttle_time=NO_THROTTLE,
                error_code=K.coordinator_not_available,
                unknown_state_filters=(),
                transaction_states=(),
            )
        return build(
            cls,
            throttle_time=NO_THROTTLE,
            error_code=K.none,
            unknown_state_filters=tuple(unknown),
            transaction_states=tuple(
                build(
                    state_cls,
                    transactional_id=t.transactional_id,
                    producer_id=t.producer_id,
                    transaction_state=t.state,
                )
                for t in listed
            ),
        )

    # ---- Produce with a transactional id: the leader's check ----------------------------------

    async def produce_refusals(
        self, transactional_id: str, req: common_pb2.ProduceRequest, acl: RequestAcl
    ) -> dict[TopicPartitionKey, tuple[K, str]]:
        """The partitions of a transactional Produce not to append, with their code and message:
        all of them when the id is refused; else, per producer, the partitions the leader's
        KIP-890 check refuses (backend.transactions.produce_refusals)."""
        every = [(t.topic, p.partition) for t in req.topics for p in t.partitions]
        if acl.decision.transactional_refused:
            return dict.fromkeys(every, (K.transactional_id_authorization_failed, TRANSACTIONAL_ID_REFUSED))
        if (problem := rules.transactional_id_problem(transactional_id)) is not None:
            return dict.fromkeys(every, (K.invalid_request, problem))
        backend = self.context.backend
        try:
            verdicts = await backend.transactions.produce_refusals(
                transactional_id, req, backend.open_transaction_epoch
            )
        except BackendUnavailable as exc:
            log.warning("transactional Produce of %r: %s", transactional_id, exc)
            verdicts = {
                tp: TxnError.CONCURRENT_TRANSACTIONS
                for tps in transactional_batches(req).values()
                for tp in tps
            }
        refusals: dict[TopicPartitionKey, tuple[K, str]] = {}
        for tp, error in verdicts.items():
            code = _PRODUCE_CODES.get(error, K.invalid_txn_state)
            if error is TxnError.CONCURRENT_TRANSACTIONS:
                code = K.request_timed_out  # etcd could not be read: retriable
            refusals[tp] = (code, produce_refusal_message(tp, error))
        return refusals
