"""Closing a synchronous client leaves nothing on stderr ("Event loop is closed", destroyed tasks).

Each Producer, Consumer and Admin runs grpc.aio on a private loop that close() ends. grpc.aio
has one completion-queue poller per process, and whichever client loop wakes up hands each
completion to the loop that owns it. A completion that grpc core delivers after its client's
loop closed (a stream or call it finishes late) used to make that hand-over raise
"RuntimeError: Event loop is closed" inside another client's loop: printed on stderr at a
client close in a long-running program (seen once every ~70 s in the soak benchmark) and
cutting short that loop's pass over the queue.

The scripts run in a subprocess so their stderr is theirs alone.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.integration.conftest import TestCluster

REPO = Path(__file__).resolve().parents[2]
SCRIPT_TIMEOUT_S = 120
CLOSES_PER_KIND = 5
NOISE = ("Event loop is closed", "was never retrieved", "Task was destroyed")

# A grpc.aio server on one client loop answers a stream 0.5 s after each request; other client
# loops open a stream, send a request and end without waiting. The answers then reach the
# poller after their loops closed: the late completion this test is about.
LATE_COMPLETION = """
import asyncio, sys, time
import grpc
from clients.loop_thread import LoopThread

async def slow_echo(requests, context):
    async for request in requests:
        await asyncio.sleep(0.5)
        yield request

async def serve():
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "t.S", {"E": grpc.stream_stream_rpc_method_handler(slow_echo)}
    )
    server.add_generic_rpc_handlers([handler])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port

live = LoopThread("live")
server, port = live.run(serve(), 10_000)
kept = []

async def abandon_a_stream():
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stream = channel.stream_stream("/t.S/E")()
    await stream.write(b"x")
    return channel, stream

for i in range(8):
    short = LoopThread(f"short-{i}")
    kept.append(short.run(abandon_a_stream(), 10_000))
    short.stop()
time.sleep(1.5)  # the answers (0.5 s each) arrive meanwhile
live.run(server.stop(None), 10_000)
live.stop()
print("finished", file=sys.stderr)
"""

CLIENTS = """
import gc, sys, time
from clients import Admin, Consumer, Producer

bootstrap, topic, kind, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
# A long-lived consumer in the same group, as a service has: its loop is one the poller wakes.
member = Consumer(topic, bootstrap=bootstrap, group_id=topic, auto_offset_reset="earliest")
member.poll(timeout_ms=500)
for i in range(n):
    if kind == "producer":
        producer = Producer(bootstrap, acks="all")
        producer.send(topic, b"v%d" % i).result(30)
        producer.close()
    elif kind == "consumer":
        consumer = Consumer(topic, bootstrap=bootstrap, group_id=topic, auto_offset_reset="earliest")
        consumer.poll(timeout_ms=1000)
        consumer.close()
    else:
        admin = Admin(bootstrap)
        admin.describe_topics(topic)
        admin.close()
    member.poll(timeout_ms=100)
gc.collect()
time.sleep(2)
gc.collect()
member.close()
print("finished", file=sys.stderr)
"""


def run_script(source: str, *args: str) -> str:
    """Run `source` in a fresh interpreter; its stderr (it must exit 0)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "finished" in done.stderr
    return done.stderr


def assert_quiet(stderr: str) -> None:
    noisy = [line for line in stderr.splitlines() if any(word in line for word in NOISE)]
    assert not noisy, stderr[-4000:]


def test_late_grpc_completion_for_a_closed_client_loop_is_dropped_quietly() -> None:
    assert_quiet(run_script(LATE_COMPLETION))


def test_opening_and_closing_each_client_kind_leaves_stderr_clean(cluster: TestCluster) -> None:
    from clients import Admin

    topic = "close-clean"
    with Admin(cluster.gateway_address, request_timeout_ms=10_000) as admin:
        admin.create_topics(topic, 3, 3)
    for kind in ("producer", "consumer", "admin"):
        assert_quiet(run_script(CLIENTS, cluster.gateway_address, topic, kind, str(CLOSES_PER_KIND)))
