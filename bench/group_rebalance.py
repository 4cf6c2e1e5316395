"""Consumer group rebalance times (issue 19) on a real local cluster.

For 1, 10 and 100 members of one group over a topic of 1,000 partitions (defaults), each
member an asyncio task speaking ConsumerGroupHeartbeat to the gateway as our Consumer does
(it reports owning exactly what the last answer gave it, so revoking and taking cost
nothing here and the figures are the coordinator's):

- join: all members start at once; the time until every partition is owned by exactly one
  member and the counts differ by at most one;
- clean leave: one member leaves (epoch -1); the time until its partitions are owned again;
- crash: one member stops heartbeating; the time until its partitions are owned again, and
  that time minus the session timeout (the detection the session timeout buys).

Kafka's published figure for KIP-848 (librdkafka's documentation of the new protocol): a
group of 10 consumers adding 900 partitions completes its rebalance in 5 s, against 103 s
with the classic protocol. The join figure for 10 members here is the same kind of event
(900 -> 1,000 partitions assigned from nothing), and the script prints its ratio to 5 s.

Writes bench/results/group_rebalance.json. Usage: python bench/group_rebalance.py --help
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/group_rebalance.py` anywhere

from bench import common
from protos.highwater.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from services.launcher.local_cluster import LocalCluster

TOPIC = "rebalance"
GROUP = "bench"
KAFKA_KIP848_10_MEMBERS_S = 5.0  # 10 consumers, 900 partitions: 5 s (classic protocol: 103 s)
SETTLE_TIMEOUT_S = 120.0
POLL_S = 0.005


@dataclass
class Member:
    name: str
    owned: frozenset[tuple[str, int]] = frozenset()
    member_id: str = ""
    crashed: bool = False
    leaving: bool = False
    left: bool = False
    task: asyncio.Task[None] | None = None
    errors: list[str] = field(default_factory=list)


class Group:
    def __init__(self, stub: gateway_pb2_grpc.GatewayServiceStub, partitions: int, session_ms: int) -> None:
        self.stub = stub
        self.partitions = partitions
        self.session_ms = session_ms
        self.members: list[Member] = []

    def start(self, count: int) -> None:
        for _ in range(count):
            m = Member(f"m{len(self.members)}")
            m.task = asyncio.create_task(self._run(m))
            self.members.append(m)

    async def _run(self, m: Member) -> None:
        member_id, epoch = "", 0
        while not m.crashed:
            if m.leaving:
                await self.stub.ConsumerGroupHeartbeat(
                    gateway_pb2.ConsumerGroupHeartbeatRequest(
                        group_id=GROUP, member_id=member_id, member_epoch=-1, subscription_unchanged=True
                    )
                )
                m.owned, m.left = frozenset(), True
                return
            request = gateway_pb2.ConsumerGroupHeartbeatRequest(
                group_id=GROUP,
                member_id=member_id,
                member_epoch=epoch,
                subscribed_topics=[TOPIC],
                subscription_unchanged=epoch > 0,
                owned=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(m.owned)],
                session_timeout_ms=self.session_ms,
                client_id="bench",
            )
            try:
                response = await self.stub.ConsumerGroupHeartbeat(request, timeout=30)
            except grpc.aio.AioRpcError as exc:
                m.errors.append(str(exc.code()))
                await asyncio.sleep(0.1)
                continue
            if response.error_code != common_pb2.NONE:
                m.errors.append(common_pb2.ErrorCode.Name(response.error_code))
                if response.error_code in (common_pb2.UNKNOWN_MEMBER_ID, common_pb2.FENCED_MEMBER_EPOCH):
                    member_id, epoch, m.owned = "", 0, frozenset()
                else:
                    await asyncio.sleep(0.05)
                continue
            member_id, epoch = response.member_id, response.member_epoch
            m.member_id = member_id
            # Revoke and take at once: the figures are the coordinator's, not an app's.
            m.owned = frozenset((p.topic, p.partition) for p in response.assignment)

    async def leave(self, m: Member) -> None:
        """As Consumer.close(): stop heartbeating and send the leave at once."""
        m.leaving = True
        assert m.task is not None
        m.task.cancel()
        await asyncio.gather(m.task, return_exceptions=True)
        await self.stub.ConsumerGroupHeartbeat(
            gateway_pb2.ConsumerGroupHeartbeatRequest(
                group_id=GROUP, member_id=m.member_id, member_epoch=-1, subscription_unchanged=True
            )
        )
        m.owned, m.left = frozenset(), True

    def live(self) -> list[Member]:
        return [m for m in self.members if not m.crashed and not m.left and not m.leaving]

    def settled(self) -> bool:
        live = self.live()
        if not live:
            return False
        counts = [len(m.owned) for m in live]
        union: set[tuple[str, int]] = set().union(*(m.owned for m in live))
        return sum(counts) == self.partitions == len(union) and max(counts) - min(counts) <= 1

    async def wait_settled(self, since: float) -> float:
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while not self.settled():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the group did not settle within {SETTLE_TIMEOUT_S} s")
            await asyncio.sleep(POLL_S)
        return time.monotonic() - since

    async def stop(self) -> None:
        for m in self.members:
            if m.task is not None and not m.task.done():
                m.leaving = True
        await asyncio.gather(*(m.task for m in self.members if m.task is not None), return_exceptions=True)


async def measure(address: str, partitions: int, members: int, session_ms: int, run: int) -> common.Result:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)  # type: ignore[no-untyped-call]  # generated, unannotated
        group = Group(stub, partitions, session_ms)
        global GROUP
        GROUP = f"bench-{members}-{run}"
        started = time.monotonic()
        group.start(members)
        out: common.Result = {
            "members": members,
            "partitions": partitions,
            "join_s": round(await group.wait_settled(started), 3),
        }
        if members > 1:
            leaver = group.live()[0]
            started = time.monotonic()
            await group.leave(leaver)
            out["clean_leave_s"] = round(await group.wait_settled(started), 3)
            victim = group.live()[0]
            started = time.monotonic()
            victim.crashed = True
            assert victim.task is not None
            victim.task.cancel()
            crash_s = await group.wait_settled(started)
            out["crash_s"] = round(crash_s, 3)
            out["crash_after_session_timeout_s"] = round(crash_s - session_ms / 1000, 3)
        await group.stop()
        out["errors"] = sorted({e for m in group.members for e in m.errors})
        return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--members", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--session-ms", type=int, default=3000, help="the members' session timeout")
    parser.add_argument("--repeat", type=int, default=3, help="runs per member count (median reported)")
    args = parser.parse_args()
    out: common.Result = {**common.header(), "session_timeout_ms": args.session_ms, "runs": []}
    with tempfile.TemporaryDirectory(prefix="hw-groups-") as tmp:
        cluster = LocalCluster(Path(tmp), brokers=1, lease_ttl_s=3)
        cluster.start()
        try:
            channel = grpc.insecure_channel(cluster.gateway_address)
            stub = gateway_pb2_grpc.GatewayServiceStub(channel)  # type: ignore[no-untyped-call]  # generated, unannotated
            resp = stub.CreateTopics(
                common.create_topics_request(
                    TOPIC, num_partitions=args.partitions, replication_factor=1, timeout_ms=120_000
                )
            )
            assert resp.topics[0].error_code == common_pb2.NONE, resp
            summary = []
            for members in args.members:
                runs = [
                    asyncio.run(
                        measure(cluster.gateway_address, args.partitions, members, args.session_ms, run)
                    )
                    for run in range(args.repeat)
                ]
                out["runs"].append(runs)
                median: dict[str, float] = {
                    key: sorted(float(r[key]) for r in runs)[len(runs) // 2]
                    for key in ("join_s", "clean_leave_s", "crash_s", "crash_after_session_timeout_s")
                    if key in runs[0]
                }
                summary.append({"members": members, **median})
                line = f"{members:>3} members, {args.partitions} partitions: join {median['join_s']} s"
                if "clean_leave_s" in median:
                    line += (
                        f", clean leave {median['clean_leave_s']} s, crash {median['crash_s']} s "
                        f"({median['crash_after_session_timeout_s']} s after the "
                        f"{args.session_ms} ms session)"
                    )
                if members == 10:
                    ratio = median["join_s"] / KAFKA_KIP848_10_MEMBERS_S
                    line += f"; Kafka KIP-848 (10 members, 900 partitions) 5 s: ratio {ratio:.3f}"
                print(line, flush=True)
            out["median"] = summary
        finally:
            cluster.stop()
    print(f"written to {common.write_result('group_rebalance', out)}")


if __name__ == "__main__":
    main()
