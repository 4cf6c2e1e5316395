"""The etcd key layout of DESIGN.md section 2, under one prefix (default "/highwater").

Every etcd key the project reads or writes is spelled here and nowhere else.

Two traps of a flat key space, which the helpers below keep callers out of:

- Partition state keys live *under* their topic's key
  (`.../brokers/topics/{topic}/partitions/{p}/state`), so a prefix read of
  `topics_prefix` returns both kinds: sort them with `classify_topic_key`.
- A prefix read of a key also matches longer keys that start with it:
  `controller` is a prefix of `controller_epoch`, and `topic("a")` of
  `topic("ab")`. Read single keys with get(), and a topic's partitions with
  `topic_partitions_prefix`, which ends in "/".

Names of topics and consumer groups must be non-empty and free of "/"; a name
that breaks the layout raises ValueError (a programmer error: topic names are
validated with INVALID_TOPIC before they get here).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import quote, unquote

DEFAULT_PREFIX = "/highwater"

TopicKeyKind = tuple[Literal["topic"], str] | tuple[Literal["partition_state"], str, int]


def _check_name(kind: str, name: str) -> str:
    if not name or "/" in name:
        raise ValueError(
            f"{kind} name {name!r} cannot be used in an etcd key: it must be non-empty and contain no '/'"
        )
    return name


def _check_id(kind: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{kind} must be a non-negative int, got {value!r}")
    return value


class Keys:
    """Key names under one prefix. Immutable; cheap to share."""

    __slots__ = (
        "brokers_prefix",
        "cluster_id",
        "config_prefix",
        "consumers_prefix",
        "controller",
        "controller_epoch",
        "delete_topics_prefix",
        "gateways_prefix",
        "preferred_replica_election",
        "prefix",
        "producer_id_block",
        "reassign_partitions",
        "topics_prefix",
        "transactions_prefix",
    )

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        if not prefix.startswith("/") or prefix.rstrip("/") == "":
            raise ValueError(f"key prefix must start with '/' and name something, got {prefix!r}")
        p = prefix.rstrip("/")
        self.prefix = p
        self.brokers_prefix = f"{p}/brokers/ids/"
        self.gateways_prefix = f"{p}/gateways/ids/"
        self.controller = f"{p}/controller"
        self.controller_epoch = f"{p}/controller_epoch"
        self.topics_prefix = f"{p}/brokers/topics/"
        # Only topic configs exist (DESIGN.md: /config/topics/{topic}).
        self.config_prefix = f"{p}/config/topics/"
        self.delete_topics_prefix = f"{p}/admin/delete_topics/"
        self.reassign_partitions = f"{p}/admin/reassign_partitions"
        self.preferred_replica_election = f"{p}/admin/preferred_replica_election"
        self.consumers_prefix = f"{p}/consumers/"
        self.producer_id_block = f"{p}/producer_id_block"
        # A uuid written once by the first controller; clients see it in DescribeCluster.
        self.cluster_id = f"{p}/cluster_id"
        # The transaction coordinator's state, one value per transactional id (issue 41).
        self.transactions_prefix = f"{p}/transactions/"

    # --- registrations ------------------------------------------------------------

    def broker(self, broker_id: int) -> str:
        return f"{self.brokers_prefix}{_check_id('broker id', broker_id)}"

    def gateway(self, gateway_id: int) -> str:
        return f"{self.gateways_prefix}{_check_id('gateway id', gateway_id)}"

    def parse_broker_id(self, key: str) -> int:
        """The broker id of a `/brokers/ids/{id}` key; ValueError for any other key."""
        return self._parse_id(key, self.brokers_prefix, "broker")

    def parse_gateway_id(self, key: str) -> int:
        """The gateway id of a `/gateways/ids/{id}` key; ValueError for any other key."""
        return self._parse_id(key, self.gateways_prefix, "gateway")

    @staticmethod
    def _parse_id(key: str, prefix: str, kind: str) -> int:
        rest = key[len(prefix) :] if key.startswith(prefix) else ""
        if not rest.isdigit() or not rest.isascii():
            raise ValueError(f"{key!r} is not a {kind} registration key (expected {prefix}<id>)")
        return int(rest)

    # --- topics -------------------------------------------------------------------

    def topic(self, name: str) -> str:
        return f"{self.topics_prefix}{_check_name('topic', name)}"

    def topic_partitions_prefix(self, name: str) -> str:
        """Prefix of all partition state keys of one topic (ends in '/': no other topic matches)."""
        return f"{self.topic(name)}/partitions/"

    def partition_state(self, topic: str, partition: int) -> str:
        return f"{self.topic_partitions_prefix(topic)}{_check_id('partition', partition)}/state"

    def classify_topic_key(self, key: str) -> TopicKeyKind | None:
        """Sort a key read under `topics_prefix`.

        Returns ("topic", name) for `/brokers/topics/{name}`,
        ("partition_state", name, p) for `/brokers/topics/{name}/partitions/{p}/state`,
        and None for anything else (a key this version does not know).
        """
        if not key.startswith(self.topics_prefix):
            return None
        parts = key[len(self.topics_prefix) :].split("/")
        if len(parts) == 1 and parts[0]:
            return ("topic", parts[0])
        if (
            len(parts) == 4
            and parts[0]
            and parts[1] == "partitions"
            and parts[2].isdigit()
            and parts[2].isascii()
            and parts[3] == "state"
        ):
            return ("partition_state", parts[0], int(parts[2]))
        return None

    def topic_config(self, name: str) -> str:
        return f"{self.config_prefix}{_check_name('topic', name)}"

    def delete_topic(self, name: str) -> str:
        return f"{self.delete_topics_prefix}{_check_name('topic', name)}"

    def parse_topic_name(self, key: str, prefix: str) -> str:
        """The topic name of a `{prefix}{topic}` key (prefix: config_prefix or delete_topics_prefix)."""
        rest = key[len(prefix) :] if key.startswith(prefix) else ""
        if not rest or "/" in rest:
            raise ValueError(f"{key!r} is not a topic key under {prefix}")
        return rest

    # --- consumer offsets ---------------------------------------------------------

    def consumer_group_prefix(self, group: str) -> str:
        """Prefix of one group's keys (ends in '/': no other group matches)."""
        return f"{self.consumers_prefix}{_check_name('consumer group', group)}/"

    def consumer_offset(self, group: str, topic: str, partition: int) -> str:
        return (
            f"{self.consumer_group_prefix(group)}offsets/{_check_name('topic', topic)}/"
            f"{_check_id('partition', partition)}"
        )

    # --- consumer groups (services/groups; the gateway's group service) ------------------

    def consumer_group_state(self, group: str) -> str:
        """The group's coordinator state (members, epochs, target assignment) as one JSON value,
        changed only by compare-and-swap on its mod revision."""
        return f"{self.consumer_group_prefix(group)}state"

    def consumer_group_members_prefix(self, group: str) -> str:
        return f"{self.consumer_group_prefix(group)}members/"

    def consumer_group_member(self, group: str, member_id: str) -> str:
        """A member's liveness key, attached to a lease of the member's session timeout: it
        disappears when the member stops heartbeating (the ZooKeeper-era consumers' ephemeral
        node)."""
        return f"{self.consumer_group_members_prefix(group)}{_check_name('member id', member_id)}"

    def parse_consumer_group_key(self, key: str) -> tuple[str, str, str] | None:
        """(group, kind, rest) of any key under a group: kind is "state", "members" (rest: the
        member id) or "offsets" (rest: topic/partition); None for other keys."""
        if not key.startswith(self.consumers_prefix):
            return None
        group, _, tail = key[len(self.consumers_prefix) :].partition("/")
        kind, _, rest = tail.partition("/")
        if not group or kind not in ("state", "members", "offsets"):
            return None
        return (group, kind, rest)

    def parse_consumer_offset(self, key: str) -> tuple[str, str, int] | None:
        """(group, topic, partition) of a consumer offset key, or None for any other key."""
        if not key.startswith(self.consumers_prefix):
            return None
        parts = key[len(self.consumers_prefix) :].split("/")
        if (
            len(parts) == 4
            and parts[0]
            and parts[1] == "offsets"
            and parts[2]
            and parts[3].isdigit()
            and parts[3].isascii()
        ):
            return (parts[0], parts[2], int(parts[3]))
        return None

    # --- transactions (services/transactions; coordinator/transactions.py) ------------------

    def transaction_state(self, transactional_id: str) -> str:
        """One transactional id's coordinator state, changed only by compare-and-swap on its mod
        revision. Kafka allows any text in a transactional id, "/" included, so the id is
        percent-encoded into one key segment (`parse_transaction_key` reverses it)."""
        if not transactional_id:
            raise ValueError("a transactional id must be non-empty to be used in an etcd key")
        return f"{self.transactions_prefix}{quote(transactional_id, safe='')}"

    def parse_transaction_key(self, key: str) -> str | None:
        """The transactional id of a `transaction_state` key, or None for any other key."""
        rest = key[len(self.transactions_prefix) :] if key.startswith(self.transactions_prefix) else ""
        if not rest or "/" in rest:
            return None
        return unquote(rest)

    def __repr__(self) -> str:
        return f"Keys({self.prefix!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Keys) and other.prefix == self.prefix

    def __hash__(self) -> int:
        return hash(self.prefix)
