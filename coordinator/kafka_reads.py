"""The etcd reads a broker's Kafka listener makes (services/kafka/backend.py): where every
registered broker's Kafka listener is, and the cluster id. Read-only; the keys and value formats
are the ones registration and the controller write (keys.py, values.py)."""

from __future__ import annotations

from coordinator import values
from coordinator.store import MetadataStore


async def registered_brokers(store: MetadataStore) -> list[values.BrokerRegistration]:
    """Every live broker's registration (/brokers/ids/*), by broker id."""
    kvs, _ = await store.get_prefix(store.keys.brokers_prefix)
    return sorted((values.decode_broker_registration(kv.value) for kv in kvs), key=lambda r: r["broker_id"])


async def cluster_id(store: MetadataStore) -> str:
    """The cluster id the first controller wrote, or "" before it has."""
    kv = await store.get(store.keys.cluster_id)
    return values.decode_cluster_id(kv.value) if kv is not None else ""
