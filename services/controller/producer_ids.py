"""Producer ids for InitProducerId, reserved in etcd a block at a time so that two
controllers (one fenced, one new) never hand out the same id: the block's end is written
with a compare on the key's last revision, fenced by the controller epoch."""

from __future__ import annotations

from coordinator import values
from coordinator.election import fenced_txn
from coordinator.store import EtcdStore, Get, Put, compare_missing, compare_mod_revision

# Producer ids reserved in etcd at a time: one etcd transaction per this many InitProducerId calls.
PRODUCER_ID_BLOCK_IDS = 1000
# Attempts at the reservation when another writer keeps winning the compare.
PRODUCER_ID_BLOCK_ATTEMPTS_MAX = 10


async def reserve_block(store: EtcdStore, epoch: int) -> tuple[int, int]:
    """Reserve the next block of producer ids: [start, end). Raises ControllerFenced when the
    epoch moved on, RuntimeError when the compare kept failing."""
    key = store.keys.producer_id_block
    for _ in range(PRODUCER_ID_BLOCK_ATTEMPTS_MAX):
        kv = await store.get(key)
        start = values.decode_producer_id_block(kv.value) if kv is not None else 0
        compare = compare_mod_revision(key, kv.mod_revision) if kv is not None else compare_missing(key)
        txn = await fenced_txn(
            store,
            epoch,
            [compare],
            [Put(key, values.encode_producer_id_block(start + PRODUCER_ID_BLOCK_IDS)), Get(key)],
        )
        if txn.succeeded:
            return start, start + PRODUCER_ID_BLOCK_IDS
    raise RuntimeError("could not reserve a producer id block in etcd (contention)")
