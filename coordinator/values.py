"""The byte formats of every value Highwater stores in etcd, as docs/ARCHITECTURE.md section 2 lists them.

Keys are spelled in keys.py; what is stored under them is spelled here and nowhere else,
so a format is changed (and kept readable for data already in etcd) in one place. Pure:
no etcd client, no I/O, so the simulation and unit tests use the same encodings.

The formats are not uniform, and must not be made so: values already in etcd have to
read back, and the controller compares some of them byte for byte. Registrations and
the controller key use `json_bytes` (sorted keys, compact); topic assignments,
partition states, consumer offsets and the producer id block use `json.dumps` with
its default separators, in the field order written here; topic configs sort their
keys; the controller epoch and the cluster id are plain text.

Decoders raise ValueError (bad JSON, bad number), KeyError (missing field) or
TypeError (wrong shape) on a malformed value; callers decide whether to skip it.

Format versions (docs/UPGRADING.md). The durable JSON objects that the controller and the
gateways write and read back across releases are read by version: topic assignments,
partition states, committed offsets and the producer id block. A value without a "version"
field is version 1, the format of 2026-11-23. Only topic assignments have always written
the field; the others write version 1 without it, so their bytes stay those every release
since 2026-11-23 wrote and reads (tests/unit/test_controller_values.py pins them), and a
later format will write "version": 2. A version this release does not know raises
UnknownFormatVersion, which is deliberately not a ValueError: a value from a newer release is
not damage to be skipped, and reading on would act on fields this code cannot see.
Registrations and the /controller value are not refused by version: they live under their
owner's lease, are rewritten at every start, and during a rolling upgrade the older and the
newer release read each other's, so they only ever gain fields that have defaults. The
plain-text values (controller epoch, cluster id) and the topic configs (a flat map, where
a "version" entry would read as a config) have no room for a version; their formats are
frozen.
"""

from __future__ import annotations

import json
from typing import Any, TypedDict

# The format versions of the versioned values this release reads (all of them version 1: the
# formats of 2026-11-23, unchanged since); this release writes the last one of each.
TOPIC_ASSIGNMENT_VERSIONS = (1,)
PARTITION_STATE_VERSIONS = (1,)
CONSUMER_OFFSET_VERSIONS = (1,)
PRODUCER_ID_BLOCK_VERSIONS = (1,)


class UnknownFormatVersion(Exception):
    """A stored value or file in a format version this release cannot read (a newer release wrote it).

    An operating error met at start-up or on reading; it names what was read, the version found,
    the versions this release reads, and what to do.
    """

    code = "UNKNOWN_FORMAT_VERSION"

    def __init__(self, what: str, found: object, readable: tuple[int, ...]) -> None:
        self.what = what
        self.found = found
        self.readable = readable
        super().__init__(
            f"{self.code}: {what} has format version {found!r}; this release reads version(s) "
            f"{', '.join(str(v) for v in readable)}. A newer release wrote it: run that release "
            "(or a later one) again; a rollback below the release that changed this format is not "
            "supported (docs/UPGRADING.md)"
        )


def checked_version(what: str, value: dict[str, Any], readable: tuple[int, ...]) -> int:
    """The "version" of a stored JSON object (1 when absent: written before versions existed).

    Raises UnknownFormatVersion for any other version than `readable` holds.
    """
    if not isinstance(value, dict):
        raise TypeError(f"{what} is not a JSON object")
    version = value.get("version", 1)
    if type(version) is not int or version not in readable:
        raise UnknownFormatVersion(what, version, readable)
    return version


def json_bytes(value: Any) -> bytes:
    """The JSON encoding every Highwater value in etcd uses (sorted keys, compact)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def from_json_bytes(data: bytes) -> Any:
    """Any JSON value, undecided shape (ACL bindings and token records: coordinator/acls.py)."""
    return json.loads(data)


# ---- registrations: /brokers/ids/{id}, /gateways/ids/{id} (under the owner's lease) ----------


class BrokerRegistration(TypedDict):
    broker_id: int
    host: str
    port: int
    rack: str
    metrics_port: int
    # True after a power loss: records the broker acknowledged but had not flushed may be gone.
    unclean_shutdown: bool
    # The broker's Kafka protocol listener (docs/KAFKA.md); 0: none (also what a registration
    # written before the field existed reads as).
    kafka_port: int
    # The replicas the broker is prepared to hold (its --replicas-max); 0: not stated (older
    # brokers), the cluster's default applies.
    replicas_max: int


class GatewayRegistration(TypedDict):
    gateway_id: int
    host: str
    port: int


def encode_registration(info: dict[str, Any]) -> bytes:
    """A broker's or gateway's registration value, as the process itself describes it."""
    return json_bytes(info)


def decode_broker_registration(raw: bytes) -> BrokerRegistration:
    d = json.loads(raw)
    return BrokerRegistration(
        broker_id=int(d["broker_id"]),
        host=str(d["host"]),
        port=int(d["port"]),
        rack=str(d.get("rack", "")),
        metrics_port=int(d.get("metrics_port", 0)),
        unclean_shutdown=d.get("unclean_shutdown") is True,
        kafka_port=int(d.get("kafka_port", 0)),
        replicas_max=int(d.get("replicas_max", 0)),
    )


def decode_gateway_registration(raw: bytes) -> GatewayRegistration:
    d = json.loads(raw)
    return GatewayRegistration(gateway_id=int(d["gateway_id"]), host=str(d["host"]), port=int(d["port"]))


def registration_address(raw: bytes) -> str:
    """ "host:port" of any registration value; raises like the decoders when it has none."""
    info = json.loads(raw)
    return f"{info['host']}:{info['port']}"


# ---- /controller (the active controller's lease) and /controller_epoch --------------------------


def encode_controller(value: dict[str, Any]) -> bytes:
    """{"controller_id", "epoch", "host", "port", ...}."""
    return json_bytes(value)


def decode_controller(raw: bytes) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(raw)
    return value


def encode_controller_epoch(epoch: int) -> bytes:
    """Plain decimal text: fenced transactions compare it byte for byte (election.fenced_txn)."""
    return str(epoch).encode()


def decode_controller_epoch(raw: bytes) -> int:
    return int(raw)


# ---- /brokers/topics/{topic} and its partition states --------------------------------------------


class TopicAssignment(TypedDict):
    topic_id: str
    partitions: dict[int, tuple[int, ...]]
    adding_replicas: dict[int, tuple[int, ...]]
    removing_replicas: dict[int, tuple[int, ...]]


def encode_topic_assignment(
    topic_id: str,
    partitions: dict[int, tuple[int, ...]],
    adding_replicas: dict[int, tuple[int, ...]],
    removing_replicas: dict[int, tuple[int, ...]],
) -> bytes:
    """{"version": 1, "topic_id", "partitions": {"0": [1, 2, 3]}, "adding_replicas", "removing_replicas"}."""
    return json.dumps(
        {
            "version": TOPIC_ASSIGNMENT_VERSIONS[-1],
            "topic_id": topic_id,
            "partitions": {str(p): list(r) for p, r in sorted(partitions.items())},
            "adding_replicas": {str(p): list(r) for p, r in sorted(adding_replicas.items())},
            "removing_replicas": {str(p): list(r) for p, r in sorted(removing_replicas.items())},
        }
    ).encode()


def decode_topic_assignment(raw: bytes) -> TopicAssignment:
    d = json.loads(raw)
    checked_version("topic assignment", d, TOPIC_ASSIGNMENT_VERSIONS)

    def parse(m: dict[str, list[int]]) -> dict[int, tuple[int, ...]]:
        return {int(p): tuple(int(x) for x in r) for p, r in m.items()}

    return TopicAssignment(
        topic_id=str(d["topic_id"]),
        partitions=parse(d["partitions"]),
        adding_replicas=parse(d.get("adding_replicas", {})),
        removing_replicas=parse(d.get("removing_replicas", {})),
    )


class PartitionStateValue(TypedDict):
    """The value only; the partition epoch is the key's etcd version, not stored in it."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int


def encode_partition_state(
    leader: int, leader_epoch: int, isr: tuple[int, ...], controller_epoch: int
) -> bytes:
    """{"leader", "leader_epoch", "isr", "controller_epoch"} (version 1: no "version" field)."""
    return json.dumps(
        {
            "leader": leader,
            "leader_epoch": leader_epoch,
            "isr": list(isr),
            "controller_epoch": controller_epoch,
        }
    ).encode()


def decode_partition_state(raw: bytes) -> PartitionStateValue:
    d = json.loads(raw)
    checked_version("partition state", d, PARTITION_STATE_VERSIONS)
    return PartitionStateValue(
        leader=int(d["leader"]),
        leader_epoch=int(d["leader_epoch"]),
        isr=tuple(int(x) for x in d["isr"]),
        controller_epoch=int(d["controller_epoch"]),
    )


# ---- /config/topics/{topic} and /admin/delete_topics/{topic} -------------------------------------


def encode_topic_configs(configs: dict[str, str]) -> bytes:
    """{"min.insync.replicas": "2", ...}: the topic's overrides only, sorted."""
    return json.dumps(configs, sort_keys=True).encode()


def decode_topic_configs(raw: bytes) -> dict[str, Any]:
    """Names as text; values as stored (clients.common.topics.stored_topic_configs checks them).

    AttributeError when the value is JSON but not an object.
    """
    stored = json.loads(raw)
    return {str(k): v for k, v in stored.items()}


# The value of a deletion mark: the key's presence is what matters.
DELETE_TOPIC_MARK = b"{}"


# ---- requests written by hand under /admin -------------------------------------------------------


def decode_reassignment_request(raw: bytes) -> list[tuple[str, int, list[int]]]:
    """Kafka's reassignment JSON: {"version": 1, "partitions": [{"topic", "partition", "replicas"}]}.

    Returns (topic, partition, target replicas) in the order written.
    """
    doc = json.loads(raw)
    out = []
    for item in doc["partitions"]:
        replicas = [int(r) for r in item["replicas"]]
        out.append((str(item["topic"]), int(item["partition"]), replicas))
    return out


def decode_preferred_election_request(raw: bytes) -> list[tuple[str, int]]:
    """{"partitions": [{"topic": "t", "partition": 0}]} (an empty list: every partition).

    AttributeError when the document is JSON but not an object.
    """
    doc = json.loads(raw)
    return [(str(p["topic"]), int(p["partition"])) for p in doc.get("partitions", [])]


# ---- /consumers/{group}/offsets/{topic}/{p} ------------------------------------------------------


class CommittedOffsetValue(TypedDict, total=False):
    offset: int
    metadata: str
    leader_epoch: int
    commit_time_ms: int


def encode_consumer_offset(offset: int, metadata: str, leader_epoch: int, commit_time_ms: int) -> bytes:
    return json.dumps(
        {
            "offset": offset,
            "metadata": metadata,
            "leader_epoch": leader_epoch,
            "commit_time_ms": commit_time_ms,
        }
    ).encode()


def decode_consumer_offset(raw: bytes) -> CommittedOffsetValue:
    """The stored object as written, without its version; older values may lack metadata or leader_epoch."""
    stored = json.loads(raw)
    checked_version("committed offset", stored, CONSUMER_OFFSET_VERSIONS)
    stored.pop("version", None)
    value: CommittedOffsetValue = stored
    return value


# ---- /producer_id_block and /cluster_id ----------------------------------------------------------


def encode_producer_id_block(next_free: int) -> bytes:
    """{"next": the first producer id no controller has reserved yet} (version 1: no "version" field)."""
    return json.dumps({"next": next_free}).encode()


def decode_producer_id_block(raw: bytes) -> int:
    d = json.loads(raw)
    checked_version("producer id block", d, PRODUCER_ID_BLOCK_VERSIONS)
    return int(d["next"])


def encode_cluster_id(cluster_id: str) -> bytes:
    return cluster_id.encode()


def decode_cluster_id(raw: bytes) -> str:
    return raw.decode()
