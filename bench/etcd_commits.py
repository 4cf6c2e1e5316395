"""How many offset commits a second etcd sustains (issue 43): every commit of a group is
one etcd transaction (coordinator/consumer_offsets.commit_changed: a read of the group's
offsets, then one write of those that changed), so etcd's write rate bounds the cluster's
commit rate.

Starts its own etcd (as `highwater cluster up` does: periodic compaction, 5 minutes) in a
temporary directory, then for groups of 1, 10 and 100 partitions runs `--seconds` of
commits from `--groups` concurrent committers (one group each, every commit moving every
offset, so every commit writes), and one run where nothing moved (every commit skipped).
Prints commits/s, offsets/s, etcd revisions used and etcd's database growth.

    .venv/bin/python bench/etcd_commits.py [--seconds 10] [--groups 1,16]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/etcd_commits.py` from anywhere

from coordinator import consumer_offsets
from coordinator.etcd_server import EtcdServer
from coordinator.store import EtcdStore

PARTITIONS = (1, 10, 100)


async def _committer(store: EtcdStore, group: str, partitions: int, until: float, moving: bool) -> int:
    commits = 0
    offset = 1  # idle: the offset the warm-up commit stored
    while time.monotonic() < until:
        if moving:
            offset += 1
        batch = [("orders", p, offset, "", 0) for p in range(partitions)]
        if not await consumer_offsets.commit_if_state_unchanged(
            store, group, 0, batch, int(time.time() * 1000)
        ):
            raise AssertionError(f"group {group}: the commit was refused")
        commits += 1
    return commits


async def _run(store: EtcdStore, partitions: int, groups: int, seconds: float, moving: bool) -> None:
    tag = f"p{partitions}-g{groups}-{'moving' if moving else 'idle'}"
    names = [f"bench-{tag}-{g}" for g in range(groups)]
    if not moving:  # a first commit, so that the timed ones find their offsets stored
        for name in names:
            batch = [("orders", p, 1, "", 0) for p in range(partitions)]
            await consumer_offsets.commit_if_state_unchanged(store, name, 0, batch, 0)
    before = await store.status()
    until = time.monotonic() + seconds
    started = time.monotonic()
    counts = await asyncio.gather(*(_committer(store, n, partitions, until, moving) for n in names))
    elapsed = time.monotonic() - started
    after = await store.status()
    commits = sum(counts)
    print(
        f"{partitions:>4} partitions  {groups:>3} groups  {'moving' if moving else 'idle  '}  "
        f"{commits / elapsed:>9,.0f} commits/s  {commits * partitions / elapsed:>10,.0f} offsets/s  "
        f"{(after.revision - before.revision) / max(commits, 1):.2f} revisions/commit  "
        f"db {before.db_size_bytes / 2**20:.1f} -> {after.db_size_bytes / 2**20:.1f} MiB",
        flush=True,
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each run")
    parser.add_argument("--groups", default="1,16", help="concurrent committing groups, comma-separated")
    args = parser.parse_args()
    group_counts = [int(g) for g in args.groups.split(",")]
    with tempfile.TemporaryDirectory(prefix="hw-etcd-bench-") as tmp:
        server = EtcdServer(Path(tmp) / "data", log_path=Path(tmp) / "etcd.log", name="highwater-bench")
        server.start()
        try:
            store = await EtcdStore.connect(server.endpoint, prefix="/bench")
            try:
                for partitions in PARTITIONS:
                    for groups in group_counts:
                        await _run(store, partitions, groups, args.seconds, moving=True)
                    await _run(store, partitions, group_counts[-1], args.seconds, moving=False)
            finally:
                await store.close()
        finally:
            server.stop()


if __name__ == "__main__":
    asyncio.run(main())
