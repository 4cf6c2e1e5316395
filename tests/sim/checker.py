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

from clients.records import decode_batches
from coordinator.store import WatchEvent
from services.broker.partition import Partition, Role
from services.common.record_batch import iter_batch_headers
from services.controller.context import LeaderAndIsr, TopicInfo
from tests.sim.clock import EventLoop, Node
from tests.sim.sim_etcd import SimEtcd

if TYPE_CHECKING:
    from tests.sim.sim_broker import AppendRecord, SimBroker
    from tests.sim.sim_controller import SimController
    from tests.sim.workload import Consumer, Producer

TopicPartitionKey = tuple[str, int]

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
        # (tp, leader epoch) -> (broker, incarnation) that became its leader first
        self.leader_of_epoch: dict[tuple[TopicPartitionKey, int], tuple[int, int]] = {}
        # (broker, tp) -> (incarnation, role, leader_epoch, hw) at the last step of that broker
        self._last_replica: dict[tuple[int, TopicPartitionKey], tuple[int, Role, int, int]] = {}
        self.history: dict[TopicPartitionKey, _PartitionHistory] = {}
        self.produced: set[bytes] = set()
        # Values of idempotent producers: each may be in a log once at most (rule 8).
        self.idempotent_values: set[bytes] = set()
        self.acks_all_total = 0
        self.acks_one_total = 0
        self.records_consumed = 0
        self.truncations_checked = 0
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
                self.fail("HW above LEO: %s-%d on broker %d has HW %d, LEO %d", *tp, broker_id, hw,
                          p.log.log_end_offset)
            if p.role is Role.LEADER:
                committed = self.states.get(tp)
                if (committed is not None and committed.leader == broker_id
                        and committed.leader_epoch == p.leader_epoch):
                    # Members the controller counts in sync but the leader's HW ignores, that the HW
                    # has already passed: elect one of them and committed records are gone.
                    behind = sorted(r for r in set(committed.isr) - set(p.isr) - set(p.pending_isr or ())
                                    if r in p.followers and hw > p.followers[r].log_end_offset)
                    if behind:
                        self.fail("leader %d of %s-%d moved its HW to %d counting ISR %s (pending %s), but the "
                                  "committed ISR is %s (leader epoch %d, partition epoch %d): the HW no longer "
                                  "waits for %s, at LEO %s", broker_id, *tp, hw, list(p.isr), p.pending_isr,
                                  list(committed.isr), committed.leader_epoch, committed.partition_epoch, behind,
                                  [p.followers[r].log_end_offset for r in behind])
            key = (broker_id, tp)
            last = last_seen.get(key)
            if last is not None and last[0] == incarnation:
                _, last_role, last_epoch, last_hw = last
                if p.leader_epoch < last_epoch:
                    self.fail("leader epoch of %s-%d went back on broker %d: %d -> %d", *tp, broker_id,
                              last_epoch, p.leader_epoch)
                if p.role is Role.LEADER and last_role is Role.LEADER and hw < last_hw:
                    self.fail("leader HW went back: %s-%d on broker %d from %d to %d (epoch %d -> %d)", *tp,
                              broker_id, last_hw, hw, last_epoch, p.leader_epoch)
                if last_role is p.role and last_epoch == p.leader_epoch and last_hw == hw:
                    continue
            last_seen[key] = (incarnation, p.role, p.leader_epoch, hw)

    # ---- etcd: controller epochs, partition states ---------------------------------------

    def _on_etcd_revision(self, events: list[WatchEvent]) -> None:
        elected: dict[str, int] | None = None
        touched: set[TopicPartitionKey] = set()
        for e in events:
            if e.kind != "put":
                continue
            if e.key == self.keys.controller_epoch:
                epoch = int(e.value)
                if epoch <= self.controller_epoch:
                    self.fail("/controller_epoch went from %d to %d", self.controller_epoch, epoch)
                self.controller_epoch = epoch
            elif e.key == self.keys.controller:
                elected = json.loads(e.value)
            else:
                kind = self.keys.classify_topic_key(e.key)
                if kind is not None and kind[0] == "partition_state":
                    tp = (kind[1], kind[2])  # type: ignore[misc]
                    self._on_state_write(tp, LeaderAndIsr.from_json(e.value, e.version))
                    touched.add(tp)
                elif kind is not None and kind[0] == "topic":
                    assignment = TopicInfo.from_json(kind[1], e.value).assignment
                    self.assignments.update({(kind[1], p): tuple(r) for p, r in assignment.items()})
                    touched.update((kind[1], p) for p in assignment)
        for tp in sorted(touched):
            # Checked once the whole transaction is in: a reassignment writes both keys at once.
            state, replicas = self.states.get(tp), self.assignments.get(tp)
            if state is None or replicas is None:
                continue
            if (state.leader >= 0 and state.leader not in replicas) or not set(state.isr) <= set(replicas):
                self.fail("%s-%d: leader %d / ISR %s outside its replicas %s (leader epoch %d)", *tp, state.leader,
                          list(state.isr), list(replicas), state.leader_epoch)
        if elected is not None:
            epoch, controller_id = int(elected["epoch"]), int(elected["controller_id"])
            if epoch != self.controller_epoch:
                self.fail("controller %d registered with epoch %d but /controller_epoch is %d", controller_id, epoch,
                          self.controller_epoch)
            holder = self.controller_by_epoch.setdefault(epoch, controller_id)
            if holder != controller_id:
                self.fail("two controllers for epoch %d: %d and %d", epoch, holder, controller_id)

    def _on_state_write(self, tp: TopicPartitionKey, state: LeaderAndIsr) -> None:
        if state.controller_epoch != self.controller_epoch:
            self.fail("controller epoch fence broken: the state of %s-%d (leader %d, leader epoch %d, ISR %s) "
                      "was committed by controller epoch %d while /controller_epoch is %d", *tp, state.leader,
                      state.leader_epoch, list(state.isr), state.controller_epoch, self.controller_epoch)
        old = self.states.get(tp)
        h = self._history(tp)
        if old is None:
            h.intact = set(state.isr)
        else:
            if state.leader_epoch < old.leader_epoch:
                self.fail("leader epoch of %s-%d went back in etcd: %d -> %d", *tp, old.leader_epoch,
                          state.leader_epoch)
            if state.leader_epoch > old.leader_epoch and state.leader >= 0 and state.leader not in old.isr:
                self.fail("unclean election: %s-%d leader %d at epoch %d is not in the previous ISR %s", *tp,
                          state.leader, state.leader_epoch, list(old.isr))
            if state.leader_epoch == old.leader_epoch and old.leader in h.intact:
                # An ISR expansion by the leader: the new member caught up with an intact leader.
                h.intact.update(r for r in state.isr if r not in old.isr)
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
        self.loop.trace("check", "%s-%d compromised: ISR %s all lost unflushed data; history excused",
                        (*tp, list(state.isr)))
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
                self.fail("controllers %d and %d both active at epoch %d", other.controller_id,
                          controller.controller_id, epoch)

    # ---- brokers ---------------------------------------------------------------------------

    def on_become_leader(self, broker: SimBroker, p: Partition) -> None:
        tp = (p.topic, p.partition)
        holder, incarnation = self.leader_of_epoch.setdefault((tp, p.leader_epoch),
                                                              (broker.broker_id, broker.incarnation))
        if holder != broker.broker_id:
            self.fail("two leaders of %s-%d in leader epoch %d: brokers %d and %d", *tp, p.leader_epoch, holder,
                      broker.broker_id)
        if incarnation != broker.incarnation:
            # The same epoch led by a new process: whatever the old one wrote in that epoch and
            # the new one does not have, the new one may now write differently, so the epoch no
            # longer names one history (fine after kill -9, harmful after a power loss).
            self.suspect_leaders.append(
                f"{tp[0]}-{tp[1]} epoch {p.leader_epoch}: broker {broker.broker_id} leads the same epoch again "
                f"after a restart (LEO {p.log.log_end_offset}) ({self.loop.now_ms} ms)")
        h = self._history(tp)
        state = self.states.get(tp)
        intact_members = h.intact & set(state.isr) if state is not None else set()
        if broker.broker_id not in h.intact and intact_members:
            # Not against rules 2 or 5 as written, but this replica lost unflushed data since it
            # was last known to hold every committed record, while members that kept them exist.
            self.suspect_leaders.append(
                f"{tp[0]}-{tp[1]} epoch {p.leader_epoch}: broker {broker.broker_id} leads after a power loss "
                f"(LEO {p.log.log_end_offset}) and a restart the controller did not act on, while ISR members "
                f"{sorted(intact_members)} kept every record ({self.loop.now_ms} ms)")

    def on_acks_all_success(self, broker: SimBroker, p: Partition, rec: AppendRecord) -> None:
        tp = rec.tp
        if len(p.isr) < p.min_insync_replicas:
            self.fail("acks=all success for %s-%d with ISR %s below min.insync.replicas %d", *tp, list(p.isr),
                      p.min_insync_replicas)
        if rec.duplicate:
            return  # written (and maybe acknowledged) before: the members of that time are unknown here
        h = self._history(tp)
        if not h.compromised_at_ms:
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
            if rp is None and r not in self.assignments.get(tp, ()):
                continue  # reassigned away and deleted since it replicated the batch
            leo = rp.log.log_end_offset if rp is not None else -1
            epoch = rp.log.leader_epoch_cache.epoch_for_offset(rec.first_offset) if rp is not None else None
            # A duplicate (an idempotent retry) was written earlier, maybe in an older epoch.
            if leo < rec.next_offset or (epoch != rec.leader_epoch and not rec.duplicate):
                self.fail("acks=all success for %s-%d [%d, %d) at leader epoch %d by broker %d, but ISR member %d "
                          "has LEO %d and epoch %s at offset %d", *tp, rec.first_offset, rec.next_offset,
                          rec.leader_epoch, broker.broker_id, r, leo, epoch, rec.first_offset)

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
                self.fail("broker %d cuts committed record %r (leader epoch %d) at offset %d of %s-%d (truncating "
                          "from LEO %d to %d, HW %d)", follower.broker_id, value, epoch, o, *tp,
                          p.log.log_end_offset, offset, p.high_watermark)

    def after_truncation(self, follower: SimBroker, tp: TopicPartitionKey, leader_id: int, leader_epoch: int) -> None:
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
            self.fail("after truncating, broker %d's log of %s-%d is not a prefix of leader %d's (epoch %d): %s",
                      follower.broker_id, *tp, leader_id, leader_epoch, mismatch)

    # ---- clients ---------------------------------------------------------------------------

    def on_produce_attempt(self, values: list[bytes], *, idempotent: bool) -> None:
        self.produced.update(values)
        if idempotent:
            self.idempotent_values.update(values)

    def on_renumbered(self, values: list[bytes]) -> None:
        """An idempotent producer bumped its epoch and resent these: a second copy is no bug."""
        self.idempotent_values.difference_update(values)

    def on_produce_ack(self, producer: Producer, tp: TopicPartitionKey, base_offset: int, values: list[bytes],
                       acks: int) -> None:
        h = self._history(tp)
        if acks != -1:
            self.acks_one_total += 1
            return  # acks=1 promises nothing beyond the leader: it may be lost, even overwritten
        self.acks_all_total += 1
        if h.compromised_at_ms:
            return
        for i, value in enumerate(values):
            offset = base_offset + i
            prior = h.committed.get(offset)
            if prior is not None and prior != value:
                self.fail("two records at offset %d of %s-%d: %r was committed, now %r is acknowledged (acks=all)",
                          offset, *tp, prior, value)
            h.committed[offset] = value
            h.acked_all[offset] = value

    def on_consume(self, consumer: Consumer, tp: TopicPartitionKey, position: int, offset: int, value: bytes,
                   epoch: int, high_watermark: int) -> None:
        h = self._history(tp)
        self.records_consumed += 1
        if offset >= high_watermark:
            self.fail("consumer %s read offset %d of %s-%d at or above the HW %d", consumer.name, offset, *tp,
                      high_watermark)
        if h.compromised_at_ms:
            return
        if offset != position:
            self.fail("consumer %s expected offset %d of %s-%d next but got %d: offsets skipped", consumer.name,
                      position, *tp, offset)
        if value not in self.produced:
            self.fail("consumer %s read %r at offset %d of %s-%d, which no producer sent", consumer.name, value,
                      offset, *tp)
        prior = h.committed.get(offset)
        if prior is not None and prior != value:
            self.fail("committed record changed: offset %d of %s-%d held %r, consumer %s now reads %r", offset, *tp,
                      prior, consumer.name, value)
        h.committed[offset] = value
        h.committed_epoch[offset] = epoch
        if value in self.idempotent_values:
            first = h.idempotent_offsets.setdefault(value, offset)
            if first != offset:
                self.fail("idempotent producer's %r written twice in %s-%d: offsets %d and %d", value, *tp, first,
                          offset)

    # ---- the end ---------------------------------------------------------------------------

    def final_check(self) -> None:
        """After the settle phase: every acknowledged record where it must be, consumers complete."""
        for tp, state in sorted(self.states.items()):
            h = self._history(tp)
            if h.compromised_at_ms:
                continue
            if state.leader < 0:
                self.fail("%s-%d has no leader after the settle phase (ISR %s)", *tp, list(state.isr))
            leader = self.brokers[state.leader]
            lp = leader.partitions.get(tp)
            if not leader.up or lp is None or lp.role is not Role.LEADER or lp.leader_epoch != state.leader_epoch:
                self.fail("%s-%d: broker %d does not lead epoch %d after the settle phase (%s)", *tp, state.leader,
                          state.leader_epoch, leader.describe())
            leader_log = {o: value for o, (value, _) in read_log(lp).items()}
            seen_at: dict[bytes, int] = {}
            for offset, value in sorted(leader_log.items()):
                if value in self.idempotent_values and seen_at.setdefault(value, offset) != offset:
                    self.fail("idempotent producer's %r written twice in %s-%d: offsets %d and %d on leader %d",
                              value, *tp, seen_at[value], offset, state.leader)
            for offset, value in sorted(h.acked_all.items()):
                got = leader_log.get(offset)
                if got != value:
                    self.fail("acknowledged record lost: %s-%d offset %d should hold %r, leader %d has %r", *tp,
                              offset, value, state.leader, got)
            for r in state.isr:
                if r == state.leader:
                    continue
                member = self.brokers[r]
                rp = member.partitions.get(tp)
                if not member.up or rp is None:
                    self.fail("%s-%d: ISR member %d holds no replica after the settle phase", *tp, r)
                replica_log = {o: value for o, (value, _) in read_log(rp).items()}
                for offset, value in sorted(h.acked_all.items()):
                    if replica_log.get(offset) != value:
                        self.fail("acknowledged record missing on ISR member %d: %s-%d offset %d should hold %r, "
                                  "it has %r", r, *tp, offset, value, replica_log.get(offset))
                for offset in range(rp.log.log_start_offset, min(lp.high_watermark, rp.log.log_end_offset)):
                    if replica_log.get(offset) != leader_log.get(offset):
                        self.fail("ISR member %d diverges from leader %d on %s-%d at offset %d below the HW: "
                                  "%r vs %r", r, state.leader, *tp, offset, replica_log.get(offset),
                                  leader_log.get(offset))
            for consumer in self.consumers:
                seen = consumer.seen.get(tp, {})
                position = consumer.positions.get(tp, 0)
                for offset, value in sorted(h.acked_all.items()):
                    if offset < position and seen.get(offset) != value:
                        self.fail("consumer %s passed offset %d of %s-%d without reading the acknowledged %r "
                                  "(it read %r)", consumer.name, offset, *tp, value, seen.get(offset))


def decode_records(buf: bytes) -> list[tuple[int, bytes, int]]:
    """(offset, value, leader epoch of its batch) of every record in whole batches of `buf`."""
    out = []
    view = memoryview(buf)
    for header in iter_batch_headers(buf):
        epoch = header.partition_leader_epoch
        batch = view[header.position:header.position + header.size_bytes]
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
    """Where the follower's log stops being a prefix of the leader's, judged by leader epochs; None if it is."""
    f_leo = follower.log.log_end_offset
    l_leo = leader.log.log_end_offset
    if f_leo > l_leo:
        return f"follower LEO {f_leo} is beyond leader LEO {l_leo}"
    f_cache = follower.log.leader_epoch_cache
    l_cache = leader.log.leader_epoch_cache
    starts = {start for _, start in f_cache.entries() if start < f_leo}
    starts |= {start for _, start in l_cache.entries() if start < f_leo}
    starts.add(max(follower.log.log_start_offset, 0))
    for offset in sorted(starts):
        if offset < follower.log.log_start_offset or offset >= f_leo:
            continue
        fe, le = f_cache.epoch_for_offset(offset), l_cache.epoch_for_offset(offset)
        if fe != le:
            return f"offset {offset} is in epoch {fe} on the follower, {le} on the leader (follower LEO {f_leo})"
    return None
