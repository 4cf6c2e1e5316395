"""Consumer groups on real processes (issue 19): members come and go under a steady producer,
one is killed, one is paused past its session and resumed, one closes cleanly; the history
checker (group_history.py) then proves nothing was lost, duplicates came only from dead
members' uncommitted windows, no partition had two live owners, and partitions moved on
within their bounds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from clients import Admin, Consumer, Producer
from clients.common.errors import FencedMemberEpoch, NonEmptyGroup, UnknownMemberId
from clients.tools.cli import cli
from clients.types import NewTopic, RecordMetadata, TopicPartition
from services.common import limits
from tests.integration.conftest import TestCluster
from tests.integration.group_history import Member, check, read_history
from tests.integration.test_metrics import metric

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "orders"
GROUP = "billing"
PARTITIONS = 12
SESSION_MS = 3_000
PRODUCE_INTERVAL_S = 0.004  # ~250 records/s
STEP_TIMEOUT_S = 30.0
# Records each live member reads between two faults (~1 s of the producer's rate over 12
# partitions shared by three members).
STEADY_RECORDS = 20


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = STEP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


class SteadyProducer:
    """Writes "v<n>" at a steady rate from a thread; keeps what was acknowledged."""

    def __init__(self, bootstrap: str) -> None:
        self.acked: dict[tuple[str, int], dict[int, str]] = defaultdict(dict)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._producer = Producer(bootstrap=bootstrap, acks="all")
        self._thread = threading.Thread(target=self._run, name="steady-producer", daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            value = f"v{n}"
            self._producer.send(
                TOPIC, value=value.encode(), key=str(n).encode(), callback=self._delivered(value)
            )
            n += 1
            time.sleep(PRODUCE_INTERVAL_S)

    def _delivered(self, value: str) -> Callable[[RecordMetadata | None, Exception | None], None]:
        def done(metadata: RecordMetadata | None, error: Exception | None) -> None:
            if error is None and metadata is not None:
                with self._lock:
                    self.acked[(metadata.topic, metadata.partition)][metadata.offset] = value

        return done

    def count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self.acked.values())

    def __enter__(self) -> SteadyProducer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=STEP_TIMEOUT_S)
        self._producer.flush(timeout_ms=int(STEP_TIMEOUT_S * 1000))
        self._producer.close()

    def __exit__(self, *exc: object) -> None:
        if not self._stop.is_set():
            self.stop()


class MemberProcess:
    def __init__(self, name: str, bootstrap: str, directory: Path) -> None:
        self.name = name
        self.history = directory / f"{name}.jsonl"
        self.member = Member(name)
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.group_member_process",
                bootstrap,
                TOPIC,
                GROUP,
                str(self.history),
                str(SESSION_MS),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=open(directory / f"{name}.log", "w"),  # noqa: SIM115 - closed with the process
        )

    def events(self) -> list[dict[str, object]]:
        return read_history(self.history) if self.history.exists() else []

    def owned(self) -> set[tuple[str, int]]:
        owned: set[tuple[str, int]] = set()
        for ev in self.events():
            tps = {(str(t[0]), int(t[1])) for t in ev.get("tps", [])}  # type: ignore[attr-defined]
            if ev["ev"] == "assigned":
                owned |= tps
            elif ev["ev"] in ("revoked", "lost"):
                owned -= tps
        return owned

    def signal(self, sig: signal.Signals) -> int:
        now = int(time.time() * 1000)
        os.kill(self.process.pid, sig)
        return now

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=STEP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STEP_TIMEOUT_S)


@pytest.fixture
def members(tmp_path: Path) -> Iterator[list[MemberProcess]]:
    started: list[MemberProcess] = []
    try:
        yield started
    finally:
        for m in started:
            m.stop()


def records_processed(m: MemberProcess) -> int:
    return sum(1 for e in m.events() if e["ev"] == "record")


def wait_steady(live: list[MemberProcess], what: str) -> None:
    """Wait until every live member has processed STEADY_RECORDS more records: the group is
    reading under the producer before the next fault."""
    start = {m.name: records_processed(m) for m in live}
    wait_for(
        lambda: all(records_processed(m) >= start[m.name] + STEADY_RECORDS for m in live),
        f"{what} to process {STEADY_RECORDS} more records each",
    )


def all_owned_by(live: list[MemberProcess]) -> bool:
    owned = [m.owned() for m in live]
    union = set().union(*owned)
    return len(union) == PARTITIONS and sum(len(o) for o in owned) == PARTITIONS


def test_members_come_and_go_and_nothing_is_lost_or_owned_twice(
    make_cluster: Callable[..., TestCluster], members: list[MemberProcess], tmp_path: Path
) -> None:
    cluster = make_cluster(brokers=3)
    bootstrap = cluster.gateway_address
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})])

    def start(name: str) -> MemberProcess:
        m = MemberProcess(name, bootstrap, tmp_path)
        members.append(m)
        return m

    with SteadyProducer(bootstrap) as producer:
        wait_for(lambda: producer.count() > 100, "the producer's first acknowledgements")
        m1 = start("m1")
        wait_for(lambda: all_owned_by([m1]), "m1 to own every partition")
        m2, m3 = start("m2"), start("m3")
        wait_for(
            lambda: all_owned_by([m1, m2, m3]) and min(len(m.owned()) for m in (m1, m2, m3)) == 4,
            "12 partitions spread 4/4/4 over m1, m2, m3",
        )

        # A crash: SIGKILL.
        wait_steady([m1, m2, m3], "m1, m2 and m3")
        m2.member.died_ms = m2.signal(signal.SIGKILL)
        m2.process.wait(timeout=STEP_TIMEOUT_S)
        wait_for(lambda: all_owned_by([m1, m3]), "m1 and m3 to own m2's partitions")
        m4 = start("m4")
        wait_for(lambda: all_owned_by([m1, m3, m4]) and len(m4.owned()) == 4, "m4 to get its share")

        # A zombie: SIGSTOP past the session timeout, then SIGCONT.
        wait_steady([m1, m3, m4], "m1, m3 and m4")
        m3.member.died_ms = m3.signal(signal.SIGSTOP)
        m3.member.paused = True
        wait_for(lambda: all_owned_by([m1, m4]), "m1 and m4 to own the paused m3's partitions")
        wait_steady([m1, m4], "m1 and m4 (m3 still paused)")
        m3.member.resumed_ms = m3.signal(signal.SIGCONT)
        wait_for(
            lambda: any(e["ev"] == "lost" for e in m3.events() if int(e["t"]) >= m3.member.resumed_ms),  # type: ignore[arg-type]
            "the resumed m3 to learn it was fenced",
        )
        wait_for(
            lambda: all_owned_by([m1, m3, m4]) and len(m3.owned()) == 4, "m3 to rejoin and get its share"
        )

        # A clean leave: SIGTERM closes the consumer (commit, leave).
        wait_steady([m1, m3, m4], "m1, m3 and m4")
        m1.member.close_started_ms = m1.signal(signal.SIGTERM)
        m1.process.wait(timeout=STEP_TIMEOUT_S)
        wait_for(lambda: all_owned_by([m3, m4]), "m3 and m4 to own m1's partitions")
        wait_steady([m3, m4], "m3 and m4")
        producer.stop()

    def processed() -> set[tuple[tuple[str, int], int]]:
        seen = set()
        for m in members:
            for e in m.events():
                if e["ev"] == "record":
                    seen.add(((str(e["tp"][0]), int(e["tp"][1])), int(e["offset"])))  # type: ignore[index]
        return seen

    wanted = {(tp, o) for tp, offsets in producer.acked.items() for o in offsets}
    wait_for(lambda: wanted <= processed(), "every acknowledged record to be processed", timeout_s=60)
    for m in (m3, m4):
        m.stop()

    histories = []
    for m in members:
        m.member.events = m.events()
        histories.append(m.member)
    problems = check(dict(producer.acked), histories, session_timeout_ms=SESSION_MS)
    assert not problems, "\n".join(problems)
    refused = [e for e in m3.member.events if e["ev"] == "commit_refused"]
    assert refused, "the resumed zombie m3 never tried to commit (the test did not exercise fencing)"


def test_group_admin_and_a_zombie_commit_through_the_client(make_cluster: Callable[..., TestCluster]) -> None:
    """describe shows members and lag; reset-offsets and delete are refused while members are
    in; a consumer fenced by the coordinator gets a named error from commit()."""
    cluster = make_cluster(brokers=1)
    bootstrap = cluster.gateway_address
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic("g-admin", 4, 1)])
    with Producer(bootstrap=bootstrap) as producer:
        for i in range(40):
            producer.send("g-admin", value=b"x", key=str(i).encode())
        producer.flush()
    consumer = Consumer(
        "g-admin",
        bootstrap=bootstrap,
        group_id="ga",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_MS,
    )
    try:
        read = 0
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while read < 40 and time.monotonic() < deadline:
            read += len(consumer.poll(200))
        assert read == 40
        consumer.commit()
        with Admin(bootstrap) as admin:
            d = admin.describe_consumer_group("ga")
            assert d.state in ("Stable", "Reconciling") and len(d.members) == 1
            assert sorted(d.members[0].assignment) == [TopicPartition("g-admin", p) for p in range(4)]
            assert sum(r.lag or 0 for r in d.offsets) == 0 and len(d.offsets) == 4
            assert [g.group_id for g in admin.list_groups()] == ["ga"]
        # The gateway's group metrics: members and lag as of its sweep, rebalances it wrote.
        wait_for(
            lambda: (
                metric(cluster, "gateway-1", 'highwater_group_members{group="ga"}') == 1
                and metric(cluster, "gateway-1", 'highwater_group_lag_records{group="ga"}') == 0
            ),
            "the gateway's sweep to export the group's members and lag",
            timeout_s=limits.GROUP_SWEEP_INTERVAL_MS / 1000 * 3,
        )
        assert (metric(cluster, "gateway-1", 'highwater_group_rebalances_total{group="ga"}') or 0) >= 1
        with Admin(bootstrap) as admin:
            with pytest.raises(NonEmptyGroup):
                admin.alter_group_offsets("ga", {TopicPartition("g-admin", 0): 0})
            with pytest.raises(NonEmptyGroup):
                admin.delete_group("ga")
        # A commit with an epoch the coordinator never handed out is refused by name.
        member_epoch = consumer.member_epoch
        assert member_epoch is not None
        consumer._async._member.epoch = member_epoch + 5  # type: ignore[union-attr]
        with pytest.raises((FencedMemberEpoch, UnknownMemberId)):
            consumer.commit()
    finally:
        consumer.close()
    with Admin(bootstrap) as admin:
        wait_for(lambda: admin.describe_consumer_group("ga").members == [], "the closed consumer to leave")
        admin.alter_group_offsets("ga", {TopicPartition("g-admin", 0): 3})
        assert admin.list_group_offsets("ga")[TopicPartition("g-admin", 0)] == 3

        # The same through `highwater groups` (kafka-consumer-groups parity).
        def cli_json(*args: str) -> Any:
            result = CliRunner().invoke(cli, ["--bootstrap", bootstrap, "-o", "json", "groups", *args])
            assert result.exit_code == 0, result.output
            return json.loads(result.output)

        assert [g["group_id"] for g in cli_json("list")] == ["ga"]
        ends = admin.list_offsets({TopicPartition("g-admin", p): -1 for p in range(4)})
        earliest = cli_json("reset-offsets", "ga", "--topic", "g-admin", "--to-earliest")
        assert {(r["partition"], r["offset"]) for r in earliest} == {(p, 0) for p in range(4)}
        assert set(admin.list_group_offsets("ga").values()) == {0}
        cli_json("reset-offsets", "ga", "--topic", "g-admin:1", "--to-offset", "2")
        assert admin.list_group_offsets("ga")[TopicPartition("g-admin", 1)] == 2
        latest = cli_json(
            "reset-offsets", "ga", "--topic", "g-admin", "--to-datetime", "2999-01-01T00:00:00Z"
        )
        assert {(r["partition"], r["offset"]) for r in latest} == {
            (tp.partition, o) for tp, o in ends.items()
        }
        dry = cli_json("reset-offsets", "ga", "--topic", "g-admin", "--to-earliest", "--dry-run")
        assert {r["offset"] for r in dry} == {0} and admin.list_group_offsets("ga") == ends  # nothing written
        described = cli_json("describe", "ga")
        assert described["members"] == [] and sum(r["lag"] for r in described["offsets"]) == 0
        result = CliRunner().invoke(cli, ["--bootstrap", bootstrap, "groups", "delete", "ga"])
        assert result.exit_code == 0, result.output
        assert admin.list_groups() == []


def test_a_static_member_restarting_within_its_session_keeps_its_partitions(
    make_cluster: Callable[..., TestCluster],
) -> None:
    """group_instance_id: closing leaves "for a while" (epoch -2); a new process with the same
    instance id within the session timeout gets the same partitions, and the other member's
    partitions never move."""
    cluster = make_cluster(brokers=1)
    bootstrap = cluster.gateway_address
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic("g-static", 4, 1)])
    moves: list[tuple[str, str, list[TopicPartition]]] = []

    def consumer(name: str, instance_id: str | None) -> Consumer:
        c = Consumer(
            bootstrap=bootstrap, group_id="gs", session_timeout_ms=SESSION_MS, group_instance_id=instance_id
        )
        c.subscribe(
            ["g-static"],
            on_partitions_assigned=lambda p: moves.append((name, "assigned", p)),
            on_partitions_revoked=lambda p: moves.append((name, "revoked", p)),
            on_partitions_lost=lambda p: moves.append((name, "lost", p)),
        )
        return c

    def settle(consumers: list[Consumer], what: str) -> None:
        def spread() -> bool:
            for c in consumers:
                c.poll(50)
            sizes = [len(c.assignment()) for c in consumers]
            return sum(sizes) == 4 and min(sizes) == 2

        wait_for(spread, what)

    static: Consumer | None = consumer("static", "svc-0")
    dynamic = consumer("dynamic", None)
    restarted: Consumer | None = None
    try:
        assert static is not None
        settle([static, dynamic], "4 partitions spread 2/2")
        owned_by_static, owned_by_dynamic = set(static.assignment()), set(dynamic.assignment())
        moves.clear()
        static.close()
        static = None
        restarted = consumer("restarted", "svc-0")
        settle([restarted, dynamic], "the restarted static member to get its partitions back")
        assert set(restarted.assignment()) == owned_by_static
        assert set(dynamic.assignment()) == owned_by_dynamic
        assert [m for m in moves if m[0] == "dynamic"] == [], f"the other member's partitions moved: {moves}"
        with Admin(bootstrap) as admin:
            instances = {m.instance_id for m in admin.describe_consumer_group("gs").members}
        assert instances == {"svc-0", None}
    finally:
        for c in (static, dynamic, restarted):
            if c is not None:
                c.close()
