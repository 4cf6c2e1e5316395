"""One consumer-group member as its own process, for tests/integration/test_consumer_groups.py.

    python -m tests.integration.group_member_process BOOTSTRAP TOPIC GROUP HISTORY SESSION_MS

Reads TOPIC as a member of GROUP with an AsyncConsumer and writes what it does to HISTORY,
one JSON line per event, flushed at once (tests/integration/group_history.py lists them):
partitions assigned, revoked (after committing them) and lost, every record processed,
every commit and every refused commit. A member stopped for longer than its session commits
its last committed offsets again when it wakes (a zombie's commit, which must be refused).
SIGTERM closes the consumer cleanly (commit, leave).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from typing import Any, TextIO

from clients import AsyncConsumer, HighwaterError, TopicPartition

POLL_MS = 200


def main() -> None:
    bootstrap, topic, group, history_path, session_ms = sys.argv[1:6]
    with open(history_path, "a", buffering=1) as history:
        asyncio.run(run(bootstrap, topic, group, history, int(session_ms)))


def write(history: TextIO, **event: Any) -> None:
    history.write(json.dumps({"t": int(time.time() * 1000), **event}) + "\n")


def tps(partitions: list[TopicPartition]) -> list[list[Any]]:
    return [[tp.topic, tp.partition] for tp in sorted(partitions)]


async def run(bootstrap: str, topic: str, group: str, history: TextIO, session_ms: int) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    consumer = AsyncConsumer(
        bootstrap=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=session_ms,
    )

    last_committed: dict[TopicPartition, int] = {}

    async def commit(
        partitions: list[TopicPartition] | None = None, *, offsets: dict[TopicPartition, int] | None = None
    ) -> None:
        assigned = consumer.assignment()
        wanted = offsets or {
            tp: await consumer.position(tp) for tp in (partitions or assigned) if tp in assigned
        }
        if not wanted:
            return
        listed = [[tp.topic, tp.partition, o] for tp, o in sorted(wanted.items())]
        # When the commit was sent: one sent just before a SIGSTOP may be accepted while the
        # member is still live and only logged after SIGCONT; the checker judges by this time.
        sent_ms = int(time.time() * 1000)
        try:
            await consumer.commit(wanted)
        except HighwaterError as error:
            write(history, ev="commit_refused", error=error.code_name(), offsets=listed)
            return
        last_committed.update(wanted)
        write(history, ev="commit", sent=sent_ms, offsets=listed)

    async def revoked(partitions: list[TopicPartition]) -> None:
        await commit(partitions)
        write(history, ev="revoked", tps=tps(partitions))

    consumer.subscribe(
        [topic],
        on_partitions_assigned=lambda p: write(
            history, ev="assigned", epoch=consumer.member_epoch, tps=tps(p)
        ),
        on_partitions_revoked=revoked,
        on_partitions_lost=lambda p: write(history, ev="lost", tps=tps(p)),
    )
    try:
        while not stop.is_set():
            polled_at = time.monotonic()
            records = await consumer.poll(POLL_MS)
            if last_committed and time.monotonic() - polled_at > session_ms / 1000:
                # Stopped (SIGSTOP) for longer than the session: a zombie that wakes up and, as an
                # application after a long pause would, commits the progress it last made. Its
                # group has moved on, so the commit must be refused, whichever of its poll and
                # its heartbeat learned of that first.
                await commit(offsets=dict(last_committed))
            for r in records:
                write(
                    history, ev="record", tp=[r.topic, r.partition], offset=r.offset, value=r.value.decode()
                )
            if records:
                await commit()
    finally:
        await consumer.close()
        write(history, ev="closed")


if __name__ == "__main__":
    main()
