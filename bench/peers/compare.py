"""Highwater side by side with what users would pick instead, in one invocation.

    python bench/peers/compare.py --workload produce-100b|produce-10kb|e2e|consume

starts all three systems on 127.0.0.1, each with three copies of the data:

- Highwater: LocalCluster (etcd, controller, 3 brokers, gateway), topic with RF 3,
  min.insync.replicas 2, acks=all;
- NATS JetStream: three nats-server nodes clustered, file storage, stream replicas 3
  (an acknowledgement means a quorum, 2 of 3, has the message);
- Redis Streams: a primary and two replicas, pipelined XADD then WAIT 2 (both replicas);

and, on the same Highwater cluster, the brokers' Kafka listeners driven by confluent-kafka
(librdkafka; bench/kafka_protocol.py; --no-kafka leaves it out), reported as "highwater kafka";
(--no-peers leaves NATS and Redis out: Highwater alone, for a smoke run where they are not
installed; tests/integration/test_bench_compare.py runs every workload so);
then runs the workload on each in turn — Highwater, NATS, Redis, and again for --rounds
rounds — so every system sees the same machine load within a round, and prints each
figure, the peer's, and the ratio per round and over the rounds (median). The idle
systems stay up while another runs (their idle CPU is in the per-process table).

Workloads (all from one client process, Python clients on every side):
- produce-100b / produce-10kb: records/s and MB/s as fast as they go, latency per request
  (Highwater: the Producer through the gateway, and with --our-paths direct also raw
  Produce straight to the leaders; Kafka's protocol: confluent-kafka's Producer with acks=all
  and idempotence; NATS: publish_async; Redis: pipeline + WAIT 2);
- e2e: send -> receive latency at --rates records/s (consumer in another process);
- consume: catch-up read of --records records loaded first.

Every process is stopped by pid at the end (also on Ctrl-C), data in temporary directories.
Writes bench/results/compare-<workload>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common, consume, e2e_latency, kafka_protocol, produce
from bench.peers import nats_js, redis_streams
from clients.config import BATCH_SIZE_BYTES_DEFAULT, LINGER_MS_DEFAULT

WORKLOADS = ("produce-100b", "produce-10kb", "e2e", "consume")
SYSTEMS = ("highwater", "nats", "redis")
RECORD_SIZES = {"produce-100b": 100, "produce-10kb": 10_000}


def _meter(pids: dict[str, int], extra: dict[str, int] | None = None) -> produce.Window:
    return produce.Window(common.CpuMeter({**pids, "client": os.getpid(), **(extra or {})}))


def _delete_topic(gateway: str, topic: str) -> None:
    """Free the disk a finished round used (10 KB rounds write gigabytes per replica)."""
    import grpc

    from protos.highwater.v1 import common_pb2, gateway_pb2_grpc

    with contextlib.suppress(grpc.RpcError), grpc.insecure_channel(gateway) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)  # type: ignore[no-untyped-call]  # generated, unannotated
        stub.DeleteTopics(common_pb2.DeleteTopicsRequest(names=[topic], timeout_ms=30_000), timeout=35)


class Systems:
    """The three systems, up for the whole invocation."""

    def __init__(self, stack: contextlib.ExitStack, args: argparse.Namespace) -> None:
        self.args = args
        self.hw = stack.enter_context(
            common.highwater_target(
                bootstrap=None,
                topic="bench-warm",
                partitions=args.partitions,
                replication_factor=3,
                min_insync=2,
            )
        )
        # The systems each round runs, in order: Highwater alone with --no-peers.
        self.names = SYSTEMS if args.peers else SYSTEMS[:1]
        if args.peers:
            self.nats = stack.enter_context(nats_js.nats_cluster())
            asyncio.run(nats_js.create_stream(self.nats, replicas=3))
            self.redis = stack.enter_context(redis_streams.redis_cluster())
        self._round_topic = 0

    def fresh_topic(self) -> common.Target:
        """A new topic on the Highwater cluster (the previous round's one deleted)."""
        if self._round_topic:
            _delete_topic(self.hw.gateway, self.hw.topic)
        self._round_topic += 1
        topic = f"bench-{self.args.workload}-{self._round_topic}"
        leaders = common.create_topic(
            self.hw.gateway, topic, partitions=self.args.partitions, replication_factor=3, min_insync=2
        )
        self.hw.topic, self.hw.leaders = topic, leaders
        return self.hw


# ---- one run of a workload on one system ------------------------------------------------------


def run_produce(systems: Systems, system: str, size: int) -> list[common.Result]:
    args = systems.args
    if system == "highwater":
        target = systems.fresh_topic()
        spec = produce.ProduceSpec(
            record_size=size,
            duration_s=args.duration_s,
            warmup_s=args.warmup_s,
            batch_size=args.batch_size,
            linger_ms=args.linger_ms,
            in_flight=args.in_flight,
            records_per_send=args.records_per_send,
        )
        out = []
        for path in args.our_paths:
            window = _meter(target.pids)
            result = produce.run_path(target, spec, path, window)
            out.append({"system": f"highwater {path}", **result, "cpu_cores": window.cpu})
        if args.kafka:
            window = _meter(target.pids)
            result = kafka_protocol.produce(
                target.kafka_bootstrap,
                target.topic,
                record_size=size,
                duration_s=args.duration_s,
                warmup_s=args.warmup_s,
                window=window,
            )
            out.append({"system": "highwater kafka", **result, "cpu_cores": window.cpu})
        return out
    # What both peers' produce() take alike: unbounded, the sizes and times of our own runs.
    workload = dict(record_size=size, duration_s=args.duration_s, warmup_s=args.warmup_s, throughput=-1)
    if system == "nats":
        asyncio.run(nats_js.purge(systems.nats.urls))
        window = _meter(systems.nats.pids)
        result = asyncio.run(
            nats_js.produce(
                systems.nats.urls,
                **workload,
                in_flight=nats_js.PUBLISH_ASYNC_MAX_PENDING_DEFAULT,
                window=window,
            )
        )
        return [{"system": "nats", **result, "cpu_cores": window.cpu}]
    redis_streams.reset(systems.redis.primary_port)
    window = _meter(systems.redis.pids)
    result = redis_streams.produce(
        systems.redis.primary_port, **workload, batch=args.redis_batch, window=window
    )
    return [{"system": "redis", **result, "cpu_cores": window.cpu}]


def run_consume(systems: Systems, system: str) -> list[common.Result]:
    args = systems.args
    size = 100
    n = args.records
    if system == "highwater":
        target = systems.fresh_topic()
        loaded = consume.load(target, n, size, args.batch_size)
        out = []
        for path in args.our_consume_paths:
            window = _meter(target.pids)
            ns = argparse.Namespace(
                max_poll_records=args.max_poll_records, decode=False, partition_max_bytes=1024 * 1024
            )
            result = consume.run_path(target, path, n, ns, window)
            out.append(
                {"system": f"highwater {path}", **result, "load_s": round(loaded, 2), "cpu_cores": window.cpu}
            )
        for name in args.kafka_consume if args.kafka else ():
            # The same loaded topic, through the brokers' Kafka listeners.
            window = _meter(target.pids)
            settings = kafka_protocol.CONSUME_SETTINGS[name]
            result = kafka_protocol.consume(
                target.kafka_bootstrap,
                target.topic,
                count=n,
                record_size=size,
                window=window,
                settings=settings,
            )
            system = "highwater kafka" if name == "tuned" else f"highwater kafka {name}"
            out.append(
                {
                    "system": system,
                    **result,
                    "settings": settings,
                    "load_s": round(loaded, 2),
                    "cpu_cores": window.cpu,
                }
            )
        return out
    if system == "nats":
        out = []
        asyncio.run(nats_js.purge(systems.nats.urls))
        loaded = asyncio.run(nats_js.load(systems.nats.urls, count=n, record_size=size))
        for mode in ("pull", "push"):  # both read the same stream from its start
            window = _meter(systems.nats.pids)
            result = asyncio.run(
                nats_js.consume(
                    systems.nats.urls, count=n, record_size=size, fetch_batch=1000, window=window, mode=mode
                )
            )
            out.append(
                {"system": f"nats {mode}", **result, "load_s": round(loaded, 2), "cpu_cores": window.cpu}
            )
        return out
    redis_streams.reset(systems.redis.primary_port)
    loaded = redis_streams.load(systems.redis.primary_port, count=n, record_size=size)
    window = _meter(systems.redis.pids)
    result = redis_streams.consume(
        systems.redis.primary_port, count=n, record_size=size, fetch_batch=10_000, window=window
    )
    return [{"system": "redis", **result, "load_s": round(loaded, 2), "cpu_cores": window.cpu}]


def _e2e_consumer_cmd(module_file: str, address: list[str], expected: int, timeout_s: float) -> list[str]:
    """A peer module run as its `e2e-consumer` (common.e2e_consumer_main)."""
    return [
        sys.executable,
        module_file,
        "e2e-consumer",
        *address,
        "--expected",
        str(expected),
        "--timeout-s",
        str(timeout_s),
    ]


def run_e2e(systems: Systems, system: str, rate: float) -> list[common.Result]:
    args = systems.args
    size = 100
    expected = int(rate * args.duration_s)
    timeout_s = args.warmup_s + args.duration_s + e2e_latency.DRAIN_S + 30
    if system == "highwater":
        target = systems.fresh_topic()
        # The load gate is this script's (main), once per run, so run_rate does not wait again.
        settings = e2e_latency.RateSettings(
            warmup_s=args.warmup_s, duration_s=args.duration_s, record_size=size, quiet_wait_s=0
        )
        out = [{"system": "highwater", **e2e_latency.run_rate(target, rate, settings)}]
        for linger_ms in args.kafka_linger_ms if args.kafka else ():
            out.append(_run_e2e_kafka(systems, rate, expected, timeout_s, linger_ms))
        return out
    # The peers' producers carry no warm-up flag: their warm-up is a separate short run first.
    if system == "nats":
        asyncio.run(nats_js.purge(systems.nats.urls))
        asyncio.run(
            nats_js.e2e_produce(systems.nats.urls, rate=rate, duration_s=args.warmup_s, record_size=size)
        )
        cmd = _e2e_consumer_cmd(
            nats_js.__file__, ["--urls", ",".join(systems.nats.urls)], expected, timeout_s
        )
        pids = systems.nats.pids

        def send() -> common.Result:
            return asyncio.run(
                nats_js.e2e_produce(
                    systems.nats.urls, rate=rate, duration_s=args.duration_s, record_size=size
                )
            )
    else:
        redis_streams.reset(systems.redis.primary_port)
        redis_streams.e2e_produce(
            systems.redis.primary_port, rate=rate, duration_s=args.warmup_s, record_size=size
        )
        cmd = _e2e_consumer_cmd(
            redis_streams.__file__, ["--port", str(systems.redis.primary_port)], expected, timeout_s
        )
        pids = systems.redis.pids

        def send() -> common.Result:
            return redis_streams.e2e_produce(
                systems.redis.primary_port, rate=rate, duration_s=args.duration_s, record_size=size
            )

    return [_e2e_measured(system, rate, args.duration_s, cmd, pids, send)]


def _run_e2e_kafka(
    systems: Systems, rate: float, expected: int, timeout_s: float, linger_ms: int
) -> common.Result:
    """Highwater's e2e through its Kafka listeners, on a topic of its own, the producer lingering
    linger_ms."""
    args = systems.args
    target = systems.fresh_topic()
    producer = kafka_protocol.e2e_producer(target.kafka_bootstrap, linger_ms)
    kafka_protocol.e2e_produce(producer, target.topic, rate=rate, duration_s=args.warmup_s, record_size=100)
    cmd = [
        sys.executable,
        kafka_protocol.__file__,
        "e2e-consumer",
        "--bootstrap",
        target.kafka_bootstrap,
        "--topic",
        target.topic,
        "--expected",
        str(expected),
        "--timeout-s",
        str(timeout_s),
    ]

    def send() -> common.Result:
        return kafka_protocol.e2e_produce(
            producer, target.topic, rate=rate, duration_s=args.duration_s, record_size=100
        )

    result = _e2e_measured(
        f"highwater kafka linger {linger_ms}", rate, args.duration_s, cmd, target.pids, send
    )
    return {**result, "linger_ms": linger_ms}


def _e2e_measured(
    system: str,
    rate: float,
    duration_s: float,
    cmd: list[str],
    pids: dict[str, int],
    send: Callable[[], common.Result],
) -> common.Result:
    """Start the consumer process `cmd`, send(), and read its latencies; CPU of every process."""
    consumer = e2e_latency.E2EConsumer(cmd)
    try:
        meter = common.CpuMeter({**pids, "producer": os.getpid(), "consumer": consumer.pid}).start()
        sent = send()
        cpu = meter.stop()
        got = consumer.result(timeout_s=e2e_latency.DRAIN_S + common.E2E_IDLE_END_S + 30)
    finally:
        consumer.stop()
    sent["achieved_rate"] = round(int(sent["sent"]) / duration_s)
    return {"system": system, "rate": rate, **sent, **got, "cpu_cores": cpu}


# ---- figures and ratios -------------------------------------------------------------------------


def figure(result: common.Result, workload: str) -> float:
    """The one number compared: records/s (produce, consume) or p50 ms (e2e)."""
    if workload == "e2e":
        return float((result.get("latency") or {}).get("p50_ms", float("nan")))
    return float(result.get("records_per_s", 0))


def line(result: common.Result, workload: str) -> str:
    name = f"{result['system']:<24}"
    if workload == "e2e":
        lat = result.get("latency") or {}
        spread = ""
        if lat.get("p50_ms"):
            spread = f", p99/p50 {lat['p99_ms'] / lat['p50_ms']:.1f}"
        return (
            f"{name} {result['rate']:>7,.0f}/s  {common.format_latency(lat)}{spread}  "
            f"({result.get('received', 0):,} received; sent at {result.get('achieved_rate', 0):,}/s)"
        )
    text = f"{name} {result['records_per_s']:>10,} records/s {result['mb_per_s']:>7.1f} MB/s"
    lat = result.get("latency_per_request")
    if lat:
        text += f"  per request ({result['records_per_request']} rec): {common.format_latency(lat)}"
    if result.get("records_failed") or result.get("complete") is False:
        text += f"  !! failed/incomplete: {result.get('errors') or ''}"
    return text


def ratios(rows: list[common.Result], workload: str) -> dict[str, float]:
    """ours / peer for throughput (higher is better), peer / ours for latency (so > 1 = we win)."""
    rows = [r for r in rows if "error" not in r]
    ours = [r for r in rows if str(r["system"]).startswith("highwater")]
    peers = [r for r in rows if not str(r["system"]).startswith("highwater")]
    out: dict[str, float] = {}
    best_peer: dict[str, common.Result] = {}
    for p in peers:
        kind = str(p["system"]).split()[0]
        if workload == "e2e":
            if kind not in best_peer or figure(p, workload) < figure(best_peer[kind], workload):
                best_peer[kind] = p
        elif kind not in best_peer or figure(p, workload) > figure(best_peer[kind], workload):
            best_peer[kind] = p
    for o in ours:
        for kind, p in best_peer.items():
            a, b = figure(o, workload), figure(p, workload)
            key = f"{o['system']} vs {kind}"
            if workload == "e2e":
                key += f" @ {o.get('rate'):,.0f}/s"
                out[key] = round(b / a, 2) if a else float("nan")
            else:
                out[key] = round(a / b, 2) if b else float("inf")
    return out


def kafka_path(rows: list[common.Result], workload: str) -> dict[str, float]:
    """The Kafka listener against our own clients on the same cluster in the same round:
    consume, its records/s over our Consumer's (> 1: Kafka's client is faster); e2e, each
    linger's p50 minus our clients' p50 at the same rate, in ms (issue 42 asks for at most
    linger.ms + 1)."""
    rows = [r for r in rows if "error" not in r]
    out: dict[str, float] = {}
    if workload == "consume":
        ours = [r for r in rows if r["system"] == "highwater consumer"]
        for r in rows:
            if ours and str(r["system"]).startswith("highwater kafka") and figure(ours[0], workload):
                out[f"{r['system']} / highwater consumer"] = round(
                    figure(r, workload) / figure(ours[0], workload), 2
                )
    elif workload == "e2e":
        for r in rows:
            if not str(r["system"]).startswith("highwater kafka"):
                continue
            ours = [o for o in rows if o["system"] == "highwater" and o.get("rate") == r.get("rate")]
            if ours:
                key = f"{r['system']} p50 - highwater p50 @ {r['rate']:,.0f}/s (ms)"
                out[key] = round(figure(r, workload) - figure(ours[0], workload), 2)
    return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=WORKLOADS, required=True)
    parser.add_argument("--rounds", type=int, default=2, help="alternations Highwater/NATS/Redis (default 2)")
    parser.add_argument(
        "--duration-s",
        type=float,
        default=None,
        help="measured seconds per run (default 6 for produce, 8 for e2e)",
    )
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument(
        "--partitions", type=int, default=6, help="Highwater partitions (default 6; e2e uses 1)"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=BATCH_SIZE_BYTES_DEFAULT,
        help=f"Highwater batch bytes (default {BATCH_SIZE_BYTES_DEFAULT}, the Producer's)",
    )
    parser.add_argument(
        "--records-per-send",
        type=int,
        default=0,
        help="Highwater Producer: values per send_batch() call (default: what fits one batch)",
    )
    parser.add_argument("--linger-ms", type=int, default=LINGER_MS_DEFAULT)
    parser.add_argument("--in-flight", type=int, default=5)
    parser.add_argument(
        "--our-paths",
        nargs="+",
        choices=produce.PATHS,
        default=["client", "direct"],
        help="Highwater produce paths to run (default client direct)",
    )
    parser.add_argument(
        "--our-consume-paths",
        nargs="+",
        choices=consume.PATHS,
        default=["consumer", "fetch"],
        help="Highwater consume paths (default consumer fetch)",
    )
    parser.add_argument(
        "--kafka",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run Highwater through its Kafka listeners with confluent-kafka (default on)",
    )
    parser.add_argument(
        "--peers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run NATS JetStream and Redis Streams (default on; --no-peers: Highwater alone)",
    )
    parser.add_argument(
        "--kafka-linger-ms",
        type=int,
        nargs="+",
        default=[5, 0],
        help="e2e: the confluent-kafka producer's linger.ms, a run each (default 5 0)",
    )
    parser.add_argument(
        "--kafka-consume",
        nargs="+",
        choices=sorted(kafka_protocol.CONSUME_SETTINGS),
        default=["tuned", "defaults"],
        help="consume: confluent-kafka with fetch.queue.backoff.ms 10 (tuned) and with "
        "librdkafka's defaults, a run each (default both)",
    )
    parser.add_argument("--max-poll-records", type=int, default=500)
    parser.add_argument(
        "--redis-batch", type=int, default=1000, help="XADDs per pipeline before WAIT 2 (default 1000)"
    )
    parser.add_argument(
        "--records", type=int, default=500_000, help="consume: records loaded (default 500,000)"
    )
    parser.add_argument("--rates", type=float, nargs="+", default=[2000, 20000], help="e2e rates (records/s)")
    parser.add_argument(
        "--output",
        default=None,
        help="results: a name under bench/results, or a path (default compare-<workload>)",
    )
    parser.add_argument(
        "--quiet-wait-s",
        type=float,
        default=10.0,
        help="per run, wait up to this long for the 1-minute load to drop below 1.5 (default 10)",
    )
    args = parser.parse_args()
    if args.duration_s is None:
        args.duration_s = 8.0 if args.workload == "e2e" else 6.0
    if args.workload == "e2e":
        args.partitions = 1
        args.rounds = min(args.rounds, 1) if "--rounds" not in sys.argv else args.rounds
    return args


# One case of a round: the system, the e2e rate (None for the other workloads) and the run.
Case = tuple[str, float | None, Callable[[], list[common.Result]]]


def round_cases(systems: Systems, args: argparse.Namespace) -> list[Case]:
    """A round's cases in the order they run: every system in turn (e2e: at every rate)."""
    if args.workload == "e2e":
        return [
            (s, rate, functools.partial(run_e2e, systems, s, rate))
            for rate in args.rates
            for s in systems.names
        ]
    if args.workload == "consume":
        return [(s, None, functools.partial(run_consume, systems, s)) for s in systems.names]
    size = RECORD_SIZES[args.workload]
    return [(s, None, functools.partial(run_produce, systems, s, size)) for s in systems.names]


def measure_case(args: argparse.Namespace, number: int, case: Case) -> list[common.Result]:
    """One case of a round once the load gate lets it start, with its CPU figures, printed as it
    goes; a system that fails gives one row saying why, so the others' figures are kept."""
    system, rate, run = case
    gate = common.wait_for_quiet(wait_s=args.quiet_wait_s)
    try:
        got = run()
    except Exception as exc:  # one system failing must not lose the others' figures
        print(f"  round {number}: {system} FAILED: {type(exc).__name__}: {exc}", flush=True)
        return [{"system": system, "rate": rate, "error": f"{type(exc).__name__}: {exc}"}]
    for result in got:
        result.update(gate, load_1m_after=common.load_average())
        records = result.get("records_acked", result.get("records", result.get("received")))
        if records and result.get("cpu_cores"):
            # CPU per record holds better than records/s on a loaded machine.
            result["cpu_us_per_record"] = common.cpu_us_per_record(result["cpu_cores"], int(records))
        print(f"  round {number}: {line(result, args.workload)}", flush=True)
        print(
            f"           CPU (cores): {common.format_cpu(result['cpu_cores'])}; load "
            f"{gate['load_1m_before']} -> {result['load_1m_after']}",
            flush=True,
        )
    return got


def run_round(systems: Systems, args: argparse.Namespace, number: int) -> common.Result:
    """Every system in turn (e2e: at every rate), then the round's ratios, printed."""
    rows: list[common.Result] = []
    for case in round_cases(systems, args):
        rows.extend(measure_case(args, number, case))
    r: dict[str, float] = {}
    if args.workload == "e2e":  # compare like with like: each rate on its own
        for rate in args.rates:
            r.update(ratios([row for row in rows if row.get("rate") == rate], args.workload))
    else:
        r = ratios(rows, args.workload)
    for key, value in r.items():
        print(f"  round {number} ratio {key}: {value}x", flush=True)
    gaps = kafka_path(rows, args.workload)
    for key, value in gaps.items():
        print(f"  round {number} Kafka path: {key}: {value}", flush=True)
    return {"results": rows, "ratios": r, "kafka_path": gaps}


def median_ratios(rounds: list[common.Result], field: str = "ratios") -> dict[str, float]:
    """Each ratio (of the rounds' `field`) as its median over the rounds that have it."""
    summary: dict[str, float] = {}
    keys = dict.fromkeys(k for rnd in rounds for k in rnd.get(field, {}))
    for key in keys:
        values = [rnd[field][key] for rnd in rounds if key in rnd.get(field, {})]
        summary[key] = round(statistics.median(values), 2)
    return summary


def main() -> int:
    args = parse_args()
    out: common.Result = {
        **common.header(peers=args.peers),
        "workload": args.workload,
        "args": vars(args),
        "rounds": [],
    }
    shown_systems = (
        "Highwater, NATS JetStream, Redis Streams" if args.peers else "Highwater alone (--no-peers)"
    )
    print(
        f"compare {args.workload}: {args.rounds} round(s) of {shown_systems}; {args.duration_s:g} s per run",
        flush=True,
    )
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        systems = Systems(stack, args)
        print(f"  all up in {time.monotonic() - started:.1f} s", flush=True)
        for number in range(1, args.rounds + 1):
            out["rounds"].append(run_round(systems, args, number))
    summary = median_ratios(out["rounds"])
    out["ratio_median"] = summary
    print("ratios (median over rounds; > 1 means Highwater is ahead):")
    for key, value in summary.items():
        print(f"  {key}: {value}x")
    out["kafka_path_median"] = median_ratios(out["rounds"], "kafka_path")
    if out["kafka_path_median"]:
        print("the Kafka listener against our own clients (median over rounds):")
        for key, value in out["kafka_path_median"].items():
            print(f"  {key}: {value}")
    path = common.write_result(args.output or f"compare-{args.workload}", out)
    print(
        f"took {time.monotonic() - started:.0f} s; machine: {out['machine']}; results: {common.shown(path)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
