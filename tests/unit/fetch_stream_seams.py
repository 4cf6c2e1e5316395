"""What the FetchStream and ProduceStream tests share: a ReplicaManager stand-in behind the real
BrokerServicer, requests and answers that say which request they answer, in-process grpc.aio servers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc

from protos.highwater.v1 import broker_pb2, broker_pb2_grpc, common_pb2

TOPIC = "t"


def fetch_request(
    offset: int, *, replica_id: int = 2, topics: tuple[str, ...] = (TOPIC,)
) -> common_pb2.FetchRequest:
    return common_pb2.FetchRequest(
        replica_id=replica_id,
        max_wait_ms=0,
        topics=[
            common_pb2.FetchTopic(
                topic=name, partitions=[common_pb2.FetchPartition(partition=0, fetch_offset=offset)]
            )
            for name in topics
        ],
    )


def produce_request(partition: int, *, topics: tuple[str, ...] = (TOPIC,)) -> common_pb2.ProduceRequest:
    return common_pb2.ProduceRequest(
        acks=-1,
        timeout_ms=1_000,
        topics=[
            common_pb2.ProduceTopicData(
                topic=name, partitions=[common_pb2.ProducePartitionData(partition=partition, records=b"")]
            )
            for name in topics
        ],
    )


def produced(response: common_pb2.ProduceResponse) -> dict[str, tuple[int, int]]:
    """topic -> (error code, base offset) of its first partition: the echo's base offset is the partition."""
    return {t.topic: (t.partitions[0].error_code, t.partitions[0].base_offset) for t in response.topics}


def answered(response: common_pb2.FetchResponse) -> dict[str, tuple[int, int]]:
    """topic -> (error code, high watermark) of partition 0: the echo says which offset was asked."""
    return {t.topic: (t.partitions[0].error_code, t.partitions[0].high_watermark) for t in response.topics}


class EchoReplicas:
    """Answers each Fetch with its fetch offsets as high watermarks, after `delays[offset]` seconds;
    raises for an offset in `fail` (the stream then ends with UNKNOWN, as on a servicer bug)."""

    def __init__(self) -> None:
        self.seen: list[common_pb2.FetchRequest] = []
        self.produced: list[common_pb2.ProduceRequest] = []
        self.produce_delay_s = 0.0
        self.delays: dict[int, float] = {}
        self.fail: set[int] = set()

    async def fetch(self, req: common_pb2.FetchRequest) -> common_pb2.FetchResponse:
        self.seen.append(req)
        offset = req.topics[0].partitions[0].fetch_offset if req.topics else -1
        if offset in self.fail:
            raise RuntimeError(f"fetch of offset {offset} failed")
        delay = self.delays.get(offset, 0.0)
        if delay:
            await asyncio.sleep(delay)
        return common_pb2.FetchResponse(
            topics=[
                common_pb2.FetchTopicResponse(
                    topic=t.topic,
                    partitions=[
                        common_pb2.FetchPartitionResponse(
                            partition=p.partition, high_watermark=p.fetch_offset
                        )
                        for p in t.partitions
                    ],
                )
                for t in req.topics
            ]
        )

    async def produce(self, req: common_pb2.ProduceRequest) -> common_pb2.ProduceResponse:
        """Each partition answered with its own number as base offset (says which was asked)."""
        self.produced.append(req)
        if self.produce_delay_s:
            await asyncio.sleep(self.produce_delay_s)
        return common_pb2.ProduceResponse(
            topics=[
                common_pb2.ProduceTopicResponse(
                    topic=t.topic,
                    partitions=[
                        common_pb2.ProducePartitionResponse(partition=p.partition, base_offset=p.partition)
                        for p in t.partitions
                    ],
                )
                for t in req.topics
            ]
        )

    def offsets_for_leader_epoch(
        self, req: broker_pb2.OffsetsForLeaderEpochRequest
    ) -> broker_pb2.OffsetsForLeaderEpochResponse:
        return broker_pb2.OffsetsForLeaderEpochResponse()


def servicer(replicas: EchoReplicas, stream_ended: asyncio.Event | None = None) -> Any:
    """The real BrokerServicer on `replicas`; stream_ended is set whenever a FetchStream call ends."""
    from coordinator.memory_store import MemoryStore
    from services.broker.server import BrokerServicer

    class Servicer(BrokerServicer):
        async def FetchStream(
            self, request_iterator: AsyncIterator[common_pb2.FetchRequest], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[common_pb2.FetchResponse]:
            try:
                async for response in super().FetchStream(request_iterator, context):
                    yield response
            finally:
                if stream_ended is not None:
                    stream_ended.set()

    # A ReplicaManager stand-in; the store serves only transactional Produces, which these do not send.
    return Servicer(replicas, MemoryStore())  # type: ignore[arg-type]


def unary_fetch_only(replicas: EchoReplicas) -> grpc.GenericRpcHandler:
    """A broker from before FetchStream: BrokerService with a unary Fetch and nothing else."""

    async def fetch(request: common_pb2.FetchRequest, context: grpc.aio.ServicerContext) -> Any:
        return await replicas.fetch(request)

    return grpc.method_handlers_generic_handler(
        "highwater.v1.BrokerService",
        {
            "Fetch": grpc.unary_unary_rpc_method_handler(
                fetch,
                request_deserializer=common_pb2.FetchRequest.FromString,
                response_serializer=common_pb2.FetchResponse.SerializeToString,
            )
        },
    )


@asynccontextmanager
async def serving(
    handlers: Any, *, interceptors: list[Any] | None = None, port: int = 0
) -> AsyncIterator[tuple[grpc.aio.Server, int]]:
    """A plaintext in-process server on 127.0.0.1 (a servicer or a generic handler); stopped on exit."""
    server = grpc.aio.server(interceptors=interceptors)
    if isinstance(handlers, grpc.GenericRpcHandler):
        server.add_generic_rpc_handlers([handlers])
    else:
        broker_pb2_grpc.add_BrokerServiceServicer_to_server(handlers, server)  # type: ignore[no-untyped-call]
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        yield server, bound
    finally:
        await server.stop(None)
