"""Network-partition chaos scenarios, run inside the hub namespace that netns.py makes.

    ip netns exec <prefix>-hub .venv/bin/python -m tests.chaos.partition_scenarios SCENARIO \\
        --prefix <prefix> --base-dir DIR

test_partition_chaos.py makes the namespaces, starts this with a bounded
timeout and asserts on the last line it prints, `CHAOS_RESULT {json}`. The
lines before say, as text, each fault injected, how long the cluster took to
react, and what the checkers found. The driver has to run in the hub because
the cluster's addresses (10.77.0.x) exist only there and in the brokers'
namespaces; the pytest process stays on loopback in the root namespace.

The cluster: etcd (10.77.0.2), one controller and the gateway (10.77.0.1) in the hub, three brokers
each in its own namespace, lease TTL 3 s, replica.lag.time.max.ms 5 s, one
topic of three partitions with replication factor 3 and min.insync.replicas
2. Two acks=all writers and a reader run through every scenario. At the end,
after every fault is healed and every ISR is full again, the history checker
(history.check) reads each partition back, and once the cluster is stopped
the replicas' segment files are compared with each other and with the
committed log (history.check_replicas, invariant 6).

Scenarios (Kafka's replication system tests with network faults):
- follower_partitioned: a broker that leads nothing is cut off from the two
  leaders (it still reaches etcd and the controller): it must leave every ISR
  while writes go on with the other two, and rejoin every ISR after the heal.
- leader_cut_from_followers: the leader of partition 0 is cut off from both
  followers but still reaches etcd and the controller: its partitions' ISR
  shrinks to the leader alone, and with min.insync.replicas 2 every acks=all
  write to them fails (NOT_ENOUGH_REPLICAS...), none is acknowledged; writes
  to the other partitions go on. After the heal every ISR is full again.
- leader_isolated: the leader of partition 0 is first cut off from its
  followers long enough to append records they never get (a divergent tail),
  then isolated from everything. Its lease expires, a follower is elected and
  takes writes at the same offsets. After the heal the old leader rejoins the
  ISR as a follower, and its divergent tail is gone from its own log.
- leader_cut_from_etcd: the leader of partition 0 loses etcd only; it still
  reaches the controller, the gateway and the other brokers (a zombie that
  may still believe it leads). Its lease expires and a follower is elected;
  acks=all writes sent straight to the zombie for its old partitions must not
  be acknowledged. After the heal it registers again as a new incarnation,
  rejoins every ISR, and whatever it appended as a zombie is gone from its log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from protos.highwater.v1 import broker_pb2_grpc, common_pb2
from services.launcher.local_cluster import Placement
from tests.chaos import workload
from tests.chaos.history import ACKNOWLEDGED, RPC_FAILED, History, check, check_replicas
from tests.chaos.netns import ETCD_ADDRESS, HUB_ADDRESS, Topology, broker_address
from tests.integration.conftest import TestCluster
from tests.integration.helpers import gateway_stub, produce, wait_for

TOPIC = "partitioned"
PARTITIONS = 3
BROKERS = 3
LEASE_TTL_S = 3
# Short, so a follower cut off leaves the ISR within seconds (Kafka's default is 30 s, ours 10 s).
REPLICA_LAG_TIME_MAX_MS = 5_000
# Lag time, the leader's ISR check interval (1 s), the AlterPartition round trip, and slack for 2 busy cores.
ISR_CHANGE_TIMEOUT_S = 30.0
# Lease expiry (3 s) plus the controller's election and LeaderAndIsr, with the same slack.
ELECTION_TIMEOUT_S = 30.0
# How long writes may take to show progress (a number of acknowledgements) after a change.
PROGRESS_TIMEOUT_S = 30.0
ACKS_BEFORE_FAULTS = 30
ACKS_PER_PARTITION_AFTER_CHANGE = 5
# Failures of acks=all writes the cut-off leader must answer before the heal (scenario b).
NOT_ENOUGH_REPLICAS_ANSWERS = 5
# Scenario c: the divergent tail must appear well before the lag time, while the followers are still
# in the ISR, or the isolated leader would take the partition offline with it.
DIVERGENCE_TIMEOUT_S = 3.0
# The scenario's own write to the cut-off leader: it times out (it cannot be committed) well within that.
PROBE_WRITE_TIMEOUT_MS = 1_000
DIVERGENCE_POLL_S = 0.05
# Scenario e: a broker that cannot register again within 10 lease TTLs (30 s here) stops
# (services/broker/server.py), so the zombie is healed before this much time has passed since it lost etcd.
ZOMBIE_HEAL_BY_S = 20.0
RESULT_PREFIX = "CHAOS_RESULT "
NOT_ENOUGH_REPLICAS_CODES = {"NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND"}


@dataclass
class Run:
    """One scenario's cluster, namespaces, history, and the facts it reports."""

    c: TestCluster
    net: Topology
    history: History
    facts: dict[str, object] = field(default_factory=dict)
    started_s: float = field(default_factory=time.monotonic)
    # Checks made once the cluster is stopped, on the replicas' logs (broker -> partition -> records).
    after_stop: list[Callable[[dict[int, dict[tuple[str, int], list[tuple[int, bytes]]]]], list[str]]] = (
        field(default_factory=list)
    )

    def say(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started_s:6.1f} s] {message}", flush=True)

    def fault(self, what: str) -> None:
        self.history.fault(what)
        self.say(f"fault: {what}")

    def state(
        self, what: str, ok: Callable[[common_pb2.PartitionState], bool], timeout_s: float
    ) -> dict[int, common_pb2.PartitionState]:
        state = workload.wait_for_state(self.c, TOPIC, PARTITIONS, what, ok, timeout_s)
        self.say(f"{what}: {workload.describe_state(state)}")
        return state

    def healthy(self, what: str) -> dict[int, common_pb2.PartitionState]:
        state = workload.wait_healthy(self.c, TOPIC, PARTITIONS, what)
        self.say(f"healthy after {what}: {workload.describe_state(state)}")
        return state

    def heal(self, fault: str, what: str, healed_s: float) -> dict[int, common_pb2.PartitionState]:
        """Heal the network (the fault), wait until healthy after what; isr_rejoin_s counts from healed_s."""
        self.net.heal()
        self.fault(fault)
        state = self.healthy(what)
        self.facts["isr_rejoin_s"] = round(time.monotonic() - healed_s, 1)
        return state

    def progress(self, tps: set[tuple[str, int]], since_s: float, what: str) -> dict[tuple[str, int], int]:
        """Wait (bounded) until each of tps has acknowledged writes sent after since_s."""

        def enough() -> dict[tuple[str, int], int] | None:
            counts = workload.acks_per_partition(self.history, tps, since_s, time.monotonic())
            return counts if min(counts.values()) >= ACKS_PER_PARTITION_AFTER_CHANGE else None

        counts = wait_for(
            enough,
            timeout_s=PROGRESS_TIMEOUT_S,
            interval_s=workload.STATE_POLL_INTERVAL_S,
            what=f"{ACKS_PER_PARTITION_AFTER_CHANGE} acknowledged writes on each of {sorted(tps)} {what}",
        )
        self.say(f"writes go on {what}: {_per_partition(counts)}")
        return counts


def _per_partition(counts: dict[tuple[str, int], int]) -> str:
    return ", ".join(f"p{tp[1]}: {n}" for tp, n in sorted(counts.items()))


def all_tps() -> set[tuple[str, int]]:
    return {(TOPIC, p) for p in range(PARTITIONS)}


# ---- (a) a follower partitioned away leaves and rejoins the ISR ------------------------------------

# Broker 3 follows every partition and is nobody's preferred leader, so cutting it off from
# brokers 1 and 2 cuts a follower off from the leaders only.
FOLLOWER_ASSIGNMENT = {0: [1, 2, 3], 1: [2, 1, 3], 2: [1, 2, 3]}


def follower_partitioned(run: Run) -> None:
    follower = 3
    state = run.healthy("start-up")
    if any(s.leader == follower for s in state.values()):
        raise AssertionError(
            f"broker {follower} leads a partition, so it is not only a follower: "
            f"{workload.describe_state(state)}"
        )
    cut_s = run.net.cut_off(follower, [1, 2])
    run.fault(
        f"cut follower broker {follower} off from brokers 1 and 2 (the leaders); it still reaches the hub"
    )
    run.state(
        f"broker {follower} out of every ISR",
        lambda p: follower not in p.isr and len(p.isr) == 2,
        ISR_CHANGE_TIMEOUT_S,
    )
    shrunk_s = time.monotonic()
    run.facts["isr_shrink_s"] = round(shrunk_s - cut_s, 1)
    counts = run.progress(all_tps(), shrunk_s, f"with broker {follower} out of the ISR")
    run.facts["acks_per_partition_while_cut"] = min(counts.values())
    healed_s = time.monotonic()
    run.heal(
        f"heal: broker {follower} reaches brokers 1 and 2 again",
        f"broker {follower} rejoined every ISR",
        healed_s,
    )
    run.progress(all_tps(), time.monotonic(), "after the rejoin")


# ---- (b) the leader cut off from both followers, still reaching etcd and the controller ----------


def leader_cut_from_followers(run: Run) -> None:
    state = run.healthy("start-up")
    leader = state[0].leader
    followers = [b for b in state[0].replicas if b != leader]
    led = {(TOPIC, p) for p, s in state.items() if s.leader == leader}
    others = all_tps() - led
    cut_started_s = time.monotonic()
    # A write sent before the leader's own routes are in place may still reach the followers and be
    # acknowledged; one sent after cannot (the leader appends it after it can no longer send to them).
    cut_s = run.net.cut_off(leader, followers)
    run.fault(
        f"cut leader broker {leader} (leads {sorted(p for _, p in led)}) off from brokers {followers} "
        f"(its routes in place {cut_s - cut_started_s:.3f} s after the cut began); it still reaches etcd "
        "and the controller"
    )
    run.state(
        f"the ISR of broker {leader}'s partitions shrunk to [{leader}], broker {leader} out of the others'",
        lambda p: list(p.isr) == [leader] if p.leader == leader else leader not in p.isr,
        ISR_CHANGE_TIMEOUT_S,
    )
    shrunk_s = time.monotonic()
    run.facts["isr_shrink_s"] = round(shrunk_s - cut_s, 1)

    def refused() -> int:
        return sum(
            1
            for a in run.history.attempts_within(led, shrunk_s, time.monotonic())
            if a.outcome in NOT_ENOUGH_REPLICAS_CODES
        )

    wait_for(
        lambda: refused() >= NOT_ENOUGH_REPLICAS_ANSWERS,
        timeout_s=PROGRESS_TIMEOUT_S,
        what=f"{NOT_ENOUGH_REPLICAS_ANSWERS} NOT_ENOUGH_REPLICAS answers from broker {leader}",
    )
    if others:
        run.progress(others, shrunk_s, f"on the partitions broker {leader} does not lead")
    still = workload.cluster_state(run.c, TOPIC)
    if still is None or any(still[p].leader != leader for _, p in led):
        raise AssertionError(
            f"broker {leader} was expected to keep leading {sorted(led)} (it holds its lease): "
            f"{workload.describe_state(still)}"
        )
    healed_s = time.monotonic()
    outcomes = Counter(a.outcome for a in run.history.attempts_within(led, cut_s, healed_s))
    run.facts["outcomes_on_cut_leaders_partitions"] = dict(outcomes)
    run.facts["acks_on_cut_leaders_partitions"] = outcomes.get(ACKNOWLEDGED, 0)
    run.say(
        f"writes to broker {leader}'s partitions sent after the cut and answered before the heal: "
        f"{dict(outcomes)}"
    )
    acked = [
        a for a in run.history.attempts_within(led, cut_started_s, healed_s) if a.outcome == ACKNOWLEDGED
    ]
    run.say(
        "acknowledged writes to those partitions sent since the cut began (s after it began, sent-answered): "
        + ", ".join(f"{a.started_s - cut_started_s:.3f}-{a.finished_s - cut_started_s:.3f}" for a in acked)
    )
    if outcomes.get(ACKNOWLEDGED, 0):
        raise AssertionError(
            f"broker {leader} acknowledged {outcomes[ACKNOWLEDGED]} acks=all writes while cut off "
            f"from every follower (min.insync.replicas 2): {dict(outcomes)}"
        )
    run.heal(
        f"heal: broker {leader} reaches brokers {followers} again",
        "the followers rejoined every ISR",
        healed_s,
    )
    run.progress(all_tps(), time.monotonic(), "after the heal")


# ---- (c) the leader isolated from everything: lease lost, new leader, divergent tail truncated ---


def leader_isolated(run: Run) -> None:
    state = run.healthy("start-up")
    leader = state[0].leader
    followers = [b for b in state[0].replicas if b != leader]
    tp = (TOPIC, 0)
    run.net.cut_off(leader, followers)
    run.fault(f"cut leader broker {leader} of p0 off from its followers {followers}")
    # The workload's writers may all be waiting on p1 and p2 (whose ISR still holds the cut broker), so
    # one write of the scenario's own makes the divergent tail: the leader appends it and cannot commit it.
    value = b"divergent-probe"
    sent_s = time.monotonic()
    answer = produce(
        gateway_stub(run.c.gateway_address), TOPIC, 0, [value], timeout_ms=PROBE_WRITE_TIMEOUT_MS
    )
    outcome = common_pb2.ErrorCode.Name(answer.error_code)
    run.history.attempt(tp, sent_s, time.monotonic(), outcome)
    if answer.error_code == common_pb2.NONE:
        run.history.ack(tp, answer.base_offset, value)  # the checkers then judge it like any other
        raise AssertionError(
            f"broker {leader} acknowledged an acks=all write while cut off from every follower"
        )
    run.history.fail()
    run.say(f"a write to p0 sent after the cut was answered {outcome}")
    # Wait for records on the leader that no follower has: acks=all writes it appended and cannot commit.
    deadline = time.monotonic() + DIVERGENCE_TIMEOUT_S
    while True:
        ends = {b: len(workload.replica_log(run.c, b, TOPIC, 0) or []) for b in state[0].replicas}
        if ends[leader] > max(ends[f] for f in followers):
            break
        if time.monotonic() > deadline:
            raise AssertionError(
                f"no record reached only broker {leader} within {DIVERGENCE_TIMEOUT_S} s "
                f"(records per replica of p0: {ends})"
            )
        time.sleep(DIVERGENCE_POLL_S)
    run.say(f"records per replica of p0 on disk: {ends}")
    isolated_s = time.monotonic()
    run.net.isolate(leader)
    run.fault(f"isolate broker {leader} from everything (etcd, controller, gateway, brokers)")
    before = workload.cluster_state(run.c, TOPIC)
    if before is None or len(before[0].isr) < 2:
        raise AssertionError(
            f"p0's ISR had already shrunk to its leader when it was isolated; the partition would "
            f"go offline instead of electing a follower: {workload.describe_state(before)}"
        )
    run.state(
        f"a new leader for every partition and broker {leader} out of every ISR",
        lambda p: p.leader > 0 and p.leader != leader and leader not in p.isr,
        ELECTION_TIMEOUT_S,
    )
    elected_s = time.monotonic()
    run.facts["election_s"] = round(elected_s - isolated_s, 1)
    run.progress(all_tps(), elected_s, f"with broker {leader} isolated")
    # The isolated broker cannot be reached, so its log does not change until the heal.
    stale = workload.replica_log(run.c, leader, TOPIC, 0) or []
    healed_s = time.monotonic()
    final = run.heal(
        f"heal: broker {leader} reaches everyone again", f"broker {leader} rejoined every ISR", healed_s
    )
    if final[0].leader == leader:
        raise AssertionError(f"broker {leader} leads p0 again right after rejoining; expected a follower")
    run.progress(all_tps(), time.monotonic(), "after the heal")
    run.after_stop.append(
        lambda replicas: tail_truncated(
            run, leader, final[0].leader, stale, replicas, require_divergence=True
        )
    )


def tail_truncated(
    run: Run,
    old_leader: int,
    new_leader: int,
    stale: list[tuple[int, bytes]],
    replicas: dict[int, dict[tuple[str, int], list[tuple[int, bytes]]]],
    *,
    require_divergence: bool,
) -> list[str]:
    """Problems if old_leader still holds records of p0 that it had (stale) and the new leader does not."""
    tp = (TOPIC, 0)
    reference = dict(replicas[new_leader].get(tp, []))
    divergent = [(o, v) for o, v in stale if reference.get(o) != v]
    now = dict(replicas[old_leader].get(tp, []))
    kept = [(o, v) for o, v in divergent if now.get(o) == v]
    run.facts["divergent_tail_records"] = len(divergent)
    run.facts["divergent_records_kept"] = len(kept)
    span = f"offsets {divergent[0][0]}..{divergent[-1][0]}" if divergent else "none"
    run.say(
        f"broker {old_leader}'s p0 held {len(divergent)} records broker {new_leader} does not ({span}) "
        f"before the heal; {len(kept)} of them still in its log after it rejoined"
    )
    problems = []
    if require_divergence and not divergent:
        problems.append(f"broker {old_leader} had no divergent tail to truncate (the scenario made none)")
    if kept:
        problems.append(
            f"broker {old_leader} kept {len(kept)} records of its divergent tail; first: offset "
            f"{kept[0][0]} {kept[0][1]!r}, broker {new_leader} has {reference.get(kept[0][0])!r}"
        )
    return problems


# ---- (e) the leader loses etcd only: a zombie that must not acknowledge ------------------------


def leader_cut_from_etcd(run: Run) -> None:
    state = run.healthy("start-up")
    leader = state[0].leader
    led = sorted(p for p, s in state.items() if s.leader == leader)
    cut_s = time.monotonic()
    run.net.cut_from_etcd(leader)
    run.fault(
        f"cut leader broker {leader} (leads {led}) off from etcd only; it still reaches the controller, "
        "the gateway and the other brokers"
    )
    run.state(
        f"a new leader for every partition and broker {leader} out of every ISR",
        lambda p: p.leader > 0 and p.leader != leader and leader not in p.isr,
        ELECTION_TIMEOUT_S,
    )
    elected_s = time.monotonic()
    run.facts["election_s"] = round(elected_s - cut_s, 1)
    # Straight to the zombie, not through the gateway (which already routes to the new leaders).
    answers = {}
    with grpc.insecure_channel(run.c.processes[f"broker-{leader}"].address) as channel:
        zombie = broker_pb2_grpc.BrokerServiceStub(channel)
        for p in led:
            value = f"zombie-probe-{p}".encode()
            sent_s = time.monotonic()
            try:
                answer = produce(zombie, TOPIC, p, [value], timeout_ms=PROBE_WRITE_TIMEOUT_MS)
            except grpc.RpcError as exc:
                answers[p] = exc.code().name
                run.history.attempt((TOPIC, p), sent_s, time.monotonic(), RPC_FAILED)
                run.history.fail()
                continue
            answers[p] = common_pb2.ErrorCode.Name(answer.error_code)
            run.history.attempt((TOPIC, p), sent_s, time.monotonic(), answers[p])
            if answer.error_code == common_pb2.NONE:
                run.history.ack((TOPIC, p), answer.base_offset, value)  # the checkers judge it like any other
            else:
                run.history.fail()
    run.facts["zombie_answers"] = answers
    run.say(
        f"acks=all writes sent straight to broker {leader} for its old partitions were answered {answers}"
    )
    if any(a == "NONE" for a in answers.values()):
        raise AssertionError(
            f"broker {leader} acknowledged acks=all writes after losing its lease and its "
            f"leadership: {answers}"
        )
    # The new leaders take writes; bounded so the zombie is healed before it gives up registering.
    # Not a failure when the time runs out: progress is required after the heal in any case.
    since = time.monotonic()
    deadline = cut_s + ZOMBIE_HEAL_BY_S
    counts = workload.acks_per_partition(run.history, all_tps(), since, time.monotonic())
    while time.monotonic() < deadline and min(counts.values()) < ACKS_PER_PARTITION_AFTER_CHANGE:
        time.sleep(workload.STATE_POLL_INTERVAL_S)
        counts = workload.acks_per_partition(run.history, all_tps(), since, time.monotonic())
    run.facts["acks_per_partition_while_zombie"] = min(counts.values())
    run.say(f"writes acknowledged while broker {leader} was cut off from etcd: {_per_partition(counts)}")
    stale = workload.replica_log(run.c, leader, TOPIC, 0) or []
    healed_s = time.monotonic()
    final = run.heal(
        f"heal: broker {leader} reaches etcd again",
        f"broker {leader} registered again and rejoined every ISR",
        healed_s,
    )
    run.progress(all_tps(), time.monotonic(), "after the heal")
    run.after_stop.append(
        lambda replicas: tail_truncated(
            run, leader, final[0].leader, stale, replicas, require_divergence=False
        )
    )


SCENARIOS: dict[str, tuple[Callable[[Run], None], dict[int, list[int]] | None]] = {
    "follower_partitioned": (follower_partitioned, FOLLOWER_ASSIGNMENT),
    "leader_cut_from_followers": (leader_cut_from_followers, None),
    "leader_isolated": (leader_isolated, None),
    "leader_cut_from_etcd": (leader_cut_from_etcd, None),
}


def create_topic(c: TestCluster, assignment: dict[int, list[int]] | None) -> None:
    topic = common_pb2.CreatableTopic(
        name=TOPIC,
        num_partitions=PARTITIONS,
        replication_factor=BROKERS,
        configs={"min.insync.replicas": "2"},
    )
    if assignment is not None:
        topic.num_partitions = topic.replication_factor = -1
        for p, replicas in assignment.items():
            topic.assignments[p].replicas.extend(replicas)
    resp = gateway_stub(c.gateway_address).CreateTopics(
        common_pb2.CreateTopicsRequest(topics=[topic]), timeout=30
    )
    if resp.topics[0].error_code:
        raise AssertionError(f"could not create {TOPIC}: {resp.topics[0].error_message}")


def check_in_hub() -> None:
    """Fail early and clearly when started outside the hub namespace (the hub's address is not local)."""
    with socket.socket() as s:
        try:
            s.bind((HUB_ADDRESS, 0))
        except OSError as exc:
            raise SystemExit(
                f"{HUB_ADDRESS} is not an address here ({exc.strerror}): run this inside the hub "
                "namespace, ip netns exec <prefix>-hub ..."
            ) from exc


def run_scenario(name: str, net: Topology, base_dir: Path) -> dict[str, object]:
    scenario, assignment = SCENARIOS[name]
    placements = {
        f"broker-{b}": Placement(broker_address(b), net.exec_prefix(net.broker_namespace(b)))
        for b in range(1, BROKERS + 1)
    }
    placements["controller-1"] = placements["gateway-1"] = Placement(HUB_ADDRESS)
    # host: etcd's address (the one process without a placement).
    c = TestCluster(
        base_dir,
        brokers=BROKERS,
        controllers=1,
        lease_ttl_s=LEASE_TTL_S,
        replica_lag_time_max_ms=REPLICA_LAG_TIME_MAX_MS,
        host=ETCD_ADDRESS,
        placements=placements,
    )
    run = Run(c, net, History())
    result: dict[str, object] = {"scenario": name, "error": None, "problems": []}
    problems: list[str] = []
    in_sync: dict[tuple[str, int], set[int]] = {}
    try:
        c.start()
        run.say(
            f"cluster up: etcd at {ETCD_ADDRESS}, controller-1 and gateway-1 at {HUB_ADDRESS} in {net.hub}; "
            "brokers at "
            + ", ".join(f"{broker_address(b)} in {net.broker_namespace(b)}" for b in range(1, BROKERS + 1))
        )
        create_topic(c, assignment)
        workload.wait_healthy(c, TOPIC, PARTITIONS, "creating the topic")
        with workload.Workload(c, run.history, TOPIC, PARTITIONS):
            if not workload.wait_for_acks(run.history, ACKS_BEFORE_FAULTS, PROGRESS_TIMEOUT_S):
                raise AssertionError(f"fewer than {ACKS_BEFORE_FAULTS} acknowledged writes before any fault")
            scenario(run)
        final = run.healthy("the writers stopped")
        in_sync = {(TOPIC, p): set(s.isr) for p, s in final.items()}
        logs = workload.read_logs(c, TOPIC, PARTITIONS)
        problems = check(run.history, logs)
        run.say(
            f"history checker: {run.history.acked_count} acknowledged acks=all writes checked, "
            f"{run.history.failed_writes} failed writes, reader saw "
            f"{sum(len(v) for v in run.history.consumed['reader'].values())} records; "
            f"{len(problems)} problems"
        )
    except Exception as exc:  # reported in the result line; the test fails on it
        traceback.print_exc()
        result["error"] = f"{type(exc).__name__}: {exc}"
        logs = {}
    finally:
        with contextlib.suppress(Exception):
            net.heal()  # so the brokers' controlled shutdowns reach the controller
        c.stop()
    if result["error"] is None:
        replicas = workload.read_replica_logs(c, TOPIC, PARTITIONS)
        replica_problems = check_replicas(logs, replicas, in_sync)
        for after in run.after_stop:
            replica_problems += after(replicas)
        run.say(
            f"replica checker (segment files of every replica, after the stop): "
            f"{sum(len(r) for by_tp in replicas.values() for r in by_tp.values())} records on "
            f"{sum(len(by_tp) for by_tp in replicas.values())} replicas compared; "
            f"{len(replica_problems)} problems"
        )
        problems += replica_problems
    for p in problems:
        run.say(f"PROBLEM: {p}")
    outcomes = Counter(a.outcome for a in run.history.attempts)
    result.update(
        problems=problems,
        faults=run.history.faults,
        acked=run.history.acked_count,
        failed_writes=run.history.failed_writes,
        outcomes=dict(outcomes),
        reader_records=sum(len(v) for v in run.history.consumed["reader"].values()),
        facts=run.facts,
        elapsed_s=round(time.monotonic() - run.started_s, 1),
        logs=str(c.base_dir / "logs"),
    )
    run.say(
        f"{name}: {len(run.history.faults)} faults, {run.history.acked_count} acknowledged writes checked, "
        f"outcomes {dict(outcomes)}, facts {run.facts}; "
        f"{'ERROR ' + str(result['error']) if result['error'] else str(len(problems)) + ' problems'}"
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--prefix", required=True, help="the namespaces' name prefix (netns.Topology)")
    parser.add_argument("--base-dir", type=Path, required=True, help="where the cluster's data and logs go")
    args = parser.parse_args(argv)
    check_in_hub()
    result = run_scenario(args.scenario, Topology(args.prefix, BROKERS), args.base_dir)
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0 if result["error"] is None and not result["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
