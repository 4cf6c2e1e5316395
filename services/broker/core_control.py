"""Control requests on the broker core: LeaderAndIsr, StopReplica, UpdateMetadata (Kafka's
ReplicaManager.becomeLeaderOrFollower and friends).

A replica is created, made leader or follower, stopped or deleted here, and a follower's
partitions are handed to the replica fetcher of their leader. Every request is fenced first
(check_control_request): refused while closing or before registration, and for an older
controller epoch or broker epoch.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping

from clients.common.errors import BrokerNotAvailable, HighwaterError, StaleBrokerEpoch, StaleControllerEpoch
from clients.common.topics import stored_topic_configs, topic_config_value, topic_configs_from_proto
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import broker_pb2, common_pb2
from services.broker import metrics
from services.broker.core_follower import FollowerReplicas
from services.broker.fetcher_core import FetcherCore
from services.broker.log import Log, LogConfig
from services.broker.partition import (
    LeaderAndIsrAction,
    LeaderAndIsrState,
    Partition,
    Role,
    decide_leader_and_isr,
)
from services.common import limits

# LeaderAndIsr handles this many partitions between yields (opening logs is synchronous work).
LEADER_AND_ISR_PARTITIONS_PER_YIELD = 10
# Per replica directory: the id of the topic it was created for (Kafka's KIP-516 file and format).
PARTITION_METADATA_FILE = "partition.metadata"


def log_config_from(config: common_pb2.TopicConfig) -> LogConfig:
    """The log settings of a topic config as the controller sent it (0 = default)."""
    defaults = LogConfig()
    # The compaction configs through the schema: from their fields, or from unserved_configs when
    # a controller of a release before they were honoured sent them there (it also did not check
    # min.compaction.lag.ms <= max.compaction.lag.ms: such a pair falls back to the defaults).
    served, _ = stored_topic_configs(topic_configs_from_proto(config))
    return LogConfig(
        segment_bytes=config.segment_bytes or defaults.segment_bytes,
        segment_ms=config.segment_ms or defaults.segment_ms,
        retention_bytes=config.retention_bytes or defaults.retention_bytes,
        retention_ms=config.retention_ms or defaults.retention_ms,
        max_message_bytes=config.max_message_bytes or defaults.max_message_bytes,
        message_timestamp_type=config.message_timestamp_type or defaults.message_timestamp_type,
        cleanup_policy=config.cleanup_policy or defaults.cleanup_policy,
        # Optional fields: 0 is a legal limit, so only an absent field means the default.
        message_timestamp_before_max_ms=(
            config.message_timestamp_before_max_ms
            if config.HasField("message_timestamp_before_max_ms")
            else defaults.message_timestamp_before_max_ms
        ),
        message_timestamp_after_max_ms=(
            config.message_timestamp_after_max_ms
            if config.HasField("message_timestamp_after_max_ms")
            else defaults.message_timestamp_after_max_ms
        ),
        min_cleanable_dirty_ratio=float(topic_config_value(served, "min.cleanable.dirty.ratio")),
        min_compaction_lag_ms=int(topic_config_value(served, "min.compaction.lag.ms")),
        max_compaction_lag_ms=int(topic_config_value(served, "max.compaction.lag.ms")),
        delete_retention_ms=int(topic_config_value(served, "delete.retention.ms")),
    )


class ControlRequests(FollowerReplicas):
    """The controller's requests to this broker, and the role changes they make."""

    # ---- fencing and LeaderAndIsr ---------------------------------------------------------------

    def check_control_request(self, header: common_pb2.ControllerHeader) -> HighwaterError | None:
        """Fence a control request (Kafka: stale controller epoch; broker epoch older than ours).

        A newer broker epoch is accepted: it names this incarnation, registered a moment
        before the driver learned its epoch. Before registration, and while closing, the
        answer is BROKER_NOT_AVAILABLE, which the controller retries.
        """
        if self.closing:
            return BrokerNotAvailable(f"broker {self.broker_id} is shutting down")
        if self.broker_epoch < 0:
            return BrokerNotAvailable(f"broker {self.broker_id} has not registered yet; retry")
        if header.controller_epoch < self.controller_epoch:
            return StaleControllerEpoch(
                f"controller epoch {header.controller_epoch} is older than "
                f"{self.controller_epoch} already seen"
            )
        if 0 <= header.broker_epoch < self.broker_epoch:
            return StaleBrokerEpoch(
                f"request for broker epoch {header.broker_epoch}, older than this incarnation's "
                f"{self.broker_epoch}"
            )
        self.controller_epoch = header.controller_epoch
        return None

    def leader_and_isr(
        self, req: broker_pb2.LeaderAndIsrRequest
    ) -> Generator[None, None, broker_pb2.LeaderAndIsrResponse]:
        """becomeLeaderOrFollower: fence, then split into make-leader and make-follower."""
        err = self.check_control_request(req.header)
        if err is not None:
            return broker_pb2.LeaderAndIsrResponse(error_code=err.code, error_message=err.message)
        for node in req.live_leaders:
            # The controller's view is newer than our cache: a restarted leader has a new address.
            self.metadata.brokers[node.broker_id] = node
        results = []
        for i, item in enumerate(req.partitions):
            s = item.state
            if i and i % LEADER_AND_ISR_PARTITIONS_PER_YIELD == 0:
                yield
            if self.closing:
                results.append(
                    common_pb2.PartitionResult(
                        topic=s.topic,
                        partition=s.partition,
                        error_code=common_pb2.BROKER_NOT_AVAILABLE,
                        error_message=f"broker {self.broker_id} is shutting down",
                    )
                )
                continue
            code, message = self._leader_and_isr_partition(item)
            results.append(
                common_pb2.PartitionResult(
                    topic=s.topic, partition=s.partition, error_code=code, error_message=message
                )
            )
        # One line for every partition refused as not newer: a new controller repeats its whole
        # failover state to every broker (100,000 partitions at a takeover), and a line each cost
        # the brokers more CPU than applying the request.
        fenced = [r for r in results if r.error_code == common_pb2.FENCED_LEADER_EPOCH]
        if fenced:
            self.log.info(
                "LeaderAndIsr from controller epoch %d: %d of %d partitions at a leader epoch not newer "
                "than this broker's (a new controller repeating what it has, or a late request); "
                "refused, for example %s-%d: %s",
                req.header.controller_epoch,
                len(fenced),
                len(results),
                fenced[0].topic,
                fenced[0].partition,
                fenced[0].error_message,
            )
        return broker_pb2.LeaderAndIsrResponse(partitions=results)

    def _leader_and_isr_partition(
        self, item: broker_pb2.LeaderAndIsrPartition
    ) -> tuple[common_pb2.ErrorCode, str]:
        s = item.state
        tp = (s.topic, s.partition)
        existing = self.partitions.get(tp)
        if (
            existing is not None
            and s.leader_epoch == existing.leader_epoch
            and s.partition_epoch <= existing.partition_epoch
            and (not s.topic_id or self.topic_ids.get(tp) == s.topic_id)
            and self.broker_id in s.replicas
        ):
            # What this replica already applied (a new controller repeats its whole state): refused
            # as decide_leader_and_isr would, without building the state or raising for it.
            return common_pb2.FENCED_LEADER_EPOCH, (
                f"leader epoch {s.leader_epoch} is not newer than {existing.leader_epoch}"
            )
        state = LeaderAndIsrState(
            s.leader, s.leader_epoch, tuple(s.isr), tuple(s.replicas), s.partition_epoch, s.controller_epoch
        )
        try:
            self._drop_replica_of_an_older_topic(tp, s.topic_id)
            action = decide_leader_and_isr(self.broker_id, self.partitions.get(tp), state)
            if action is LeaderAndIsrAction.NOT_A_REPLICA:
                self.log.warning(
                    "LeaderAndIsr for %s-%d does not list broker %d among replicas %s; skipped",
                    *tp,
                    self.broker_id,
                    list(s.replicas),
                )
                return common_pb2.UNKNOWN_TOPIC_OR_PARTITION, "this broker is not a replica"
            if action is not LeaderAndIsrAction.ISR_UPDATED:
                p = self.partitions.get(tp) or self._create_partition(s, item.config)
                # The log of a replica that exists keeps its config here: a changed topic config
                # comes in UpdateMetadata (_take_topic_configs), and building a LogConfig for each
                # of a failover's partitions would cost 30 µs apiece.
                p.min_insync_replicas = max(1, item.config.min_insync_replicas or 1)
                if action is LeaderAndIsrAction.BECOME_LEADER:
                    self._make_leader(p, state)
                else:
                    self._make_follower(p, state)
                self.notify(tp)
            else:
                p = self.partitions[tp]
                if p.maybe_advance_high_watermark():  # a shrink can let the HW move on
                    self.notify(tp)
        except HighwaterError as exc:
            if exc.code == common_pb2.FENCED_LEADER_EPOCH:
                return exc.code, exc.message  # counted in one line per request (leader_and_isr)
            # Logged: a replica the controller thinks is fine but this broker refused (a topic config
            # its log cannot take, a storage error) must not fail every produce in silence.
            self.log.warning(
                "LeaderAndIsr for %s-%d at leader epoch %d refused: %s: %s",
                *tp,
                s.leader_epoch,
                exc.code_name(),
                exc.message,
            )
            return exc.code, exc.message
        return common_pb2.NONE, ""

    # ---- replicas on disk -----------------------------------------------------------------------

    def _stored_topic_id(self, tp: TopicPartitionKey) -> str:
        """The topic id in the replica's partition.metadata (Kafka's KIP-516 file); "" if none."""
        path = f"{self._partition_dir(tp)}/{PARTITION_METADATA_FILE}"
        if not self.storage.exists(path):
            return ""
        for line in self.storage.read_file(path).decode(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "topic_id":
                return value.strip()
        return ""

    def _drop_replica_of_an_older_topic(self, tp: TopicPartitionKey, topic_id: str) -> None:
        """A replica left on disk by a deleted topic of the same name goes before the new one starts.

        It stays behind when its broker was down while the topic was deleted, or while a
        reassignment moved the replica away; reusing its log would graft the old topic's
        records and leader epochs onto the new one (KIP-516 names topics by id for this).
        """
        if not topic_id:
            return
        stored = self.topic_ids.get(tp) if tp in self.partitions else self._stored_topic_id(tp)
        if not stored or stored == topic_id:
            return
        self.log.warning(
            "replica %s-%d on disk belongs to topic id %s, not %s (a deleted topic of the same "
            "name); deleting it",
            *tp,
            stored,
            topic_id,
        )
        self._remove_from_fetchers(tp)
        p = self.partitions.pop(tp, None)
        self.hw_checkpoint.forget(tp)
        self.topic_ids.pop(tp, None)
        if p is not None:
            p.change_role(Role.CLOSED)
            self.notify(tp)
            p.log.close()
            p.log.delete()
        else:
            self.storage.delete_dir(self._partition_dir(tp))

    def _create_partition(self, s: common_pb2.PartitionState, config: common_pb2.TopicConfig) -> Partition:
        tp = (s.topic, s.partition)
        directory = self._partition_dir(tp)
        plog = Log.open(
            directory,
            self.tune_log_config(log_config_from(config)),
            storage=self.storage,
            now_ms=self.clock.wall_ms(),
        )
        p = Partition(
            topic=s.topic,
            partition=s.partition,
            local_broker_id=self.broker_id,
            log=plog,
            session_fetch_ms=self.replica_sessions.last_fetch_ms,
        )
        # Never below the log start: a DeleteRecords up to the HW is checkpointed at once, the HW
        # only periodically, and a HW below the log start would answer ListOffsets' latest below
        # its earliest (Kafka's updateHighWatermark bounds it the same way).
        p.high_watermark = max(
            min(self.hw_checkpoint.stored_at_start((s.topic, s.partition)), plog.log_end_offset),
            plog.log_start_offset,
        )
        p.rebuild_producer_state()
        self.partitions[tp] = p
        if s.topic_id:
            if self._stored_topic_id(tp) != s.topic_id:
                self.storage.write_atomic(
                    f"{directory}/{PARTITION_METADATA_FILE}", f"version: 0\ntopic_id: {s.topic_id}\n".encode()
                )
            self.topic_ids[tp] = s.topic_id
        return p

    # ---- role changes and the replica fetchers -----------------------------------------------------

    def _make_leader(self, p: Partition, state: LeaderAndIsrState) -> None:
        self._remove_from_fetchers((p.topic, p.partition))
        p.become_leader(state, self.clock.monotonic_ms())
        p.maybe_advance_high_watermark()
        self.log.info(
            "became leader of %s-%d at epoch %d, LEO %d, HW %d, ISR %s",
            p.topic,
            p.partition,
            p.leader_epoch,
            p.log.log_end_offset,
            p.high_watermark,
            list(p.isr),
        )
        self.observer.on_become_leader(p)

    def _make_follower(self, p: Partition, state: LeaderAndIsrState) -> None:
        tp = (p.topic, p.partition)
        self._remove_from_fetchers(tp)
        p.become_follower(state)
        if state.leader < 0:
            self.log.info("%s-%d has no leader at epoch %d; not fetching", *tp, state.leader_epoch)
            return
        leader = self.metadata.brokers.get(state.leader)
        if leader is None:
            self.log.warning(
                "leader %d of %s-%d is not a live broker we know; waiting for metadata", state.leader, *tp
            )
            return
        fetcher = self._fetcher_for(state.leader, f"{leader.host}:{leader.port}")
        fetcher.add_partition(tp, state.leader_epoch, p.log.log_end_offset, self.topic_ids.get(tp, ""))
        self.log.info(
            "following %d for %s-%d at epoch %d from LEO %d, HW %d",
            state.leader,
            *tp,
            state.leader_epoch,
            p.log.log_end_offset,
            p.high_watermark,
        )

    def _fetcher_for(self, leader_id: int, address: str) -> FetcherCore:
        """The fetcher for a leader at its current address.

        A leader that restarted listens on a new address: its old fetcher is stopped and
        its partitions move to a new one, starting over in TRUNCATING (they may have
        missed an epoch change).
        """
        fetcher = self.fetchers.get(leader_id)
        if fetcher is not None and fetcher.leader_address == address:
            return fetcher
        moved = dict(fetcher.partitions) if fetcher is not None else {}
        if fetcher is not None:
            self._stop_fetcher(fetcher)
        fetcher = FetcherCore(
            local_broker_id=self.broker_id,
            broker_epoch=lambda: self.broker_epoch,
            leader_id=leader_id,
            leader_address=address,
            logs=self,
            clock=self.clock,
            log=self.log,
            settings=self.fetcher_settings,
            observer=self.observer,
        )
        self.fetchers[leader_id] = fetcher
        self.io.start_fetcher(fetcher)
        for tp, st in moved.items():
            leo = self.local_leo(tp)
            if leo is not None:
                fetcher.add_partition(tp, st.current_leader_epoch, leo, st.topic_id)
        return fetcher

    def _stop_fetcher(self, fetcher: FetcherCore) -> None:
        fetcher.stopped = True
        fetcher.wake()
        self.io.stop_fetcher(fetcher)

    def _remove_from_fetchers(self, tp: TopicPartitionKey) -> None:
        for fetcher in self.fetchers.values():
            fetcher.remove_partition(tp)

    # ---- StopReplica and UpdateMetadata ---------------------------------------------------------

    def stop_replica(self, req: broker_pb2.StopReplicaRequest) -> broker_pb2.StopReplicaResponse:
        err = self.check_control_request(req.header)
        if err is not None:
            return broker_pb2.StopReplicaResponse(error_code=err.code, error_message=err.message)
        results = []
        for item in req.partitions:
            tp = (item.topic, item.partition)
            self._remove_from_fetchers(tp)
            p = self.partitions.get(tp)
            if p is not None:
                p.change_role(Role.CLOSED if item.delete_partition else Role.NONE)
                self.notify(tp)
                if item.delete_partition:
                    self.partitions.pop(tp, None)
                    self.topic_ids.pop(tp, None)
                    self.hw_checkpoint.forget(tp)
                    p.log.close()
                    p.log.delete()
                    self.log.info("deleted replica %s-%d", *tp)
            elif item.delete_partition:
                self.hw_checkpoint.forget(tp)
                self.storage.delete_dir(f"{self.data_dir}/{item.topic}-{item.partition}")
            results.append(common_pb2.PartitionResult(topic=item.topic, partition=item.partition))
        return broker_pb2.StopReplicaResponse(partitions=results)

    def update_metadata(self, req: broker_pb2.UpdateMetadataRequest) -> broker_pb2.UpdateMetadataResponse:
        err = self.check_control_request(req.header)
        if err is not None:
            return broker_pb2.UpdateMetadataResponse(error_code=err.code, error_message=err.message)
        self.metadata.apply(req)
        for name in req.deleted_topics:
            self.applied_topic_configs.pop(name, None)
            metrics.forget_topic(name)
        if req.topic_configs:
            self._take_topic_configs(req.topic_configs)
        for leader_id, fetcher in list(self.fetchers.items()):
            node = self.metadata.brokers.get(leader_id)
            if node is not None and fetcher.leader_address != f"{node.host}:{node.port}":
                self._fetcher_for(leader_id, f"{node.host}:{node.port}")
        # ISR changes the controller made (shrinks after failures) reach leaders here too, and
        # news that a replica here was moved away. Only the request's states are read (a full
        # update's 100,000 are not indexed for this: the cache indexes them when first asked),
        # and none at all when this broker hosts nothing.
        hosted = self.partitions
        if hosted:
            for state in req.partitions:
                p = hosted.get((state.topic, state.partition))
                if p is None or p.role not in (Role.LEADER, Role.FOLLOWER):
                    continue
                if self._moved_away(p, state):
                    self._stop_stray_replica(p, state)
                elif p.role is Role.LEADER:
                    p.update_isr(tuple(state.isr), state.partition_epoch, state.leader_epoch)
                    if p.maybe_advance_high_watermark():  # a shrink can let the HW move on
                        self.notify((state.topic, state.partition))
        return broker_pb2.UpdateMetadataResponse()

    def _moved_away(self, p: Partition, state: common_pb2.PartitionState) -> bool:
        """A newer epoch of p whose replicas do not hold this broker (a state without replicas
        says nothing about them)."""
        replicas = state.replicas
        return bool(replicas) and state.leader_epoch > p.leader_epoch and self.broker_id not in replicas

    def _stop_stray_replica(self, p: Partition, state: common_pb2.PartitionState) -> None:
        """A replica the partition's newer epochs no longer count (Kafka's stray replica): it was
        moved away while this broker was cut off (a reassignment finished with this broker's
        session expired), so the StopReplica never came and no LeaderAndIsr will. A leader of an
        old epoch would otherwise go on taking writes nobody replicates and hold its readers'
        LSO back. Stopped as StopReplica without delete: the files stay, for an operator to look
        at, and a LeaderAndIsr naming this broker again starts the replica over."""
        tp = (p.topic, p.partition)
        self.log.warning(
            "%s-%d: this replica (%s at leader epoch %d) is not among the replicas %s of leader epoch "
            "%d: moved away while this broker was cut off; stopped, its files kept",
            *tp,
            p.role.name.lower(),
            p.leader_epoch,
            list(state.replicas),
            state.leader_epoch,
        )
        self._remove_from_fetchers(tp)
        p.change_role(Role.NONE)
        self.notify(tp)

    def _take_topic_configs(self, configs: Mapping[str, common_pb2.TopicConfig]) -> None:
        """Give this broker's replicas their topics' configs as the controller sent them: a config
        changed by AlterConfigs / AlterTopicConfigs reaches every broker in UpdateMetadata."""
        applied = self.applied_topic_configs
        changed = {name: config for name, config in configs.items() if applied.get(name) != config}
        if not changed:
            return
        built: dict[str, LogConfig] = {}  # one LogConfig per topic, not per replica
        for tp, p in self.partitions.items():
            config = changed.get(tp[0])
            if config is not None:
                log_config = built.get(tp[0])
                if log_config is None:
                    log_config = built[tp[0]] = self.tune_log_config(log_config_from(config))
                self._take_topic_config(p, config, log_config)
        applied.update(changed)

    def _take_topic_config(self, p: Partition, config: common_pb2.TopicConfig, new: LogConfig) -> None:
        """The log's settings (retention, segment size, max.message.bytes, timestamps) and the
        partition's min.insync.replicas from a topic config (`new`: its LogConfig), in force from
        the next append (a leader checks min.insync.replicas on each acks=all produce)."""
        if new != p.log.config:
            self.log.info("%s-%d takes its topic's changed config: %s", p.topic, p.partition, new)
            p.log.set_config(new)
        p.min_insync_replicas = max(1, config.min_insync_replicas or limits.DEFAULT_MIN_INSYNC_REPLICAS)
