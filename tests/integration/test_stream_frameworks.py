"""Stream-processing frameworks on Kafka, run on Highwater's Kafka listeners (issue 39).

quixstreams and faust-streaming keep their state in compacted changelog topics they create
themselves. For each, a stateful application with default settings (stream_framework_apps.py: a
running sum per key, at-least-once) runs as a process over known input: events A are processed and
committed, events B are being processed when the process is SIGKILLed, its local state directory is
deleted, the broker's log cleaner removes superseded states from the changelog (the test gives the
changelog small segments so that it does), events C are produced, and the restarted process
restores its state from the cleaned changelog, holes and all, and finishes. (faust is killed once B
is committed and C is produced once it runs again: a faust race, described at FRAMEWORKS, loses or
reorders input waiting at its restart.) Checked: the framework
created its changelog with cleanup.policy=compact; the changelog's latest state per key is exactly
the expected final sum; every output record's sum is the sum of its key's first `seq` amounts (a
state restored wrong or incomplete would break it for the next event of that key); the latest
output per key is the key's final sum; every event was processed.

Most of each test's minute and a half is Kafka's group protocol doing its job: the restarted
application joins its group only once the coordinator has expired the SIGKILLed member's session
(librdkafka's default session.timeout.ms is 45 s, faust's 60 s).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CALL_TIMEOUT_S = 30.0  # one Kafka call (generous: a shared 2-core machine)
PROCESS_TIMEOUT_S = 120.0  # an application's start-up plus processing one phase of input
STOP_TIMEOUT_S = 15.0  # a SIGTERMed application's clean exit before it is SIGKILLed
KEYS = 20
EVENTS_PER_PHASE = 600  # phases A, B and C: 1,800 events in all, 90 per key

CHUNKS_A = 4  # phase A's chunks, each committed before the next: see the test
CLEAN_TIMEOUT_S = 90.0  # the cleaner's first pass over the changelog (it backs off 15 s when idle)
CLEANABLE = {"segment.bytes": "1024", "min.cleanable.dirty.ratio": "0.01"}

Record = tuple[int, int, bytes | None]  # partition, offset, value


@dataclass(frozen=True)
class Framework:
    name: str
    # A faust table's changelog partition is the partition of the event that updated it, so the
    # input has as many partitions as the table (faust's default topic_partitions, 8).
    input_partitions: int
    is_changelog: Callable[[str], bool]
    # Whether the test may leave input behind the committed offsets when it kills the
    # application and restarts it on it: see "faust's seek race" below.
    replays_uncommitted: bool
    # Where it may not: what the application logs once it has restored its state and runs.
    ready_line: str


# faust's seek race. faust 0.15.3 resumes its input partitions before its seek to the committed
# offsets has finished (tables/recovery.py `_resume_streams`: resume_partitions, then perform_seek). Input
# already waiting past the committed offsets when it restarts is then fetched and processed in
# that window, and again after the seek: its ack bookkeeping gets an offset twice or a gap, so
# its commits crawl or stop (faust-streaming/faust#596, open), and a prefetched later event can
# reach the agent before an earlier one of the same key, so a running sum skips an event
# (faust-streaming/faust#221). Both were seen here (each in about one restart in three on a
# loaded machine). They are faust's own: its OffsetCommits are answered NONE and every record
# is served in order. So for faust the test crashes the application once B is processed and
# committed, and produces C once it runs again: the restore from the cleaned changelog, which
# is what this test is about, is the same, and faust never restarts onto waiting input.

FRAMEWORKS = [
    Framework("quix", 3, lambda topic: topic.startswith("changelog__"), True, ""),
    Framework("faust", 8, lambda topic: topic.endswith("-changelog"), False, "[^Worker]: Ready"),
]


def event(i: int, seq_of: dict[str, int]) -> dict[str, Any]:
    """Event i: key k<i mod KEYS>, that key's next sequence number, an amount from 1 to 97."""
    key = f"k{i % KEYS:02d}"
    seq_of[key] = seq_of.get(key, 0) + 1
    return {"key": key, "seq": seq_of[key], "amount": (i * 7919) % 97 + 1, "i": i}


def prefix_sums(events: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Per key, the sum of its first n amounts at index n."""
    sums: dict[str, list[int]] = {}
    for e in events:
        running = sums.setdefault(e["key"], [0])
        running.append(running[-1] + e["amount"])
    return sums


@dataclass
class App:
    """One application process, stopped by pid however the test ends."""

    framework: str
    args: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.stream_framework_apps", self.framework, *self.args],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=STOP_TIMEOUT_S)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=STOP_TIMEOUT_S)

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(
                f"{self.framework} application exited with {self.proc.returncode}; "
                f"its log ({self.log_path}) ends with:\n{self.log_tail()}"
            )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


def consume(consumer: confluent_kafka.Consumer, seconds: float) -> tuple[list[Record], set[int]]:
    """What one consume() call gives: its records, and the partitions it found at their end."""
    records: list[Record] = []
    at_end: set[int] = set()
    for msg in consumer.consume(num_messages=1000, timeout=seconds):
        partition, offset, error = msg.partition(), msg.offset(), msg.error()
        assert partition is not None, msg
        if error is not None:
            if error.code() != confluent_kafka.KafkaError._PARTITION_EOF:
                raise AssertionError(f"reading {msg.topic()}: {error}")
            at_end.add(partition)
            continue
        assert offset is not None, msg
        records.append((partition, offset, msg.value()))
    return records, at_end


class Output:
    """The output topic read from its start, every partition, as records arrive."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"{topic}-reader",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        self.consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
        self.records: list[tuple[int, int, dict[str, Any]]] = []  # (partition, offset, value)

    def processed_at_least(self, n: int) -> Callable[[], bool]:
        """Whether n distinct input events have an output record (for wait)."""
        return lambda: len({v["i"] for _, _, v in self.records}) >= n

    def poll(self, seconds: float = 0.5) -> None:
        records, _ = consume(self.consumer, seconds)
        self.records.extend((p, offset, json.loads(value or b"null")) for p, offset, value in records)

    def wait(
        self,
        app: App,
        condition: Callable[[], bool],
        what: str,
        *,
        timeout_s: float = PROCESS_TIMEOUT_S,
        alive: bool = True,
    ) -> None:
        """Read the output until condition() holds; fail after timeout_s, or at once if the
        application (when it should be `alive`) has exited."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if alive:
                app.check_alive()
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout_s:.0f} s waiting for {what}; "
                    f"the {app.framework} application's log ends with:\n{app.log_tail()}"
                )
            self.poll()

    def close(self) -> None:
        self.consumer.close()


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """`group`'s committed offset of each partition of `topic` (negative: none)."""
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        tps = consumer.committed(
            [confluent_kafka.TopicPartition(topic, p) for p in range(partitions)], timeout=CALL_TIMEOUT_S
        )
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in tps}


def committed_all(bootstrap: str, group: str, topic: str, partitions: int, ends: dict[int, int]) -> bool:
    """Whether `group` has committed every partition of `topic` up to `ends`."""
    offsets = committed_offsets(bootstrap, group, topic, partitions)
    return all(offsets[p] >= ends.get(p, 0) for p in range(partitions))


def broker_warnings(cluster: Any, lines: int = 30) -> str:
    """The last WARNING and ERROR lines of the cluster's broker logs (for a failure's message)."""
    found = [
        line
        for path in sorted((cluster.base_dir / "logs").glob("broker-*.log"))
        for line in path.read_text(errors="replace").splitlines()
        if " WARNING " in line or " ERROR " in line
    ]
    return "\n".join(sorted(found)[-lines:]) or "(none)"


def produce(bootstrap: str, topic: str, events: list[dict[str, Any]]) -> dict[int, int]:
    """Produce the events keyed by their key; each partition's end offset afterwards."""
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True}
    )
    ends: dict[int, int] = {}
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err:
            errors.append(err)
        else:
            ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    for e in events:
        producer.produce(topic, key=e["key"].encode(), value=json.dumps(e).encode(), on_delivery=on_delivery)
    assert producer.flush(CALL_TIMEOUT_S) == 0, "the input was not all delivered in time"
    assert not errors, errors
    return ends


@dataclass
class Changelog:
    state: dict[str, dict[str, Any]]  # the last state value per application key
    removed: int  # offsets below the high watermark with no record: what the cleaner removed


def read_changelog(bootstrap: str, topic: str) -> Changelog:
    """A changelog topic read from its log start to its high watermark, every partition."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-checker",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=CALL_TIMEOUT_S).topics[topic]
        tps = [confluent_kafka.TopicPartition(topic, p) for p in sorted(meta.partitions)]
        offsets = 0
        for tp in tps:
            low, high = consumer.get_watermark_offsets(tp, timeout=CALL_TIMEOUT_S, cached=False)
            offsets += high - low
            tp.offset = low
        consumer.assign(tps)
        state: dict[str, dict[str, Any]] = {}
        read = 0
        at_end: set[int] = set()
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while len(at_end) < len(tps):
            assert time.monotonic() < deadline, f"could not read {topic} to its end in time"
            records, ended = consume(consumer, 0.5)
            at_end |= ended
            read += len(records)
            for _, _, value in records:
                if value is not None:  # a tombstone: none expected, as no key is ever deleted
                    latest = json.loads(value)
                    state[latest["key"]] = latest
        return Changelog(state, offsets - read)
    finally:
        consumer.close()


def changelog_topic(admin: AdminClient, group: str, framework: Framework) -> str | None:
    """The changelog topic the application created, once it has."""
    topics = admin.list_topics(timeout=CALL_TIMEOUT_S).topics
    found = [t for t in topics if group in t and framework.is_changelog(t)]
    assert len(found) <= 1, found
    return found[0] if found else None


def topic_config(admin: AdminClient, topic: str, name: str) -> str:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=CALL_TIMEOUT_S)
    return str(configs[name].value)


def make_cleanable(admin: AdminClient, topic: str) -> None:
    """Small segments and any dirty ratio, so that the cleaner cleans the changelog within the
    test: with the defaults (1 GiB segments) all of it would stay in the active segment, which
    is never cleaned. An operator's change (IncrementalAlterConfigs); the application's own
    settings stay its defaults."""
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            for name, value in CLEANABLE.items()
        ],
    )
    admin.incremental_alter_configs([resource])[resource].result(timeout=CALL_TIMEOUT_S)


@pytest.fixture
def apps() -> Iterator[list[App]]:
    started: list[App] = []
    try:
        yield started
    finally:
        for app in started:
            app.stop()


@pytest.mark.parametrize("framework", FRAMEWORKS, ids=lambda f: f.name)
def test_stateful_app_restores_from_its_compacted_changelog_after_sigkill(
    cluster: Any, apps: list[App], tmp_path: Path, framework: Framework
) -> None:
    bootstrap = cluster.kafka_bootstrap()
    name = f"streams-{framework.name}"
    input_topic, output_topic, group = f"{name}-in", f"{name}-out", f"{name}-app"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [
            NewTopic(input_topic, framework.input_partitions, 3),
            NewTopic(output_topic, framework.input_partitions, 3),
        ],
        operation_timeout=CALL_TIMEOUT_S,
    )
    for f in futures.values():
        f.result(timeout=CALL_TIMEOUT_S)

    seq_of: dict[str, int] = {}
    events = [event(i, seq_of) for i in range(3 * EVENTS_PER_PHASE)]
    phase_a, phase_b, phase_c = (events[n * EVENTS_PER_PHASE : (n + 1) * EVENTS_PER_PHASE] for n in range(3))
    final = {key: sums[-1] for key, sums in prefix_sums(events).items()}
    state_dir = tmp_path / "state"
    app = App(
        framework.name,
        [bootstrap, input_topic, output_topic, group, str(state_dir)],
        tmp_path / f"{framework.name}.log",
    )
    apps.append(app)
    output = Output(bootstrap, output_topic, framework.input_partitions)

    def committed(ends: dict[int, int]) -> Callable[[], bool]:
        return lambda: committed_all(bootstrap, group, input_topic, framework.input_partitions, ends)

    try:
        # The application creates its changelog, compacted, at start; the test makes it cleanable.
        app.start()
        output.wait(app, lambda: changelog_topic(admin, group, framework) is not None, "the changelog")
        changelog = changelog_topic(admin, group, framework)
        assert changelog is not None
        assert topic_config(admin, changelog, "cleanup.policy") == "compact"
        make_cleanable(admin, changelog)
        # A: processed and committed before the crash, in chunks, each committed before the next
        # is produced: the changelog gets a batch of states per chunk (quixstreams writes a key's
        # latest state at each commit), so several segments, the older ones cleanable.
        chunk = len(phase_a) // CHUNKS_A
        for done in range(chunk, len(phase_a) + 1, chunk):
            ends_a = produce(bootstrap, input_topic, phase_a[done - chunk : done])
            output.wait(app, output.processed_at_least(done), f"the output of A's first {done} events")
            output.wait(app, committed(ends_a), f"A's first {done} events to be committed")
        # B: the process dies (SIGKILL) once some of B is processed (for faust: once all of B
        # is processed and committed: faust's seek race above).
        ends_b = produce(bootstrap, input_topic, phase_b)
        output.wait(app, lambda: any(v["i"] >= len(phase_a) for _, _, v in output.records), "B's output")
        if not framework.replays_uncommitted:
            output.wait(app, output.processed_at_least(len(phase_a) + len(phase_b)), "B's whole output")
            output.wait(app, committed(ends_b), "B to be committed")
        app.kill()
        shutil.rmtree(state_dir, ignore_errors=True)
        # The state is restored from a cleaned changelog: superseded states removed, holes left.
        output.wait(
            app,
            lambda: read_changelog(bootstrap, changelog).removed > 0,
            "the cleaner to remove superseded states from the changelog",
            timeout_s=CLEAN_TIMEOUT_S,
            alive=False,
        )
        # C: produced while the application is down (for faust: once it runs again), processed
        # after it restored its state.
        if framework.replays_uncommitted:
            ends = produce(bootstrap, input_topic, phase_c)
            app.start()
        else:
            ready_before = app.log_text().count(framework.ready_line)
            app.start()
            # Its restart waits out the killed member's session (faust's 60 s) before it is assigned
            # partitions, restores and runs.
            output.wait(
                app,
                lambda: app.log_text().count(framework.ready_line) > ready_before,
                f"the restarted application to log {framework.ready_line!r}",
                timeout_s=PROCESS_TIMEOUT_S,
            )
            ends = produce(bootstrap, input_topic, phase_c)
        output.wait(
            app,
            lambda: {v["key"]: v["seq"] for _, _, v in output.records} == seq_of,
            "every key's last event in the output",
        )
        try:
            output.wait(app, committed(ends), "every input offset to be committed")
        except AssertionError as error:
            # Say which partitions lag: a framework that drops a commit it thinks it made
            # (faust does on a commit answered "rebalance in progress") stops at one offset.
            offsets = committed_offsets(bootstrap, group, input_topic, framework.input_partitions)
            lagging = {p: (offsets[p], end) for p, end in sorted(ends.items()) if offsets[p] < end}
            raise AssertionError(
                f"{error}\ncommitted < end per lagging partition: {lagging}\n"
                f"the brokers' last warnings:\n{broker_warnings(cluster)}"
            ) from None
    finally:
        app.stop()
        output.close()

    # Every output is a true running sum, and the latest output per key is the final sum.
    expected = prefix_sums(events)
    wrong = [v for _, _, v in output.records if v["sum"] != expected[v["key"]][v["seq"]]]
    assert not wrong, f"{len(wrong)} outputs with a wrong sum for their seq, e.g. {wrong[:3]}"
    latest: dict[str, tuple[int, int, dict[str, Any]]] = {}
    for partition, offset, value in output.records:
        seen = latest.get(value["key"])
        assert seen is None or seen[0] == partition, f"key {value['key']} in two output partitions"
        if seen is None or offset > seen[1]:
            latest[value["key"]] = (partition, offset, value)
    assert {key: value["sum"] for key, (_, _, value) in latest.items()} == final
    # At-least-once: every event was processed (no gap in any key's seq), some perhaps twice.
    processed = {v["i"] for _, _, v in output.records}
    assert processed == set(range(len(events)))

    # The cleaned changelog holds exactly the final state.
    state = read_changelog(bootstrap, changelog).state
    assert {key: value["sum"] for key, value in state.items()} == final
    assert {key: value["seq"] for key, value in state.items()} == seq_of
