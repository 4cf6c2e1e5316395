"""What transactions cost (issue 41): transactional produce against idempotent produce in the
same run, and a read_committed catch-up read against a read_uncommitted one.

Driven by confluent-kafka (librdkafka, its defaults plus acks=all) through the brokers' Kafka
listeners, on a cluster of our own (3 brokers, a 6-partition topic with 3 replicas and
min.insync.replicas 2) or an existing one (--bootstrap for the gateway that creates the topic
and --kafka-bootstrap for the listeners). Produce modes, alternated round by round so that a
slow moment of the machine hits each alike:

- idempotent: enable.idempotence, as fast as librdkafka takes records; counted when acknowledged;
- txn-100ms: a transactional producer committing every 100 ms;
- txn-1000: committing every 1,000 records;
records of a transaction count once its commit returns (commit_transaction flushes them), so
the rate includes every commit's wait. Then a second topic gets --read-records records in
transactions of 100 ms, one in ten of them aborted, and is read from offset 0 to its end with
isolation.level read_committed (skipping the aborted ones and the markers) and with
read_uncommitted, alternated; records/s counts the records each read returns.

Prints records/s per mode, the median over rounds, the ratio against idempotent produce (target
for txn-100ms: at least 0.80, i.e. transactions cost at most 20%), each mode's commit latency,
and the two read rates with their ratio. `--client highwater` runs the produce modes with our own
Producer through the gateways' transaction coordinator instead (the reads stay confluent-kafka's).

    .venv/bin/python bench/transactions.py [--rounds 3] [--duration-s 10] [--client highwater]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/transactions.py` from anywhere

from bench import common

# The produce modes: name -> (commit every N ms, commit every N records); (0, 0) is idempotent.
MODES: dict[str, tuple[int, int]] = {"idempotent": (0, 0), "txn-100ms": (100, 0), "txn-1000": (0, 1_000)}
# What a transaction may cost at one commit per 100 ms (issue 41): txn-100ms / idempotent.
TARGET_RATIO = 0.80
CALL_TIMEOUT_S = 60.0
MESSAGE_TIMEOUT_MS = 60_000
# A full local queue: wait this long for delivery reports before producing again.
QUEUE_FULL_POLL_S = 0.005
READ_TIMEOUT_S = 300.0
# The read topic: one transaction in this many aborted; filled within this long at most.
READ_ABORT_EVERY = 10
READ_FILL_S_MAX = 120.0


def _producer(bootstrap: str, **settings: Any) -> Any:
    import confluent_kafka

    return confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": MESSAGE_TIMEOUT_MS, **settings}
    )


def produce_idempotent(bootstrap: str, topic: str, payload: bytes, duration_s: float) -> dict[str, float]:
    """Records as fast as librdkafka takes them; counted once flushed (no per-record callback, as
    the transactional modes have none: the Python cost of one would be measured instead)."""
    producer = _producer(bootstrap, **{"enable.idempotence": True})
    sent = 0
    start = time.perf_counter()
    while time.perf_counter() - start < duration_s:
        try:
            producer.produce(topic, payload)
        except BufferError:
            producer.poll(QUEUE_FULL_POLL_S)
            continue
        sent += 1
        producer.poll(0)
    left = producer.flush(CALL_TIMEOUT_S)
    elapsed = time.perf_counter() - start
    if left:
        raise RuntimeError(f"{left} records not delivered within {CALL_TIMEOUT_S:g} s")
    return {"records_per_s": sent / elapsed, "records": sent, "commits": 0}


def produce_transactional(
    bootstrap: str,
    topic: str,
    payload: bytes,
    duration_s: float,
    every_ms: int,
    every_records: int,
    tid: str,
    *,
    records_max: int = 0,
    abort_every: int = 0,
) -> dict[str, Any]:
    """Transactions of every_ms milliseconds or every_records records, for duration_s (or until
    records_max records, when given); every abort_every-th transaction aborted (0: none)."""
    producer = _producer(bootstrap, **{"transactional.id": tid})
    producer.init_transactions(CALL_TIMEOUT_S)
    committed = in_txn = commits = 0
    commit_waits: list[float] = []

    def commit() -> None:
        nonlocal committed, in_txn, commits
        started = time.perf_counter()
        if abort_every and (commits + 1) % abort_every == 0:
            producer.abort_transaction(CALL_TIMEOUT_S)
            in_txn = 0
        else:
            producer.commit_transaction(CALL_TIMEOUT_S)
        commit_waits.append(time.perf_counter() - started)
        committed, in_txn, commits = committed + in_txn, 0, commits + 1

    start = time.perf_counter()
    producer.begin_transaction()
    opened = start
    while (now := time.perf_counter()) - start < duration_s and not (
        records_max and committed + in_txn >= records_max
    ):
        if (every_ms and now - opened >= every_ms / 1000) or (every_records and in_txn >= every_records):
            commit()
            producer.begin_transaction()
            opened = time.perf_counter()
        try:
            producer.produce(topic, payload)
        except BufferError:
            producer.poll(QUEUE_FULL_POLL_S)
            continue
        in_txn += 1
        producer.poll(0)
    commit()
    elapsed = time.perf_counter() - start
    return {
        "records_per_s": committed / elapsed,
        "records": committed,
        "commits": commits,
        "commit_latency": common.percentiles_ms(commit_waits),
    }


def produce_highwater(
    gateway: str, topic: str, payload: bytes, duration_s: float, every_ms: int, every_records: int, tid: str
) -> dict[str, Any]:
    """Our Producer (acks=all, idempotent, straight to the leaders): as fast as it takes records,
    or in transactions of every_ms milliseconds or every_records records when `tid` is set;
    records count once flushed or committed."""
    from clients import Producer

    producer = Producer(gateway, transactional_id=tid or None)
    committed = in_txn = commits = 0
    commit_waits: list[float] = []
    try:
        if tid:
            producer.init_transactions()
            producer.begin_transaction()
        start = opened = time.perf_counter()
        while (now := time.perf_counter()) - start < duration_s:
            if tid and (
                (every_ms and now - opened >= every_ms / 1000) or (every_records and in_txn >= every_records)
            ):
                started = time.perf_counter()
                producer.commit_transaction()
                commit_waits.append(time.perf_counter() - started)
                committed, in_txn, commits = committed + in_txn, 0, commits + 1
                producer.begin_transaction()
                opened = time.perf_counter()
            producer.produce(topic, payload)
            in_txn += 1
        if tid:
            started = time.perf_counter()
            producer.commit_transaction()
            commit_waits.append(time.perf_counter() - started)
            commits += 1
        else:
            producer.flush(timeout_ms=int(CALL_TIMEOUT_S * 1000))
        committed += in_txn
        elapsed = time.perf_counter() - start
    finally:
        producer.close()
    run: dict[str, Any] = {"records_per_s": committed / elapsed, "records": committed, "commits": commits}
    if tid:
        run["commit_latency"] = common.percentiles_ms(commit_waits)
    return run


def read_all(bootstrap: str, topic: str, isolation: str) -> dict[str, float]:
    """Every partition from offset 0 to its end (markers included in the offsets), timed."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-txn-read-{isolation}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=CALL_TIMEOUT_S)
        partitions = sorted(metadata.topics[topic].partitions)
        ends = {
            p: consumer.get_watermark_offsets(
                confluent_kafka.TopicPartition(topic, p), timeout=CALL_TIMEOUT_S
            )[1]
            for p in partitions
        }
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in partitions])
        records = 0
        start = time.perf_counter()
        last: dict[int, int] = {}
        while any(last.get(p, -1) + 1 < ends[p] for p in partitions if ends[p] > 0):
            if time.perf_counter() - start > READ_TIMEOUT_S:
                raise TimeoutError(f"{isolation} read did not reach the end within {READ_TIMEOUT_S:g} s")
            for m in consumer.consume(10_000, 0.1):
                if m.error() is None:
                    records += 1
                    last[m.partition()] = m.offset()
            # A partition whose last offsets are markers: its position is the end once passed.
            for tp in consumer.position([confluent_kafka.TopicPartition(topic, p) for p in partitions]):
                if tp.offset >= ends[tp.partition]:
                    last[tp.partition] = ends[tp.partition] - 1
        elapsed = time.perf_counter() - start
    finally:
        consumer.close()
    return {"records_per_s": records / elapsed, "records": records, "seconds": elapsed}


def _rounds(
    args: argparse.Namespace, kafka: str, gateway: str, topic: str
) -> dict[str, list[dict[str, Any]]]:
    payload = b"x" * args.record_size
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for round_number in range(args.rounds):
        order = list(MODES) if round_number % 2 == 0 else list(reversed(MODES))
        for mode in order:
            every_ms, every_records = MODES[mode]
            if args.client == "highwater":
                tid = "" if mode == "idempotent" else f"bench-hw-{mode}-{round_number}-{int(time.time())}"
                run: dict[str, Any] = produce_highwater(
                    gateway, topic, payload, args.duration_s, every_ms, every_records, tid
                )
            elif mode == "idempotent":
                run = produce_idempotent(kafka, topic, payload, args.duration_s)
            else:
                tid = f"bench-{mode}-{round_number}-{int(time.time())}"
                run = produce_transactional(
                    kafka, topic, payload, args.duration_s, every_ms, every_records, tid
                )
            runs[mode].append(run)
            latency = (
                f", commit {common.format_latency(run['commit_latency'])}" if "commit_latency" in run else ""
            )
            print(
                f"round {round_number + 1} {mode:>10}: {run['records_per_s']:>9,.0f} records/s{latency}",
                flush=True,
            )
    return runs


def _reads(args: argparse.Namespace, kafka: str, topic: str) -> dict[str, list[dict[str, float]]]:
    filled = produce_transactional(
        kafka,
        topic,
        b"x" * args.record_size,
        READ_FILL_S_MAX,
        100,
        0,
        f"bench-read-fill-{int(time.time())}",
        records_max=args.read_records,
        abort_every=READ_ABORT_EVERY,
    )
    print(f"read topic: {filled['commits']} transactions, 1 in {READ_ABORT_EVERY} aborted", flush=True)
    reads: dict[str, list[dict[str, float]]] = {"read_committed": [], "read_uncommitted": []}
    for round_number in range(args.rounds):
        order = list(reads) if round_number % 2 == 0 else list(reversed(reads))
        for isolation in order:
            run = read_all(kafka, topic, isolation)
            reads[isolation].append(run)
            print(
                f"round {round_number + 1} {isolation:>16}: {run['records_per_s']:>9,.0f} records/s",
                flush=True,
            )
    return reads


def _median(runs: list[dict[str, Any]]) -> float:
    return float(statistics.median(float(r["records_per_s"]) for r in runs))


def _summary(
    runs: dict[str, list[dict[str, Any]]], reads: dict[str, list[dict[str, float]]]
) -> dict[str, float]:
    base = _median(runs["idempotent"])
    summary = {f"{mode}_records_per_s": _median(r) for mode, r in runs.items()}
    for mode in MODES:
        if mode != "idempotent":
            summary[f"{mode}_vs_idempotent"] = _median(runs[mode]) / base
    summary["read_committed_vs_uncommitted"] = _median(reads["read_committed"]) / _median(
        reads["read_uncommitted"]
    )
    print(f"median idempotent: {base:,.0f} records/s")
    for mode in MODES:
        if mode != "idempotent":
            ratio = summary[f"{mode}_vs_idempotent"]
            print(f"median {mode}: {_median(runs[mode]):,.0f} records/s = {ratio:.2f}x idempotent")
    ratio_100 = summary["txn-100ms_vs_idempotent"]
    verdict = "met" if ratio_100 >= TARGET_RATIO else "NOT met"
    print(f"target (txn-100ms at least {TARGET_RATIO:.2f}x idempotent): {verdict}")
    print(f"read_committed catch-up: {summary['read_committed_vs_uncommitted']:.2f}x read_uncommitted")
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1])
    common.add_target_arguments(parser, partitions=6, output="transactions")
    parser.add_argument(
        "--kafka-bootstrap", help="with --bootstrap: the brokers' Kafka listeners, HOST:PORT,..."
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every mode, alternated (default 3)")
    parser.add_argument(
        "--duration-s", type=float, default=10.0, help="seconds of each produce run (default 10)"
    )
    parser.add_argument(
        "--record-size", type=int, default=100, help="bytes of each record's value (default 100)"
    )
    parser.add_argument(
        "--client",
        choices=("confluent", "highwater"),
        default="confluent",
        help="the producer of the produce modes: confluent-kafka on the Kafka listeners (default), "
        "or our Producer through the gateways",
    )
    parser.add_argument(
        "--read-records", type=int, default=2_000_000, help="records in the read topic (default 2,000,000)"
    )
    args = parser.parse_args()
    if args.bootstrap and not args.kafka_bootstrap:
        parser.error("--bootstrap needs --kafka-bootstrap (the brokers' Kafka listeners)")
    topic = common.target_topic(args, "transactions")
    out = common.target_header(
        args, record_size=args.record_size, duration_s=args.duration_s, rounds=args.rounds, client=args.client
    )
    with common.target_for(args, topic) as target:
        kafka = args.kafka_bootstrap or target.kafka_bootstrap
        read_topic = f"{topic}-read"
        common.create_topic(
            target.gateway,
            read_topic,
            partitions=args.partitions,
            replication_factor=args.replication_factor,
            min_insync=args.min_insync,
        )
        out["quiet"] = common.wait_for_quiet(wait_s=args.quiet_wait_s)
        runs = _rounds(args, kafka, target.gateway, topic)
        reads = _reads(args, kafka, read_topic)
    out["runs"] = [{"mode": mode, **run} for mode, rs in runs.items() for run in rs]
    out["reads"] = reads
    out["summary"] = _summary(runs, reads)
    return common.finish(args.output, out)


if __name__ == "__main__":
    raise SystemExit(main())
