"""The invariants of DESIGN.md section 8, checked after every step, and the history check at the end.

Step checks (a violation raises InvariantBroken at once, with the values that broke it):
1. Controller: /controller_epoch only grows; one controller id per epoch; every partition
   state committed to etcd carries the /controller_epoch in force when it committed
   (a deposed controller's write getting through is a broken fence); no two candidates
   act with the same epoch.
2. leader_epoch never decreases, in etcd and on a broker; no two brokers become leader
   of a partition in the same epoch.
3. On every replica HW <= LEO; a leader's HW never goes back while it stays leader, and
   never passes the LEO of a member the committed ISR (same leader epoch) counts;
   consumers are answered only with offsets below the answer's HW.
4. An acks=all success is sent only with |ISR| >= min.insync.replicas and every ISR
   member (the leader's view, and etcd's for the same epoch) holding the batch in the
   same leader epoch. Members that restarted since the append are excused: their
   lease still counts them for a few seconds, which Kafka accepts too.
5. A leader change in etcd picks a member of the previous ISR (unclean election is off);
   leader and ISR stay within the partition's replicas.
6. Truncation never cuts a committed record (same offset, value and leader epoch), and
   right after it the follower's log is a prefix of its leader's (compared by
   leader-epoch lineage, which with rule 2 determines the content).

History (recorded as it happens, checked again at the end once the cluster healed):
- every acknowledged acks=all record is at its offset on the leader and on every ISR
  member; no offset ever holds two different committed values (acks=all acks and
  consumer reads both commit a value); every consumer read its partitions in order,
  with no gap and no acknowledged record skipped; no consumer saw a value nobody sent;
  an idempotent producer's record is in the log once (rule 8).

At the end, once the cluster healed and settled (liveness, judged only where it must hold:
partitions of topics not being deleted whose replicas are all up and whose history is
not compromised):
- no reassignment is left open (AR == RAR, nothing adding or removing, no
  /admin/reassign_partitions key);
- the partition has a leader that leads its epoch, every other replica follows that
  leader in that epoch, and the ISR, in etcd and on the leader, is every replica;
- a deleted topic has no key left in etcd and no replica on any live broker.

Deleted topics: from the moment the operator asks for a deletion until the topic is
created again, nothing of it enters the history (clients drop its batches and fetches
too); when its keys go, everything known about its partitions goes with them, so the
re-created topic's leader epochs and offsets start again from nothing.

Retention: records below a replica's log start offset were deleted by retention (only
ever below the HW, which the checker verifies when a consumer resets to a leader's log
start); they are not looked for there, and a consumer that reset past them skipped them
legitimately.

"While one ISR member survives": a power loss makes a broker lose its unflushed
bytes, so it no longer counts as holding the partition's committed records (`intact`)
until it rejoins the ISR by catching up with an intact leader. If at some point no
member of a partition's committed ISR is intact, every copy of its acknowledged
records may be gone without any rule being broken: the partition is "compromised" and
its history is not checked again in that run (deposed leaders may still serve the
lost lineage for a while); its step invariants still are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from clients.common.record_batch import iter_batch_headers
from clients.common.records import decode_batches
from clients.common.types import TopicPartitionKey
from coordinator.store import WatchEvent
from services.broker.partition import Partition, Role
from services.controller import metadata_image
from services.controller.context import LeaderAndIsr, TopicInfo
from tests.sim.clock import EventLoop, Node
from tests.sim.sim_etcd import SimEtcd, run_sync

if TYPE_CHECKING:
    from tests.sim.sim_broker import SimBroker
    from tests.sim.sim_broker_seams import AppendRecord
    from tests.sim.sim_controller import SimController
    from tests.sim.workload import Consumer, Producer


# Bytes read per call when the final check reads a whole log.
FINAL_READ_BYTES = 1 << 20


class InvariantBroken(Exception):
    """A rule of DESIGN.md section 8 does not hold: the message says which, with the values."""


@dataclass
class _PartitionHistory:
    # offset -> the value committed there (by an acks=all ack or a consumer read).
    committed: dict[int, bytes] = field(default_factory=dict)
    # offset -> leader epoch of the committed record's batch, where known (HW passed it on
    # the leader that wrote it, or a consumer read it): with the value, it names one record.
    committed_epoch: dict[int, int] = field(default_factory=dict)
    # offset -> value of acknowledged acks=all records (a subset of committed).
    acked_all: dict[int, bytes] = field(default_factory=dict)
    # Brokers believed to hold every committed record (see the module docstring).
    intact: set[int] = field(default_factory=set)
    compromised_at_ms: list[int] = field(default_factory=list)
    # value -> the one offset where a consumer read it (idempotent producers' values only).
    idempotent_offsets: dict[bytes, int] = field(default_factory=dict)


class Checker:
    def __init__(self, loop: EventLoop, etcd: SimEtcd) -> None:
        self.loop = loop
        self.etcd = etcd
        self.keys = etcd.keys
        self.brokers: dict[int, SimBroker] = {}
        # id(node) -> broker, for the per-step replica checks (set by the simulation).
        self._broker_of_node: dict[int, SimBroker] = {}
        self.controllers: dict[int, SimController] = {}
        self.consumers: list[Consumer] = []
        self._watch = etcd.subscribe(self.keys.prefix + "/")
        self._seen_revision = etcd.store.revision
        self.controller_epoch = 0
        self.controller_by_epoch: dict[int, int] = {}
        self.states: dict[TopicPartitionKey, LeaderAndIsr] = {}
        self.assignments: dict[TopicPartitionKey, tuple[int, ...]] = {}  # AR, from /brokers/topics/{topic}
        # RAR of partitions being reassigned (AR minus removing_replicas), from the same key.
        self.reassigning: dict[TopicPartitionKey, tuple[int, ...]] = {}
        # Reassignments whose targets all joined the ISR in the last step (the simulation's
        # scenarios read and clear it).
        self.reassignments_due: list[TopicPartitionKey] = []
        # (broker id, broker epoch) of registrations made in the last step (the scenarios read and clear it).
        self.registrations: list[tuple[int, int]] = []
        # Topics the operator asked to delete and has not created again: left out of the history.
        self.deleting: set[str] = set()
        # Topics whose keys went from etcd (deleted) and that were not created again.
        self.deleted: set[str] = set()
        # topic_id of each topic in etcd: a new id under a known name is a re-created topic.
        self.topic_ids: dict[str, str] = {}
        # (tp, leader epoch) -> (broker, incarnation) that became its leader first
        self.leader_of_epoch: dict[tuple[TopicPartitionKey, int], tuple[int, int]] = {}
        # (broker, tp) -> (replica object, incarnation, role, leader_epoch, hw) at the last step of that
        # broker; a new Partition object (deleted, then created again) starts afresh.
        self._last_replica: dict[tuple[int, TopicPartitionKey], tuple[Partition, int, Role, int, int]] = {}
        self.history: dict[TopicPartitionKey, _PartitionHistory] = {}
        self.produced: set[bytes] = set()
        # Values of idempotent producers: each may be in a log once at most (rule 8).
        self.idempotent_values: set[bytes] = set()
        self.acks_all_total = 0
        self.acks_one_total = 0
        self.records_consumed = 0
        self.truncations_checked = 0
        # Followers that restarted their log at the leader's log start (retention passed them).
        self.log_start_resets = 0
        self.consumer_resets = 0
        # Leaders that lost data while replicas that kept it were in the ISR (for diagnosis).
        self.suspect_leaders: list[str] = []

    def watch_brokers(self, brokers: list[SimBroker]) -> None:
        self.brokers = {b.broker_id: b for b in brokers}
        self._broker_of_node = {id(b): b for b in brokers}

    def fail(self, fmt: str, *args: object) -> None:
        raise InvariantBroken(fmt % args if args else fmt)

    def incarnations(self) -> dict[int, int]:
        return {b: broker.incarnation for b, broker in self.brokers.items()}

    def _history(self, tp: TopicPartitionKey) -> _PartitionHistory:
        h = self.history.get(tp)
        if h is None:
            h = self.history[tp] = _PartitionHistory()
        return h

    # ---- after every step -------------------------------------------------------------

    def after_step(self, node: Node | None) -> None:
        if self.etcd.store.revision != self._seen_revision:
            self._seen_revision = self.etcd.store.revision
            for events in self._watch.drain():
                self._on_etcd_revision(events)
        broker = self._broker_of_node.get(id(node))
        if broker is not None and broker.up:
            self._check_replicas(broker)

    def _check_replicas(self, broker: SimBroker) -> None:
        last_seen = self._last_replica
        broker_id, incarnation = broker.broker_id, broker.incarnation
        for tp, p in broker.partitions.items():
            hw = p.high_watermark
            if hw > p.log.log_end_offset:
                self.fail(
                    "HW above LEO: %s-%d on broker %d has HW %d, LEO %d",
                    *tp,
                    broker_id,
                    hw,
                    p.log.log_end_offset,
                )
            if p.role is Role.LEADER:
                committed = self.states.get(tp)
                if (
                    committed is not None
                    and committed.leader == broker_id
                    and committed.leader_epoch == p.leader_epoch
                ):
                    # Members the controller counts in sync but the leader's HW ignores, that the HW
                    # has already passed: elect one of them and committed records are gone.
                    behind = sorted(
                        r
                        for r in set(committed.isr) - set(p.isr) - set(p.pending_isr or ())
                        if r in p.followers and hw > p.followers[r].log_end_offset
                    )
                    if behind:
                        self.fail(
                            "leader %d of %s-%d moved its HW to %d counting ISR %s (pending %s), but the "
                            "committed ISR is %s (leader epoch %d, partition epoch %d): the HW no longer "
                            "waits for %s, at LEO %s",
                            broker_id,
                            *tp,
                            hw,
                            list(p.isr),
                            p.pending_isr,
                            list(committed.isr),
                            committed.leader_epoch,
                            committed.partition_epoch,
                            behind,
                            [p.followers[r].log_end_offset for r in behind],
                        )
            key = (broker_id, tp)
            last = last_seen.get(key)
            if last is not None and last[0] is p and last[1] == incarnation:
                _, _, last_role, last_epoch, last_hw = last
                if p.log.log_start_offset > last_hw:
                    self.log_start_resets += 1  # truncate_fully_and_start_at: retention passed it
                if p.leader_epoch < last_epoch:
                    self.fail(
                        "leader epoch of %s-%d went back on broker %d: %d -> %d",
                        *tp,
                        broker_id,
                        last_epoch,
                        p.leader_epoch,
                    )
                if p.role is Role.LEADER and last_role is Role.LEADER and hw < last_hw:
                    self.fail(
                        "leader HW went back: %s-%d on broker %d from %d to %d (epoch %d -> %d)",
                        *tp,
                        broker_id,
                        last_hw,
                        hw,
                        last_epoch,
                        p.leader_epoch,
                    )
                if last_role is p.role and last_epoch == p.leader_epoch and last_hw == hw:
                    continue
            last_seen[key] = (p, incarnation, p.role, p.leader_epoch, hw)

    # ---- etcd: controller epochs, partition states ---------------------------------------

    def _on_etcd_revision(self, events: list[WatchEvent]) -> None:
        elected: dict[str, int] | None = None
        touched: set[TopicPartitionKey] = set()
        for e in events:
            if e.kind != "put":
                if e.kind == "delete":
                    kind = self.keys.classify_topic_key(e.key)
                    if kind is not None and kind[0] == "topic":
                        self._forget_topic(kind[1])
                continue
            if e.key == self.keys.controller_epoch:
                epoch = int(e.value)
                if epoch <= self.controller_epoch:
                    self.fail("/controller_epoch went from %d to %d", self.controller_epoch, epoch)
                self.controller_epoch = epoch
            elif e.key == self.keys.controller:
                elected = json.loads(e.value)
            elif e.key.startswith(self.keys.brokers_prefix):
                if e.version == 1:
                    self.registrations.append((self.keys.parse_broker_id(e.key), e.create_revision))
            else:
                kind = self.keys.classify_topic_key(e.key)
                if kind is not None and kind[0] == "partition_state":
                    tp = (kind[1], kind[2])  # type: ignore[misc]
                    self._on_state_write(tp, metadata_image.partition_state(e.value, e.version))
                    touched.add(tp)
                elif kind is not None and kind[0] == "topic":
                    topic = metadata_image.topic_info(kind[1], e.value)
                    self._on_topic_write(topic)
                    touched.update((kind[1], p) for p in topic.assignment)
        for tp in sorted(touched):
            # Checked once the whole transaction is in: a reassignment writes both keys at once.
            state, replicas = self.states.get(tp), self.assignments.get(tp)
            if state is None or replicas is None:
                continue
            if (state.leader >= 0 and state.leader not in replicas) or not set(state.isr) <= set(replicas):
                self.fail(
                    "%s-%d: leader %d / ISR %s outside its replicas %s (leader epoch %d)",
                    *tp,
                    state.leader,
                    list(state.isr),
                    list(replicas),
                    state.leader_epoch,
                )
            target = self.reassigning.get(tp)
            if target is not None and set(target) <= set(state.isr):
                self.reassignments_due.append(tp)
        if elected is not None:
            epoch, controller_id = int(elected["epoch"]), int(elected["controller_id"])
            if epoch != self.controller_epoch:
                self.fail(
                    "controller %d registered with epoch %d but /controller_epoch is %d",
                    controller_id,
                    epoch,
                    self.controller_epoch,
                )
            holder = self.controller_by_epoch.setdefault(epoch, controller_id)
            if holder != controller_id:
                self.fail("two controllers for epoch %d: %d and %d", epoch, holder, controller_id)

    def _on_topic_write(self, topic: TopicInfo) -> None:
        known_id = self.topic_ids.get(topic.name)
        if known_id is not None and known_id != topic.topic_id:
            self.fail(
                "topic %s got id %s over %s without being deleted first", topic.name, topic.topic_id, known_id
            )
        if known_id is None:
            self.topic_ids[topic.name] = topic.topic_id
            self.deleted.discard(topic.name)
            self.deleting.discard(topic.name)  # created again: its history starts now
        for p, replicas in topic.assignment.items():
            tp = (topic.name, p)
            self.assignments[tp] = tuple(replicas)
            if p in topic.adding_replicas or p in topic.removing_replicas:
                removing = set(topic.removing_replicas.get(p, ()))
                self.reassigning[tp] = tuple(r for r in replicas if r not in removing)
            else:
                self.reassigning.pop(tp, None)

    def _forget_topic(self, topic: str) -> None:
        """The topic's keys left etcd: everything known about its partitions goes with them."""
        if self.topic_ids.pop(topic, None) is None:
            return
        self.deleted.add(topic)
        self.loop.trace("check", "topic %s deleted from etcd", (topic,))
        for table in (self.states, self.assignments, self.reassigning, self.history):
            for tp in [tp for tp in table if tp[0] == topic]:
                del table[tp]  # type: ignore[attr-defined]
        self.leader_of_epoch = {k: v for k, v in self.leader_of_epoch.items() if k[0][0] != topic}

    def on_topic_deletion_requested(self, topic: str) -> None:
        """The operator sends DeleteTopics: from now on nothing of the topic enters the history."""
        self.deleting.add(topic)
        for tp in [tp for tp in self.history if tp[0] == topic]:
            del self.history[tp]

    def _on_state_write(self, tp: TopicPartitionKey, state: LeaderAndIsr) -> None:
        if state.controller_epoch != self.controller_epoch:
            self.fail(
                "controller epoch fence broken: the state of %s-%d (leader %d, leader epoch %d, ISR %s) "
                "was committed by controller epoch %d while /controller_epoch is %d",
                *tp,
                state.leader,
                state.leader_epoch,
                list(state.isr),
                state.controller_epoch,
                self.controller_epoch,
            )
        old = self.states.get(tp)
        h = self._history(tp)
        if old is None:
            h.intact = set(state.isr)
        else:
            if state.leader_epoch < old.leader_epoch:
                self.fail(
                    "leader epoch of %s-%d went back in etcd: %d -> %d",
                    *tp,
                    old.leader_epoch,
                    state.leader_epoch,
                )
            if state.leader_epoch > old.leader_epoch and state.leader >= 0 and state.leader not in old.isr:
                self.fail(
                    "unclean election: %s-%d leader %d at epoch %d is not in the previous ISR %s",
                    *tp,
                    state.leader,
                    state.leader_epoch,
                    list(old.isr),
                )
            if state.leader_epoch == old.leader_epoch and old.leader in h.intact:
                # An ISR expansion by the leader: the new member caught up with an intact leader,
                # unless it went down since (the commit can come after a power loss that took
                # what it had fetched: it is not intact then, whatever the ISR says).
                h.intact.update(
                    r for r in state.isr if r not in old.isr and (r not in self.brokers or self.brokers[r].up)
                )
        self.states[tp] = state
        self._maybe_compromised(tp)

    def _maybe_compromised(self, tp: TopicPartitionKey) -> None:
        state = self.states.get(tp)
        h = self._history(tp)
        if h.compromised_at_ms or state is None or not state.isr or h.intact & set(state.isr):
            return
        # No ISR member still holds what was committed: losing it breaks no rule. Deposed leaders
        # may still serve the old lineage for a while, so the partition's history is not checked
        # again in this run (its step invariants still are).
        self.loop.trace(
            "check",
            "%s-%d compromised: ISR %s all lost unflushed data; history excused",
            (*tp, list(state.isr)),
        )
        h.compromised_at_ms.append(self.loop.now_ms)
        h.committed.clear()
        h.committed_epoch.clear()
        h.acked_all.clear()
        h.idempotent_offsets.clear()

    def on_power_loss(self, broker_id: int) -> None:
        for tp, h in self.history.items():
            h.intact.discard(broker_id)
            self._maybe_compromised(tp)

    # ---- controllers ---------------------------------------------------------------------

    def on_controller_active(self, controller: SimController, epoch: int) -> None:
        for other in self.controllers.values():
            if other is not controller and other.up and other.active is not None and other.epoch == epoch:
                self.fail(
                    "controllers %d and %d both active at epoch %d",
                    other.controller_id,
                    controller.controller_id,
                    epoch,
                )

    # ---- brokers ---------------------------------------------------------------------------

    def on_become_leader(self, broker: SimBroker, p: Partition) -> None:
        tp = (p.topic, p.partition)
        holder, incarnation = self.leader_of_epoch.setdefault(
            (tp, p.leader_epoch), (broker.broker_id, broker.incarnation)
        )
        if holder != broker.broker_id:
            self.fail(
                "two leaders of %s-%d in leader epoch %d: brokers %d and %d",
                *tp,
                p.leader_epoch,
                holder,
                broker.broker_id,
            )
        if incarnation != broker.incarnation:
            # The same epoch led by a new process: whatever the old one wrote in that epoch and
            # the new one does not have, the new one may now write differently, so the epoch no
            # longer names one history (fine after kill -9, harmful after a power loss).
            self.suspect_leaders.append(
                f"{tp[0]}-{tp[1]} epoch {p.leader_epoch}: broker {broker.broker_id} leads the same epoch "
                f"again after a restart (LEO {p.log.log_end_offset}) ({self.loop.now_ms} ms)"
            )
        h = self._history(tp)
        state = self.states.get(tp)
        intact_members = h.intact & set(state.isr) if state is not None else set()
        if broker.broker_id not in h.intact and intact_members:
            # Not against rules 2 or 5 as written, but this replica lost unflushed data since it
            # was last known to hold every committed record, while members that kept them exist.
            self.suspect_leaders.append(
                f"{tp[0]}-{tp[1]} epoch {p.leader_epoch}: broker {broker.broker_id} leads after a power loss "
                f"(LEO {p.log.log_end_offset}) and a restart the controller did not act on, while ISR "
                f"members {sorted(intact_members)} kept every record ({self.loop.now_ms} ms)"
            )

    def on_acks_all_success(self, broker: SimBroker, p: Partition, rec: AppendRecord) -> None:
        tp = rec.tp
        if len(p.isr) < p.min_insync_replicas:
            self.fail(
                "acks=all success for %s-%d with ISR %s below min.insync.replicas %d",
                *tp,
                list(p.isr),
                p.min_insync_replicas,
            )
        if rec.duplicate:
            return  # written (and maybe acknowledged) before: the members of that time are unknown here
        h = self._history(tp)
        if not h.compromised_at_ms and tp[0] not in self.deleting:
            for offset in range(rec.first_offset, rec.next_offset):
                h.committed_epoch[offset] = rec.leader_epoch
        members = set(p.isr) | set(p.pending_isr or ())
        committed = self.states.get(tp)
        if committed is not None and committed.leader_epoch == rec.leader_epoch:
            members |= set(committed.isr)
        for r in sorted(members):
            holder = self.brokers.get(r)
            if holder is None or not holder.up or holder.incarnation != rec.incarnations.get(r):
                continue
            rp = holder.partitions.get(tp)
            if rp is None and (r not in self.assignments.get(tp, ()) or tp[0] in self.deleting):
                continue  # reassigned away or its topic deleted, and deleted since it replicated the batch
            leo = rp.log.log_end_offset if rp is not None else -1
            epoch = rp.log.leader_epoch_cache.epoch_for_offset(rec.first_offset) if rp is not None else None
            # A duplicate (an idempotent retry) was written earlier, maybe in an older epoch.
            if leo < rec.next_offset or (epoch != rec.leader_epoch and not rec.duplicate):
                self.fail(
                    "acks=all success for %s-%d [%d, %d) at leader epoch %d by broker %d, but ISR member %d "
                    "has LEO %d and epoch %s at offset %d",
                    *tp,
                    rec.first_offset,
                    rec.next_offset,
                    rec.leader_epoch,
                    broker.broker_id,
                    r,
                    leo,
                    epoch,
                    rec.first_offset,
                )

    def before_truncation(self, follower: SimBroker, tp: TopicPartitionKey, offset: int) -> None:
        """A replica is about to cut [offset, LEO): none of those records may be a committed one.

        Leader-epoch truncation only cuts what the leader does not have, and the leader has
        every committed record; a cut record equal to the one committed at its offset means the
        replica threw away committed data (and may be elected without it).
        """
        h = self._history(tp)
        p = follower.partitions.get(tp)
        if p is None or h.compromised_at_ms or not h.committed or offset >= p.log.log_end_offset:
            return
        if offset > max(h.committed):
            return
        for o, (value, epoch) in read_log(p, offset).items():
            if o >= offset and h.committed.get(o) == value and h.committed_epoch.get(o) == epoch:
                self.fail(
                    "broker %d cuts committed record %r (leader epoch %d) at offset %d of %s-%d (truncating "
                    "from LEO %d to %d, HW %d)",
                    follower.broker_id,
                    value,
                    epoch,
                    o,
                    *tp,
                    p.log.log_end_offset,
                    offset,
                    p.high_watermark,
                )

    def after_truncation(
        self, follower: SimBroker, tp: TopicPartitionKey, leader_id: int, leader_epoch: int
    ) -> None:
        leader = self.brokers.get(leader_id)
        fp = follower.partitions.get(tp)
        if leader is None or not leader.up or fp is None:
            return
        lp = leader.partitions.get(tp)
        if lp is None or lp.role is not Role.LEADER or lp.leader_epoch != leader_epoch:
            return
        self.truncations_checked += 1
        mismatch = lineage_mismatch(fp, lp)
        if mismatch is not None:
            self.fail(
                "after truncating, broker %d's log of %s-%d is not a prefix of leader %d's (epoch %d): %s",
                follower.broker_id,
                *tp,
                leader_id,
                leader_epoch,
                mismatch,
            )

    # ---- clients ---------------------------------------------------------------------------

    def on_produce_attempt(self, values: list[bytes], *, idempotent: bool) -> None:
        self.produced.update(values)
        if idempotent:
            self.idempotent_values.update(values)

    def on_renumbered(self, values: list[bytes]) -> None:
        """An idempotent producer bumped its epoch and resent these: a second copy is no bug."""
        self.idempotent_values.difference_update(values)

    def on_produce_ack(
        self, producer: Producer, tp: TopicPartitionKey, base_offset: int, values: list[bytes], acks: int
    ) -> None:
        h = self._history(tp)
        if acks != -1:
            self.acks_one_total += 1
            return  # acks=1 promises nothing beyond the leader: it may be lost, even overwritten
        self.acks_all_total += 1
        if h.compromised_at_ms or tp[0] in self.deleting:
            return
        for i, value in enumerate(values):
            offset = base_offset + i
            prior = h.committed.get(offset)
            if prior is not None and prior != value:
                self.fail(
                    "two records at offset %d of %s-%d: %r was committed, now %r is acknowledged (acks=all)",
                    offset,
                    *tp,
                    prior,
                    value,
                )
            h.committed[offset] = value
            h.acked_all[offset] = value

    def on_consume(
        self,
        consumer: Consumer,
        tp: TopicPartitionKey,
        position: int,
        offset: int,
        value: bytes,
        epoch: int,
        high_watermark: int,
    ) -> None:
        h = self._history(tp)
        self.records_consumed += 1
        if offset >= high_watermark:
            self.fail(
                "consumer %s read offset %d of %s-%d at or above the HW %d",
                consumer.name,
                offset,
                *tp,
                high_watermark,
            )
        if h.compromised_at_ms or tp[0] in self.deleting:
            return
        if offset != position:
            self.fail(
                "consumer %s expected offset %d of %s-%d next but got %d: offsets skipped",
                consumer.name,
                position,
                *tp,
                offset,
            )
        if value not in self.produced:
            self.fail(
                "consumer %s read %r at offset %d of %s-%d, which no producer sent",
                consumer.name,
                value,
                offset,
                *tp,
            )
        prior = h.committed.get(offset)
        if prior is not None and prior != value:
            self.fail(
                "committed record changed: offset %d of %s-%d held %r, consumer %s now reads %r",
                offset,
                *tp,
                prior,
                consumer.name,
                value,
            )
        h.committed[offset] = value
        h.committed_epoch[offset] = epoch
        if value in self.idempotent_values:
            first = h.idempotent_offsets.setdefault(value, offset)
            if first != offset:
                self.fail(
                    "idempotent producer's %r written twice in %s-%d: offsets %d and %d",
                    value,
                    *tp,
                    first,
                    offset,
                )

    def on_consumer_reset(
        self,
        consumer: Consumer,
        tp: TopicPartitionKey,
        position: int,
        log_start_offset: int,
        high_watermark: int,
    ) -> None:
        """A leader said `position` is below its log start: retention deleted [position, log start)."""
        self.consumer_resets += 1
        if log_start_offset > high_watermark:
            self.fail(
                "a leader of %s-%d answered consumer %s with log start %d above its HW %d: retention deleted "
                "records that were not committed",
                *tp,
                consumer.name,
                log_start_offset,
                high_watermark,
            )

    # ---- the end ---------------------------------------------------------------------------

    def final_check(self) -> None:
        """After the settle phase: every acknowledged record where it must be, consumers complete, and
        the cluster converged (`liveness_problem`)."""
        for tp, state in sorted(self.states.items()):
            h = self._history(tp)
            if h.compromised_at_ms or tp[0] in self.deleting:
                continue
            if state.leader < 0:
                self.fail("%s-%d has no leader after the settle phase (ISR %s)", *tp, list(state.isr))
            leader = self.brokers[state.leader]
            lp = leader.partitions.get(tp)
            if (
                not leader.up
                or lp is None
                or lp.role is not Role.LEADER
                or lp.leader_epoch != state.leader_epoch
            ):
                self.fail(
                    "%s-%d: broker %d does not lead epoch %d after the settle phase (%s)",
                    *tp,
                    state.leader,
                    state.leader_epoch,
                    leader.describe(),
                )
            log_start = lp.log.log_start_offset
            if log_start > lp.high_watermark:
                self.fail(
                    "%s-%d: leader %d's log start %d is above its HW %d: retention deleted records that were "
                    "not committed",
                    *tp,
                    state.leader,
                    log_start,
                    lp.high_watermark,
                )
            leader_log = {o: value for o, (value, _) in read_log(lp).items()}
            seen_at: dict[bytes, int] = {}
            for offset, value in sorted(leader_log.items()):
                if value in self.idempotent_values and seen_at.setdefault(value, offset) != offset:
                    self.fail(
                        "idempotent producer's %r written twice in %s-%d: offsets %d and %d on leader %d",
                        value,
                        *tp,
                        seen_at[value],
                        offset,
                        state.leader,
                    )
            for offset, value in sorted(h.acked_all.items()):
                got = leader_log.get(offset)
                if got != value and offset >= log_start:  # below the log start: deleted by retention
                    self.fail(
                        "acknowledged record lost: %s-%d offset %d should hold %r, leader %d has %r",
                        *tp,
                        offset,
                        value,
                        state.leader,
                        got,
                    )
            for r in state.isr:
                if r == state.leader:
                    continue
                member = self.brokers[r]
                rp = member.partitions.get(tp)
                if not member.up or rp is None:
                    self.fail("%s-%d: ISR member %d holds no replica after the settle phase", *tp, r)
                replica_log = {o: value for o, (value, _) in read_log(rp).items()}
                for offset, value in sorted(h.acked_all.items()):
                    if replica_log.get(offset) != value and offset >= rp.log.log_start_offset:
                        self.fail(
                            "acknowledged record missing on ISR member %d: %s-%d offset %d should hold %r, "
                            "it has %r",
                            r,
                            *tp,
                            offset,
                            value,
                            replica_log.get(offset),
                        )
                for offset in range(
                    max(rp.log.log_start_offset, log_start), min(lp.high_watermark, rp.log.log_end_offset)
                ):
                    if replica_log.get(offset) != leader_log.get(offset):
                        self.fail(
                            "ISR member %d diverges from leader %d on %s-%d at offset %d below the HW: "
                            "%r vs %r",
                            r,
                            state.leader,
                            *tp,
                            offset,
                            replica_log.get(offset),
                            leader_log.get(offset),
                        )
            for consumer in self.consumers:
                seen = consumer.seen.get(tp, {})
                position = consumer.positions.get(tp, 0)
                skipped = consumer.skipped.get(tp, [])
                for offset, value in sorted(h.acked_all.items()):
                    if (
                        offset < position
                        and seen.get(offset) != value
                        and not any(start <= offset < end for start, end in skipped)
                    ):
                        self.fail(
                            "consumer %s passed offset %d of %s-%d without reading the acknowledged %r "
                            "(it read %r)",
                            consumer.name,
                            offset,
                            *tp,
                            value,
                            seen.get(offset),
                        )
        problem = self.liveness_problem()
        if problem is not None:
            self.fail("%s", problem)

    def liveness_problem(self) -> str | None:
        """What keeps the healed cluster from having converged, or None (see the module docstring).

        Judged only where it must hold once every fault has ended and the settle phase passed:
        partitions of topics not being deleted, whose replicas are all up and whose history is
        not compromised (every ISR member lost data: no clean leader may be left to elect).
        """
        kv = run_sync(self.etcd.store.get(self.keys.reassign_partitions))
        if kv is not None:
            return f"/admin/reassign_partitions still holds {kv.value!r} after the settle phase"
        for tp, target in sorted(self.reassigning.items()):
            if tp[0] not in self.deleting:
                return (
                    f"{tp[0]}-{tp[1]}: reassignment to {list(target)} still open after the settle phase "
                    f"(replicas {list(self.assignments.get(tp, ()))}, state {self._describe_state(tp)})"
                )
        for tp, state in sorted(self.states.items()):
            replicas = self.assignments.get(tp, ())
            if (
                tp[0] in self.deleting
                or self._history(tp).compromised_at_ms
                or not all(self.brokers[r].up for r in replicas)
            ):
                continue
            leader = self.brokers.get(state.leader)
            lp = leader.partitions.get(tp) if leader is not None else None
            if lp is None or lp.role is not Role.LEADER or lp.leader_epoch != state.leader_epoch:
                return (
                    f"{tp[0]}-{tp[1]}: no broker leads it in epoch {state.leader_epoch} after the settle "
                    "phase "
                    f"(state {self._describe_state(tp)}; {leader.describe() if leader else 'no leader'})"
                )
            for r in replicas:
                if r == state.leader:
                    continue
                rp = self.brokers[r].partitions.get(tp)
                if (
                    rp is None
                    or rp.role is not Role.FOLLOWER
                    or rp.leader_epoch != state.leader_epoch
                    or rp.leader_id != state.leader
                ):
                    return (
                        f"{tp[0]}-{tp[1]}: replica {r} does not follow leader {state.leader} in epoch "
                        f"{state.leader_epoch} after the settle phase ({self.brokers[r].describe()})"
                    )
            if set(state.isr) != set(replicas) or set(lp.isr) != set(replicas):
                return (
                    f"{tp[0]}-{tp[1]}: ISR {list(state.isr)} (leader {state.leader} has {list(lp.isr)}) is "
                    f"not every replica {list(replicas)} after the settle phase; "
                    + "; ".join(self.brokers[r].describe() for r in replicas)
                )
        for topic in sorted(self.deleting | self.deleted):
            keys = [self.keys.topic(topic), self.keys.topic_config(topic), self.keys.delete_topic(topic)]
            left = [key for key in keys if run_sync(self.etcd.store.get(key)) is not None]
            states, _ = run_sync(self.etcd.store.get_prefix(self.keys.topic_partitions_prefix(topic)))
            left.extend(kv.key for kv in states)
            if left:
                return f"topic {topic} was deleted but etcd still has {left}"
            for broker in self.brokers.values():
                held = sorted(tp for tp in broker.partitions if tp[0] == topic)
                if broker.up and held:
                    return (
                        f"topic {topic} was deleted but broker {broker.broker_id} still has replicas {held}"
                    )
        return None

    def _describe_state(self, tp: TopicPartitionKey) -> str:
        s = self.states.get(tp)
        if s is None:
            return "none"
        return f"leader {s.leader} epoch {s.leader_epoch} isr {list(s.isr)}"


def decode_records(buf: bytes) -> list[tuple[int, bytes, int]]:
    """(offset, value, leader epoch of its batch) of every record in whole batches of `buf`."""
    out = []
    view = memoryview(buf)
    for header in iter_batch_headers(buf):
        epoch = header.partition_leader_epoch
        batch = view[header.position : header.position + header.size_bytes]
        out.extend((r.offset, r.value or b"", epoch) for r in decode_batches(batch))
    return out


def read_log(p: Partition, start_offset: int = 0) -> dict[int, tuple[bytes, int]]:
    """Every record of a replica's log from start_offset on (whole batches): offset -> (value, epoch)."""
    out: dict[int, tuple[bytes, int]] = {}
    log = p.log
    offset = max(log.log_start_offset, start_offset)
    while offset < log.log_end_offset:
        info = log.read(offset, max_bytes=FINAL_READ_BYTES)
        if info.is_empty:
            break
        for record_offset, value, epoch in decode_records(bytes(info.records)):
            out[record_offset] = (value, epoch)
        offset = info.next_offset
    return out


def lineage_mismatch(follower: Partition, leader: Partition) -> str | None:
    """Where the follower's log stops being a prefix of the leader's, judged by leader epochs;
    None if it is.
    """
    f_leo = follower.log.log_end_offset
    l_leo = leader.log.log_end_offset
    if f_leo > l_leo:
        return f"follower LEO {f_leo} is beyond leader LEO {l_leo}"
    f_cache = follower.log.leader_epoch_cache
    l_cache = leader.log.leader_epoch_cache
    starts = {start for _, start in f_cache.entries() if start < f_leo}
    starts |= {start for _, start in l_cache.entries() if start < f_leo}
    # Below either log start, retention deleted the records (and the epochs' start offsets moved).
    log_start = max(follower.log.log_start_offset, leader.log.log_start_offset, 0)
    starts.add(log_start)
    for offset in sorted(starts):
        if offset < log_start or offset >= f_leo:
            continue
        fe, le = f_cache.epoch_for_offset(offset), l_cache.epoch_for_offset(offset)
        if fe != le:
            return (
                f"offset {offset} is in epoch {fe} on the follower, {le} on the leader (follower LEO {f_leo})"
            )
    return None
