"""Random, malformed, partial, slow and numerous requests at the brokers' Kafka listeners.

One plaintext cluster (two brokers, each with a Kafka listener; what a private network
exposes: anyone may open a socket). Raw sockets, no Kafka client, so every byte is ours:

- well-typed requests: every API in protocol.SUPPORTED_VERSIONS at every served version
  (and more at random ones), built from kio's schema classes with random field values of the
  right types (extreme and small integers, odd names, random or real record batches, short
  timeouts so that a legitimate wait stays short), one to three per connection, pipelined;
- byte-level mutations of such frames: flipped bytes, truncated or padded bodies, a random
  API version or key, a size prefix that lies (longer than the body: a partial frame), negative
  or over the listener's bound;
- random bytes under a valid size prefix;
- partial frames (a size announced and part of the body sent, then silence) and slow senders
  (a valid request in small pieces, its body within the body deadline: answered; a body that
  trickles and never ends: closed);
- many connections from one address: twice the per-address bound at each broker at once;
- many partial frames that together announce far more than the broker's partial-frame budget.

Assertions: every request is answered (with its correlation id) or its connection closed
within a bound (0 hung connections); the brokers' logs hold no traceback and no "Task exception
was never retrieved" (a connection's sender that died without a word); afterwards every broker
is SERVING (gRPC health), a Kafka client still produces to and consumes from each, and each
broker's open files and RSS grew by less than the bounds below, also while the floods were
held. The figures are printed (pytest -s shows them).

The brokers' Kafka bounds are set small by flag (BROKER_ARGS: body deadline, connections per
address, partial-frame budget), so the floods pass them with little data and the whole module
takes 40-80 s on two shared cores. Seeded: the seed is printed; HIGHWATER_KAFKA_FUZZ_SEED=<seed>
repeats a run. The figures of one run are in docs/SECURITY.md ("Kafka listener fuzzing").
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import io
import os
import random
import re
import struct
import time
import types
import typing
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_writer

from clients.common.records import Record, encode_batch
from services.common import limits
from services.kafka import protocol
from tests.integration.conftest import TEST_LEASE_TTL_S, TestCluster
from tests.integration.helpers import create_topic, gateway_stub

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = int(os.environ.get("HIGHWATER_KAFKA_FUZZ_SEED", str(time.time_ns() % 1_000_000_007)))
BROKERS = 2
CANARY = "kf-canary"  # never in the fuzzer's name pool: it may not be deleted or changed
# The listener's bounds, set small by flag so that the run is short and the floods pass them
# with little data: a request's largest size, the time its body may take once announced, the
# connections one address may hold, the bytes of partial frames a broker buffers in all.
MAX_REQUEST_BYTES = 4 << 20
REQUEST_BODY_TIMEOUT_MS = 2_000
CONNECTIONS_PER_IP_MAX = 40
PARTIAL_FRAME_BYTES_MAX = 8 << 20
BROKER_ARGS = [
    "--kafka-request-body-timeout-ms",
    str(REQUEST_BODY_TIMEOUT_MS),
    "--kafka-connections-per-ip-max",
    str(CONNECTIONS_PER_IP_MAX),
    "--kafka-partial-frame-bytes-max",
    str(PARTIAL_FRAME_BYTES_MAX),
]
# Examples per (API, version) served, then this many more at random served versions.
EXAMPLES_PER_VERSION = 4
RANDOM_EXAMPLES = 400
MUTATIONS = 600
RANDOM_FRAMES = 100
# Connections the request cases use at once (well under CONNECTIONS_PER_IP_MAX with the stalls).
WORKERS = 8
# A request whose answer needs the controller or etcd waits at most KAFKA_BACKEND_CALL_TIMEOUT_S;
# the random timeouts below are at most a second, so an answer or a close comes well within this.
CASE_BOUND_S = limits.KAFKA_BACKEND_CALL_TIMEOUT_S + 5.0
# A frame announced and never finished is closed within the body deadline (plus scheduling).
BODY_BOUND_S = REQUEST_BODY_TIMEOUT_MS / 1000 + 3.0
PARTIAL_FRAMES = 12
SLOW_SENDERS = 6
# A slow sender's request goes out in this many pieces (its first ones a byte each, the size
# prefix among them), evenly over half the body deadline: slow, yet on time.
SLOW_SENDER_PIECES = 40
SLOW_SENDER_SPREAD_S = REQUEST_BODY_TIMEOUT_MS / 1000 / 2
TRICKLERS = 4
TRICKLE_INTERVAL_S = 0.25
# Connections opened at each broker at once, from 127.0.0.1: twice what one address may hold.
FLOOD_CONNECTIONS = 2 * CONNECTIONS_PER_IP_MAX
# Open files a broker may gain while the flood is held: the connections one address may hold
# and some slack (the broker's own files and channels come and go).
FLOOD_OPEN_FILES_GROWTH_MAX = CONNECTIONS_PER_IP_MAX + 16
# Partial frames aimed at broker 1 together: each announces the largest request and sends all
# but MEMORY_FRAME_HELD_BACK of it; together 60 MiB, over seven times the partial-frame budget.
MEMORY_FRAMES = 16
MEMORY_FRAME_HELD_BACK = 256 << 10
# RSS broker 1 may gain while those are held: the budget and room for the rest of the process
# (well under the MEMORY_FRAMES * MAX_REQUEST_BYTES = 64 MiB sent).
MEMORY_RSS_GROWTH_MAX = PARTIAL_FRAME_BYTES_MAX + (16 << 20)
# What a broker may gain over the whole run, everything closed again (a leak of one handle
# per connection would show: the run opens over a thousand).
OPEN_FILES_GROWTH_MAX = 64
RSS_GROWTH_MAX_BYTES = 128 << 20
LOG_FAILURES = ("Traceback", "Task exception was never retrieved", "exception was never retrieved")
RAISED = re.compile(r"^[A-Za-z_.]*(Error|Exception|Exit|Interrupt)\b")  # a traceback's last line
STEP_TIMEOUT_S = 30.0

_SIZE = struct.Struct(">i")
NAMES = ("", "fz-a", "fz-b", "fz-" + "x" * 300, "fz-\u00fc\u0000", "..", "fz a/b", "x" * 2000)
INT_EXTREMES = {
    "int8": (-(1 << 7), (1 << 7) - 1),
    "int16": (-(1 << 15), (1 << 15) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
}
TIMEOUTS_MS = (-1, 0, 1, 10, 100, 500, 1000)


# --- random requests -------------------------------------------------------------------------


class RequestMaker:
    """Random, well-typed kio request objects, and their frames; all drawn from one Random."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.batch = encode_batch([Record(b"k", b"fuzz", [], 0)])

    def entity(self, cls: type[Any], depth: int = 0) -> Any:
        hints = typing.get_type_hints(cls)
        values = {
            f.name: self.value(f.metadata.get("kafka_type"), hints[f.name], depth)
            for f in dataclasses.fields(cls)
        }
        return cls(**values)

    def value(self, kafka_type: str | None, hint: Any, depth: int) -> Any:
        rng = self.rng
        origin = typing.get_origin(hint)
        if origin in (typing.Union, types.UnionType):
            options = [a for a in typing.get_args(hint) if a is not type(None)]
            return None if rng.random() < 0.2 else self.value(kafka_type, options[0], depth)
        if origin is tuple:
            element = typing.get_args(hint)[0]
            count = rng.choice((0, 1, 1, 2, 3)) if depth < 3 else 0
            return tuple(self.value(kafka_type, element, depth + 1) for _ in range(count))
        if dataclasses.is_dataclass(hint):
            return self.entity(typing.cast(type[Any], hint), depth + 1)
        if kafka_type == "bool":
            return rng.random() < 0.5
        if kafka_type in INT_EXTREMES:
            low, high = INT_EXTREMES[kafka_type]
            return rng.choice((0, 1, -1, 2, 3, low, high, rng.randint(low, high)))
        if kafka_type == "string":
            return rng.choice(NAMES)
        if kafka_type in ("bytes", "records"):
            return rng.choice((b"", self.batch, rng.randbytes(rng.randint(1, 64)), self.spoiled_batch()))
        if kafka_type == "uuid":
            return uuid.UUID(int=rng.choice((0, rng.getrandbits(128))))
        if kafka_type in ("timedelta_i32", "timedelta_i64"):
            return datetime.timedelta(milliseconds=rng.choice(TIMEOUTS_MS))
        raise AssertionError(f"no generator for kafka_type {kafka_type!r} ({hint!r}): extend RequestMaker")

    def spoiled_batch(self) -> bytes:
        spoiled = bytearray(self.batch)
        for _ in range(self.rng.randint(1, 4)):
            spoiled[self.rng.randrange(len(spoiled))] = self.rng.randrange(256)
        return bytes(spoiled)

    def frame_body(self, api_key: int, version: int, correlation_id: int) -> bytes:
        """One request without its size prefix: header (v1, or v2 for flexible versions) and body."""
        return self.request(api_key, version, correlation_id)[0]

    def request(self, api_key: int, version: int, correlation_id: int) -> tuple[bytes, bool]:
        """(frame_body, whether Kafka answers it): a Produce with acks=0 gets no answer."""
        cls = protocol.request_class(api_key, version)
        buf = io.BytesIO()
        header_cls: Any = RequestHeaderV2 if cls.__flexible__ else RequestHeaderV1
        header = header_cls(
            request_api_key=api_key,
            request_api_version=version,
            correlation_id=correlation_id,
            client_id=self.rng.choice(("fuzzer", None, "")),
        )
        entity_writer(header_cls)(buf, header)
        body = self.entity(cls)
        entity_writer(cls)(buf, body)
        return buf.getvalue(), not (api_key == protocol.PRODUCE and body.acks == 0)


# After requests that may get no answer (a Produce with acks=0, a mutated frame), an ApiVersions
# v0 with this correlation id: its answer says the connection is still served.
SENTINEL_ID = 999_999


def framed(body: bytes) -> bytes:
    return _SIZE.pack(len(body)) + body


SENTINEL = framed(struct.pack(">hhih", protocol.API_VERSIONS, 0, SENTINEL_ID, -1))


def mutated(rng: random.Random, body: bytes) -> tuple[str, bytes]:
    """(what was done, the bytes to send) for one byte-level mutation of a request body."""
    kind = rng.choice(("flip", "truncate", "pad", "version", "api_key", "lying_size", "bad_size"))
    data = bytearray(body)
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif kind == "truncate":
        del data[rng.randrange(len(data)) :]
    elif kind == "pad":
        data += rng.randbytes(rng.randint(1, 256))
    elif kind == "version":
        struct.pack_into(">h", data, 2, rng.randint(-(1 << 15), (1 << 15) - 1))
    elif kind == "api_key":
        struct.pack_into(">h", data, 0, rng.randint(-(1 << 15), (1 << 15) - 1))
    elif kind == "lying_size":  # announces more than follows: a partial frame
        return kind, _SIZE.pack(len(data) + rng.randint(1, 4096)) + bytes(data)
    else:
        size = rng.choice((-1, -(1 << 31), MAX_REQUEST_BYTES + 1, (1 << 31) - 1))
        return kind, _SIZE.pack(size) + bytes(data)
    return kind, framed(bytes(data))


# --- one connection --------------------------------------------------------------------------


@dataclass
class Tally:
    """Outcomes of the run: answered, closed or hung, per kind of case."""

    outcomes: Counter[str] = field(default_factory=Counter)
    hung: list[str] = field(default_factory=list)
    wrong_answers: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # every failed check, reported together

    def record(self, case: str, outcome: str, payload: bytes = b"") -> None:
        self.outcomes[f"{case.split(' ')[0]}:{outcome}"] += 1
        if outcome == "hung":
            self.hung.append(f"{case} {described(payload)}")


def described(payload: bytes) -> str:
    """The first request in payload as kio reads it (what a hung connection was sent)."""
    if len(payload) < 4:
        return repr(payload)
    try:
        request = protocol.decode_request(payload[4 : 4 + _SIZE.unpack_from(payload)[0]])
    except Exception as exc:  # any bytes at all: say what they were instead
        return f"{payload[:64]!r} ({exc})"
    return f"correlation id {request.correlation_id}: {request.body!r}"[:600]


async def exchange(
    port: int,
    case: str,
    payload: bytes,
    correlation_ids: list[int],
    tally: Tally,
    *,
    bound_s: float = CASE_BOUND_S,
    spread_s: float = 0.0,
) -> str:
    """Send payload (in SLOW_SENDER_PIECES pieces over spread_s), then read an answer per correlation id
    (in order) until all came, the broker closed, or bound_s passed ("hung")."""
    try:
        async with asyncio.timeout(bound_s):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                outcome = await _talk(reader, writer, case, payload, correlation_ids, tally, spread_s)
            finally:
                writer.close()
    except TimeoutError:
        outcome = "hung"
    except (ConnectionError, OSError):
        outcome = "closed"
    tally.record(case, outcome, payload)
    return outcome


def slow_pieces(payload: bytes) -> list[bytes]:
    """payload in about SLOW_SENDER_PIECES pieces: the first half a byte each (the size prefix and
    the header cut up), then the rest in even pieces."""
    head = SLOW_SENDER_PIECES // 2
    pieces = [payload[i : i + 1] for i in range(min(head, len(payload)))]
    rest = payload[head:]
    step = max(1, -(-len(rest) // (SLOW_SENDER_PIECES - head)))
    return pieces + [rest[i : i + step] for i in range(0, len(rest), step)]


async def _talk(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    case: str,
    payload: bytes,
    correlation_ids: list[int],
    tally: Tally,
    spread_s: float,
) -> str:
    try:
        if spread_s:
            pieces = slow_pieces(payload)
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(spread_s / len(pieces))
        else:
            writer.write(payload)
            await writer.drain()
        # In order, as Kafka answers a connection's requests; anything may come before the sentinel
        # (an answer to whatever a mutated frame turned into).
        for expected in correlation_ids:
            while True:
                (size,) = _SIZE.unpack(await reader.readexactly(4))
                answer = await reader.readexactly(size)
                (correlation_id,) = _SIZE.unpack_from(answer)
                if correlation_id == expected:
                    break
                if expected != SENTINEL_ID:
                    tally.wrong_answers.append(
                        f"{case}: correlation id {correlation_id}, expected {expected}"
                    )
                    break
        if not correlation_ids:  # nothing can be answered: the broker must close
            await reader.read()
            return "closed"
        return "answered"
    except (asyncio.IncompleteReadError, ConnectionError):
        return "closed"


async def stall(port: int, case: str, announced: int, sent: bytes, tally: Tally, *, trickle: bool) -> None:
    """A frame announced and never finished: sent in part, then silence (or a byte every
    TRICKLE_INTERVAL_S, never reaching the end). The broker must close within BODY_BOUND_S."""
    outcome = "hung"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        async with asyncio.timeout(BODY_BOUND_S):
            writer.write(_SIZE.pack(announced) + sent)
            await writer.drain()
            while True:
                try:
                    if await asyncio.wait_for(reader.read(1), TRICKLE_INTERVAL_S) == b"":
                        outcome = "closed"
                        break
                except TimeoutError:
                    if trickle:
                        writer.write(b"\0")
                        await writer.drain()
    except TimeoutError:
        pass
    except ConnectionError:
        outcome = "closed"
    finally:
        writer.close()
    tally.record(case, outcome)


# --- the broker processes --------------------------------------------------------------------


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


class Brokers:
    """The fuzzed brokers: Kafka ports, pids, log files, and their figures before the run."""

    def __init__(self, cluster: TestCluster) -> None:
        self.cluster = cluster
        self.names = [f"broker-{i}" for i in range(1, BROKERS + 1)]
        self.kafka_ports = {n: cluster.processes[n].info["kafka_port"] for n in self.names}
        self.log_offsets = {n: cluster.processes[n].log_path.stat().st_size for n in self.names}
        self.before = self.figures()

    def pid(self, name: str) -> int:
        pid = self.cluster.processes[name].pid
        assert pid is not None and self.cluster.processes[name].running, f"{name} is not running"
        return pid

    def figures(self) -> dict[str, tuple[int, int]]:
        """(open files, RSS bytes) of every broker."""
        return {n: (open_files(self.pid(n)), rss_bytes(self.pid(n))) for n in self.names}

    def new_log_failures(self) -> list[tuple[str, str]]:
        """(what was raised, the log lines from the one before the traceback to it) for every
        traceback the brokers logged since the run began."""
        found = []
        for n in self.names:
            with self.cluster.processes[n].log_path.open("rb") as f:
                f.seek(self.log_offsets[n])
                text = f.read().decode("utf-8", "replace")
            lines = text.splitlines()
            for i, line in enumerate(lines):
                if any(marker in line for marker in LOG_FAILURES):
                    end = next((j for j in range(i + 1, len(lines)) if RAISED.match(lines[j])), i)
                    found.append((lines[end], f"{n}: " + "\n".join(lines[max(0, i - 1) : end + 1])))
        return found

    def serving(self) -> None:
        for n in self.names:
            port = self.cluster.processes[n].info["port"]
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert status.status == health_pb2.HealthCheckResponse.SERVING, n


@pytest.fixture(scope="module")
def fuzzed_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(
        tmp_path_factory.mktemp("kafka-fuzz"),
        brokers=BROKERS,
        lease_ttl_s=TEST_LEASE_TTL_S,
        service_args=["--max-request-bytes", str(MAX_REQUEST_BYTES)],
        broker_args=BROKER_ARGS,
    )
    c.start()
    try:
        result = create_topic(gateway_stub(c.gateway_address), CANARY, partitions=2, replication_factor=2)
        assert result.error_code == 0, result
        yield c
    finally:
        c.stop()


# --- the run -----------------------------------------------------------------------------------


async def run_cases(cases: list[Callable[[], Awaitable[object]]]) -> None:
    """Run cases on WORKERS connections at a time."""
    queue: asyncio.Queue[Callable[[], Awaitable[object]]] = asyncio.Queue()
    for case in cases:
        queue.put_nowait(case)

    async def worker() -> None:
        while not queue.empty():
            await queue.get_nowait()()

    await asyncio.gather(*(worker() for _ in range(WORKERS)))


def request_cases(
    rng: random.Random, ports: list[int], tally: Tally
) -> list[Callable[[], Awaitable[object]]]:
    maker = RequestMaker(rng)
    served = [(k, v) for k, (low, high) in protocol.SUPPORTED_VERSIONS.items() for v in range(low, high + 1)]
    picks = served * EXAMPLES_PER_VERSION + [rng.choice(served) for _ in range(RANDOM_EXAMPLES)]
    rng.shuffle(picks)
    cases: list[Callable[[], Awaitable[object]]] = []
    correlation_id = 0
    at = 0
    while at < len(picks):
        group = picks[at : at + rng.randint(1, 3)]  # pipelined on one connection
        at += len(group)
        bodies, ids = [], []
        for api_key, version in group:
            correlation_id += 1
            body, answered = maker.request(api_key, version, correlation_id)
            bodies.append(framed(body))
            if answered:
                ids.append(correlation_id)
        if len(ids) < len(group):
            bodies.append(SENTINEL)
            ids.append(SENTINEL_ID)
        case = "typed " + ",".join(f"{k}v{v}" for k, v in group)
        payload = b"".join(bodies)
        port = rng.choice(ports)
        cases.append(functools.partial(exchange, port, case, payload, ids, tally))
    for _ in range(MUTATIONS):
        api_key, version = rng.choice(served)
        correlation_id += 1
        kind, payload = mutated(rng, maker.frame_body(api_key, version, correlation_id))
        case = f"mutated:{kind} {api_key}v{version}"
        port = rng.choice(ports)
        if kind == "lying_size":  # the frame never ends: closed by the body deadline
            cases.append(functools.partial(exchange, port, case, payload, [], tally, bound_s=BODY_BOUND_S))
        else:  # whatever the frame now says, the sentinel is answered or the connection closed
            cases.append(functools.partial(exchange, port, case, payload + SENTINEL, [SENTINEL_ID], tally))
    for _ in range(RANDOM_FRAMES):
        payload = framed(rng.randbytes(rng.randint(0, 512))) + SENTINEL
        port = rng.choice(ports)
        cases.append(functools.partial(exchange, port, "random_bytes", payload, [SENTINEL_ID], tally))
    return cases


async def slow_senders(rng: random.Random, ports: list[int], tally: Tally) -> None:
    """Valid ApiVersions and Metadata requests in pieces over half the body deadline: answered."""
    maker = RequestMaker(rng)
    sends = []
    for i in range(SLOW_SENDERS):
        api_key = protocol.API_VERSIONS if i % 2 else protocol.METADATA
        body = maker.frame_body(api_key, protocol.SUPPORTED_VERSIONS[api_key][0], 10_000 + i)
        payload = framed(body)
        bound_s = CASE_BOUND_S + SLOW_SENDER_SPREAD_S  # from the first byte sent
        sends.append(
            exchange(
                rng.choice(ports),
                "slow_sender",
                payload,
                [10_000 + i],
                tally,
                bound_s=bound_s,
                spread_s=SLOW_SENDER_SPREAD_S,
            )
        )
    outcomes = await asyncio.gather(*sends)
    if outcomes.count("answered") != len(outcomes):
        tally.problems.append(f"a whole request sent slowly, on time, was not answered: {outcomes}")


def stalls(rng: random.Random, ports: list[int], tally: Tally) -> list[Awaitable[None]]:
    """Partial frames (silent after part of the body) and tricklers (a byte now and then)."""
    out: list[Awaitable[None]] = []
    for i in range(PARTIAL_FRAMES + TRICKLERS):
        announced = rng.choice((10, 1000, 1 << 20, MAX_REQUEST_BYTES))
        sent = rng.randbytes(rng.randint(0, min(announced - 1, 64 << 10)))
        trickle = i >= PARTIAL_FRAMES
        case = "trickler" if trickle else "partial_frame"
        if trickle:
            announced = MAX_REQUEST_BYTES  # never reached a byte at a time
        out.append(stall(rng.choice(ports), case, announced, sent, tally, trickle=trickle))
    return out


async def flood(brokers: Brokers, tally: Tally, figures: dict[str, str]) -> None:
    """FLOOD_CONNECTIONS connections at each broker at once, each asking ApiVersions; all held
    open while the broker's open files are counted."""
    for name in brokers.names:
        port = brokers.kafka_ports[name]
        files_before = open_files(brokers.pid(name))
        held: list[asyncio.StreamWriter] = []
        readers: list[asyncio.StreamReader] = []
        request = framed(RequestMaker(random.Random(SEED)).frame_body(protocol.API_VERSIONS, 0, 7))
        for _ in range(FLOOD_CONNECTIONS):
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port), CASE_BOUND_S
                )
            except (TimeoutError, OSError):
                tally.record("flood", "closed")
                continue
            writer.write(request)
            held.append(writer)
            readers.append(reader)

        async def answered_or_closed(reader: asyncio.StreamReader) -> str:
            try:
                async with asyncio.timeout(CASE_BOUND_S):
                    (size,) = _SIZE.unpack(await reader.readexactly(4))
                    await reader.readexactly(size)
                    return "answered"
            except TimeoutError:
                return "hung"
            except (asyncio.IncompleteReadError, ConnectionError):
                return "closed"

        outcomes = await asyncio.gather(*(answered_or_closed(r) for r in readers))
        for outcome in outcomes:
            tally.record("flood", outcome)
        files_held = open_files(brokers.pid(name))
        for writer in held:
            writer.close()
        figures[name] = (
            f"{FLOOD_CONNECTIONS} connections: {outcomes.count('answered')} answered, "
            f"{outcomes.count('closed')} closed; open files {files_before} -> {files_held} while held"
        )
        if files_held - files_before > FLOOD_OPEN_FILES_GROWTH_MAX:
            tally.problems.append(
                f"{name} holds {files_held - files_before} more open files with {FLOOD_CONNECTIONS} "
                f"connections from one address open (bound {FLOOD_OPEN_FILES_GROWTH_MAX}: "
                f"{CONNECTIONS_PER_IP_MAX} per address)"
            )


async def memory_flood(brokers: Brokers, tally: Tally, figures: dict[str, str]) -> int:
    """MEMORY_FRAMES partial frames at broker 1, all but MEMORY_FRAME_HELD_BACK of each sent;
    returns the broker's RSS growth while they are held."""
    name = brokers.names[0]
    pid, port = brokers.pid(name), brokers.kafka_ports[name]
    rss_before = rss_bytes(pid)
    chunk = bytes(MAX_REQUEST_BYTES - MEMORY_FRAME_HELD_BACK)
    writers = []
    closed = 0
    for _ in range(MEMORY_FRAMES):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writers.append(writer)
        try:
            writer.write(_SIZE.pack(MAX_REQUEST_BYTES))
            writer.write(chunk)
            await asyncio.wait_for(writer.drain(), 1.0)
            # The broker closes a connection whose frame would pass its budget as it reads it.
            if await asyncio.wait_for(reader.read(1), 0.2) == b"":
                closed += 1
        except TimeoutError:
            pass  # held: the broker has (or is still reading) the frame
        except ConnectionError:
            closed += 1
    rss_peak = rss_before
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        rss_peak = max(rss_peak, rss_bytes(pid))
        await asyncio.sleep(0.1)
    for writer in writers:
        writer.close()
    figures[name] = (
        f"{MEMORY_FRAMES} partial frames of {mib(MAX_REQUEST_BYTES)}, "
        f"{mib(MEMORY_FRAMES * len(chunk))} sent: {closed} closed by the broker; RSS {mib(rss_before)} -> "
        f"{mib(rss_peak)} at most while held"
    )
    tally.outcomes["memory_flood:closed"] += closed
    return rss_peak - rss_before


def produce_and_consume(c: TestCluster) -> None:
    """Each broker still takes records and serves them back over its Kafka listener."""
    config = {"bootstrap.servers": c.kafka_bootstrap(), "socket.timeout.ms": 10_000}
    producer = confluent_kafka.Producer({**config, "acks": "all"})
    errors: list[Any] = []
    for partition in range(2):  # one partition led by each broker
        for i in range(5):
            producer.produce(
                CANARY, value=b"after %d" % i, partition=partition, on_delivery=lambda e, m: errors.append(e)
            )
    assert producer.flush(STEP_TIMEOUT_S) == 0 and errors == [None] * 10, errors
    consumer = confluent_kafka.Consumer(
        {**config, "group.id": "kf-after", "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(CANARY, p, 0) for p in range(2)])
        values: list[bytes] = []
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while len(values) < 10 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value() or b"")
        assert len(values) >= 10, f"consumed {len(values)} of the 10 records produced after the fuzz"
    finally:
        consumer.close()


def test_the_kafka_listener_survives_random_partial_slow_and_numerous_requests(
    fuzzed_cluster: TestCluster,
) -> None:
    print(f"\nKafka listener fuzz: seed {SEED} (HIGHWATER_KAFKA_FUZZ_SEED={SEED} repeats it)")
    rng = random.Random(SEED)
    brokers = Brokers(fuzzed_cluster)
    ports = list(brokers.kafka_ports.values())
    tally = Tally()
    flood_figures: dict[str, str] = {}
    memory_figures: dict[str, str] = {}
    started = time.monotonic()

    async def run() -> int:
        stalled = asyncio.gather(*stalls(rng, ports, tally))
        await slow_senders(rng, ports, tally)
        await run_cases(request_cases(rng, ports, tally))
        await flood(brokers, tally, flood_figures)
        growth = await memory_flood(brokers, tally, memory_figures)
        await stalled
        return growth

    memory_growth = asyncio.run(run())
    elapsed = time.monotonic() - started
    after = brokers.figures()

    print(
        f"  {sum(tally.outcomes.values())} connections in {elapsed:.1f} s: "
        f"{dict(sorted(tally.outcomes.items()))}"
    )
    for name in brokers.names:
        (files_before, rss_before), (files_after, rss_after) = brokers.before[name], after[name]
        print(
            f"  {name}: open files {files_before} -> {files_after}, RSS {mib(rss_before)} -> {mib(rss_after)}"
        )
        print(f"  {name} flood: {flood_figures.get(name, '-')}")
        if name in memory_figures:
            print(f"  {name} memory: {memory_figures[name]}")

    problems = tally.problems
    if tally.hung:
        kinds = Counter(case.split(" ")[0] for case in tally.hung)
        first_of_each = {case.split(" ")[0]: case for case in reversed(tally.hung)}
        shown = [*first_of_each.values(), *(c for c in tally.hung if c.startswith("typed"))]
        problems.append(
            f"{len(tally.hung)} connections neither answered nor closed in time ({dict(kinds)}); the first "
            "of each kind and every typed request:\n    " + "\n    ".join(c[:400] for c in shown[:40])
        )
    if tally.wrong_answers:
        problems.append(f"answers out of order: {tally.wrong_answers[:10]}")
    failures = brokers.new_log_failures()
    if failures:
        raised = Counter(exception for exception, _ in failures)
        problems.append(
            f"{len(failures)} tracebacks in the brokers' logs; what was raised: {dict(raised)}; the first:\n"
            + "\n---\n".join(excerpt for _, excerpt in failures[:2])
        )
    if memory_growth > MEMORY_RSS_GROWTH_MAX:
        problems.append(
            f"broker-1 RSS grew {mib(memory_growth)} under {MEMORY_FRAMES} partial frames "
            f"(bound {mib(MEMORY_RSS_GROWTH_MAX)}: the {mib(PARTIAL_FRAME_BYTES_MAX)} partial-frame budget)"
        )
    for name in brokers.names:
        (files_before, rss_before), (files_after, rss_after) = brokers.before[name], after[name]
        if files_after - files_before > OPEN_FILES_GROWTH_MAX:
            problems.append(f"{name} open files {files_before} -> {files_after} after the run")
        if rss_after - rss_before > RSS_GROWTH_MAX_BYTES:
            problems.append(f"{name} RSS {mib(rss_before)} -> {mib(rss_after)} after the run")
    for what, check in (
        ("gRPC health", brokers.serving),
        ("produce and consume", functools.partial(produce_and_consume, fuzzed_cluster)),
    ):
        try:
            check()
        except Exception as exc:  # every failed check is reported, not only the first
            problems.append(f"{what} after the fuzz: {exc!r}")
    assert problems == [], "\n".join(f"- {p}" for p in problems)
