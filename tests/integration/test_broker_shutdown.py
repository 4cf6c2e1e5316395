"""Clean stops of brokers: each exits 0 within a bound, and the cluster comes back whole.

The defect the first test guards: SIGTERM to all brokers at once halted a broker (exit 70) in
3 of 10 trials, or hung it, because a LeaderAndIsr arriving after the controlled shutdown
started a fetcher on a log that close() had already closed. A closing broker now refuses
control requests (BROKER_NOT_AVAILABLE), stops every fetcher it ever started and exits 0.

The second (issue 24): a broker leading many partitions took ~2 s to exit after its last
leadership moved, closing its logs one by one (~11 fsyncs each); they now close together
(log.close_logs), and the next start must still find every log clean (no recovery scan).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import signal
import subprocess
import threading
import time

import pytest

from protos.highwater.v1 import common_pb2
from services.broker.core import RUN_MARKER_FILE
from services.broker.log.checkpoints import CLEAN_SHUTDOWN_MARKER
from services.broker.log.log import CLOSE_STAGING_DIR
from tests.integration.helpers import create_topic, describe_partition, gateway_stub, produce, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The defect halted or hung a broker in 3 of 10 trials: 9 rounds miss it with probability 0.7**9,
# about 4%. (20 rounds took 195 s of CI's budget, 12 rounds 135 s; still the suite's slowest test.)
ROUNDS = 9
PARTITIONS = 12
# A clean stop: the controlled shutdown (seconds at most), the logs closed, the lease revoked.
BROKER_EXIT_S_MAX = 15.0


def _keep_producing(address: str, stop: threading.Event, written: list[int]) -> None:
    """Writes to every partition while the brokers stop: followers then have data to append
    while they close, which is where a fetcher left running met a closed log."""
    gw = gateway_stub(address)
    n = 0
    while not stop.is_set():
        with contextlib.suppress(Exception):  # the brokers are going away: failures are expected
            if (
                produce(
                    gw, "all-stop", n % PARTITIONS, [b"x" * 200] * 20, acks=1, timeout_ms=2_000
                ).error_code
                == 0
            ):
                written[0] += 1
        n += 1


def test_stopping_every_broker_at_once_exits_cleanly_nine_times(make_cluster):
    c = make_cluster(brokers=3)
    gw = gateway_stub(c.gateway_address)
    assert (
        create_topic(gw, "all-stop", partitions=PARTITIONS, configs={"min.insync.replicas": "2"}).error_code
        == 0
    )
    exits: list[list[int | None]] = []
    for round_ in range(ROUNDS):
        for p in range(PARTITIONS):
            wait_for(
                lambda p=p: len(describe_partition(gw, "all-stop", p).isr) == 3,
                timeout_s=30,
                what=f"a full ISR of all-stop-{p} before round {round_}",
            )
        resp = produce(gw, "all-stop", round_ % PARTITIONS, [f"round-{round_}".encode()])
        assert resp.error_code == 0, resp.error_message
        brokers = [c.processes[f"broker-{b}"] for b in c.broker_ids]
        stop = threading.Event()
        written = [0]
        loader = threading.Thread(
            target=_keep_producing, args=(c.gateway_address, stop, written), daemon=True
        )
        loader.start()
        wait_for(lambda w=written: w[0] >= 2 * PARTITIONS, timeout_s=30, what="writes to every partition")
        for proc in brokers:
            assert proc.proc is not None
            proc.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        codes: list[int | None] = []
        for proc in brokers:
            assert proc.proc is not None
            try:
                codes.append(
                    proc.proc.wait(timeout=max(BROKER_EXIT_S_MAX - (time.monotonic() - started), 0.1))
                )
            except subprocess.TimeoutExpired:
                codes.append(None)
                proc.proc.kill()
                proc.proc.wait(timeout=BROKER_EXIT_S_MAX)
        stop.set()
        loader.join(timeout=30)
        exits.append(codes)
        assert codes == [0, 0, 0], (
            f"round {round_}: broker exit codes {codes} (None: still running after {BROKER_EXIT_S_MAX} s)\n"
            + "\n".join(f"--- {p.name}\n{p.log_tail()}" for p in brokers)
        )
        for proc in brokers:
            assert "invariant broken" not in proc.log_path.read_text(errors="replace"), proc.log_tail()
        for b in c.broker_ids:
            c.start_broker(b)
    assert len(exits) == ROUNDS


# Partitions led by the stopping broker: many, but few enough for this small test machine.
LED_PARTITIONS = 300
# From the controller's answer "no partitions led here any more" to the process's exit: closing
# 300 logs takes ~0.1 s on an idle disk (0.6-3 s one by one before issue 24); loose, for a shared
# 2-core machine. bench/failover.py measures the figure itself (target 0.5 s for 1,000).
EXIT_AFTER_LAST_LEADERSHIP_S_MAX = 1.0
# Creating 300 partitions, moving their leaderships, reopening their logs.
SETUP_S_MAX = 120.0
_LOG_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _stamp_of(log_text: str, needle: str) -> float | None:
    """Wall-clock time of the last broker log line containing `needle`."""
    found = None
    for line in log_text.splitlines():
        match = _LOG_STAMP.match(line)
        if match and needle in line:
            found = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return found


def test_a_broker_leading_many_partitions_exits_soon_after_its_last_leadership_moves(make_cluster):
    c = make_cluster(brokers=3)
    gw = gateway_stub(c.gateway_address)
    resp = gw.CreateTopics(
        common_pb2.CreateTopicsRequest(
            topics=[
                common_pb2.CreatableTopic(
                    name="led",
                    num_partitions=-1,
                    replication_factor=-1,
                    assignments={p: common_pb2.ReplicaList(replicas=[1, 2]) for p in range(LED_PARTITIONS)},
                )
            ],
            timeout_ms=int(SETUP_S_MAX * 1000),
        ),
        timeout=SETUP_S_MAX,
    )
    assert resp.topics[0].error_code == 0, resp.topics[0].error_message
    # One write per partition: every log has data and a leader epoch entry to make durable.
    for p in range(LED_PARTITIONS):
        wait_for(
            lambda p=p: produce(gw, "led", p, [b"before-%d" % p], acks=1).error_code == 0,
            timeout_s=SETUP_S_MAX,
            what=f"a write to led-{p}",
        )
    broker = c.processes["broker-1"]
    assert broker.proc is not None
    data_dir = c.base_dir / "broker-1"
    partition_dirs = [data_dir / f"led-{p}" for p in range(LED_PARTITIONS)]

    exited_at: list[float] = []
    waiter = threading.Thread(
        target=lambda: (broker.proc.wait(), exited_at.append(time.time())),  # type: ignore[union-attr]
        daemon=True,
    )
    waiter.start()
    broker.proc.send_signal(signal.SIGTERM)
    waiter.join(timeout=SETUP_S_MAX)
    if not exited_at:
        broker.proc.kill()
        broker.proc.wait(timeout=30)
        raise AssertionError(f"broker 1 still running {SETUP_S_MAX} s after SIGTERM\n{broker.log_tail()}")
    assert broker.proc.returncode == 0, broker.log_tail()
    text = broker.log_path.read_text(errors="replace")
    moved_at = _stamp_of(text, "controlled shutdown done: no partitions led here any more")
    assert moved_at is not None, f"the controlled shutdown did not move every leadership\n{broker.log_tail()}"
    closed = re.findall(r"closed (\d+) logs in ([0-9.]+) s", text)
    assert closed and int(closed[-1][0]) == LED_PARTITIONS, broker.log_tail()
    exit_after_last_leadership_s = exited_at[0] - moved_at
    print(
        f"{LED_PARTITIONS} partitions: logs closed in {closed[-1][1]} s, exit "
        f"{exit_after_last_leadership_s:.3f} s after the last leadership moved"
    )
    assert exit_after_last_leadership_s < EXIT_AFTER_LAST_LEADERSHIP_S_MAX, broker.log_tail()

    # What the next start relies on, on disk: a clean run, every log marked, nothing staged left.
    assert json.loads((data_dir / RUN_MARKER_FILE).read_text())["clean"] is True
    unmarked = [d.name for d in partition_dirs if not (d / CLEAN_SHUTDOWN_MARKER).exists()]
    assert not unmarked, f"logs without a clean-shutdown marker: {unmarked[:10]}"
    assert not (data_dir / CLOSE_STAGING_DIR).exists()

    log_size = broker.log_path.stat().st_size
    c.start_broker(1)
    # Each log opens (and removes its marker) when a LeaderAndIsr names it.
    wait_for(
        lambda: not any((d / CLEAN_SHUTDOWN_MARKER).exists() for d in partition_dirs),
        timeout_s=SETUP_S_MAX,
        what="broker 1 to reopen every log",
    )
    with broker.log_path.open("rb") as f:
        f.seek(log_size)
        after_restart = f.read().decode(errors="replace")
    assert ": recovered " not in after_restart and "dropped" not in after_restart, after_restart[-3000:]
    assert "did not stop cleanly" not in after_restart
    for p in (0, LED_PARTITIONS - 1):
        assert wait_for(
            lambda p=p: 1 in describe_partition(gw, "led", p).isr,
            timeout_s=SETUP_S_MAX,
            what=f"broker 1 back in the ISR of led-{p}",
        )
