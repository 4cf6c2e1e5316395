"""Every client setting in one place, with its unit in its name, its default and why.

Names follow Kafka's client configs (linger.ms -> linger_ms) so that a Kafka user
finds them; defaults are Kafka's unless a comment says otherwise. Each config
dataclass checks its values and the relations between them when it is built, so a
wrong setting fails at construction with InvalidArgument naming it, never later
in the middle of a send.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from clients.common import limits
from clients.common.topics import group_id_problem, topic_name_problem
from clients.errors import InvalidArgument

# --- connection --------------------------------------------------------------
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
# Kafka's request.timeout.ms: how long one RPC to a gateway may take once connected.
REQUEST_TIMEOUT_MS_DEFAULT = 30_000
# How long to look for a gateway that accepts a connection before GatewayUnavailable.
# Shorter than the request timeout so that a wrong address fails while a person waits.
CONNECT_TIMEOUT_MS_DEFAULT = 5_000
# Pause between two rounds over every gateway address (Kafka's reconnect.backoff.ms is 50).
RETRY_BACKOFF_MS_DEFAULT = 100
# Retries back off exponentially up to this (Kafka's retry.backoff.max.ms).
RETRY_BACKOFF_MAX_MS_DEFAULT = 1_000
# Kafka's metadata.max.age.ms: refresh the topic -> partitions cache at least this often,
# so new partitions are found without an error to trigger it.
METADATA_MAX_AGE_MS_DEFAULT = 300_000
# gRPC message bound, the same as the services' (a Produce or Fetch carries whole batches).
GRPC_MAX_MESSAGE_BYTES = limits.GRPC_MAX_MESSAGE_BYTES
# The channels' reconnect back-off and keep-alive are the transport's
# (clients/common/transport/channels.py): every client's channels are made there.

# --- producer ----------------------------------------------------------------
# Kafka's batch.size: a partition's batch is sent once it holds this many bytes.
BATCH_SIZE_BYTES_DEFAULT = limits.BATCH_SIZE_BYTES_DEFAULT
# Kafka 4.0's linger.ms default: a few milliseconds buys much fuller batches.
LINGER_MS_DEFAULT = 5
# Kafka's max.request.size; also the cap on one batch, which must fit the broker's
# max_message_bytes (1 MiB + the 12-byte log overhead).
MAX_REQUEST_BYTES_DEFAULT = 1024 * 1024
# The smallest max_request_bytes accepted: room for a batch header and a small record.
MAX_REQUEST_BYTES_MIN = 1024
# Kafka's buffer.memory: records waiting to be sent; send() blocks beyond it.
BUFFER_MEMORY_BYTES_DEFAULT = 32 * 1024 * 1024
# Kafka's max.block.ms: the longest send() waits for buffer space or topic metadata.
MAX_BLOCK_MS_DEFAULT = 60_000
# Kafka's delivery.timeout.ms: a record is delivered or failed within this of send().
DELIVERY_TIMEOUT_MS_DEFAULT = 120_000
# Kafka's max.in.flight.requests.per.connection: Produce requests in flight to one leader (or
# gateway), and with idempotence also batches of one partition (the leader orders them by
# sequence number); without idempotence a partition has one batch in flight, so order holds.
MAX_IN_FLIGHT_REQUESTS_DEFAULT = 5
# Batches of one partition in flight at most, whatever max_in_flight_requests says: a leader
# recognises a resent batch among the last five it appended per producer (the brokers'
# PRODUCER_BATCHES_KEPT); a sixth could be written twice. Kafka's producer has the same bound.
IDEMPOTENT_BATCHES_IN_FLIGHT_MAX = 5
# More concurrent Produce requests than this only queue up at the gateway.
MAX_IN_FLIGHT_REQUESTS_MAX = 100
ACKS_VALUES = {"all": -1, "-1": -1, "1": 1, "0": 0}
COMPRESSION_VALUES = ("none", "gzip", "snappy", "lz4", "zstd")
# Upper bound of the bytes a batch adds around its records (the 61-byte v2 header),
# and of what one record adds around its key, value and headers (varints and attributes).
BATCH_OVERHEAD_BYTES = 61
RECORD_OVERHEAD_BYTES_MAX = 36
HEADER_OVERHEAD_BYTES_MAX = 10

# --- consumer ----------------------------------------------------------------
AUTO_OFFSET_RESET_VALUES = ("earliest", "latest", "none")
# Kafka's isolation.level: read_uncommitted reads up to the high watermark; read_committed up to
# the last stable offset, without the records of aborted transactions. Kafka's default.
ISOLATION_LEVEL_VALUES = ("read_uncommitted", "read_committed")
# Kafka's fetch.max.wait.ms: how long a Fetch long-polls for fetch_min_bytes.
FETCH_MAX_WAIT_MS_DEFAULT = 500
# Kafka's fetch.min.bytes: a Fetch answers as soon as it has this much (1: any record).
FETCH_MIN_BYTES_DEFAULT = 1
# Kafka's fetch.max.bytes and max.partition.fetch.bytes: the bytes one Fetch answer may
# carry in all, and for one partition (a larger batch still comes back, alone).
FETCH_MAX_BYTES_DEFAULT = limits.FETCH_MAX_BYTES_DEFAULT
MAX_PARTITION_FETCH_BYTES_DEFAULT = limits.FETCH_PARTITION_MAX_BYTES_DEFAULT
# A Fetch answer must fit one gRPC message; 1 MiB is left for the per-partition fields.
FETCH_MAX_BYTES_MAX = GRPC_MAX_MESSAGE_BYTES - 1024 * 1024
# Kafka's max.poll.records: the most records one poll() returns.
MAX_POLL_RECORDS_DEFAULT = 500
# Kafka's auto.commit.interval.ms: how often positions are committed with enable_auto_commit.
AUTO_COMMIT_INTERVAL_MS_DEFAULT = 5_000
# Kafka's default.api.timeout.ms: how long commit() (without timeout_ms) retries retriable
# errors (no gateway, a timeout, the coordinator moving) before it raises.
DEFAULT_API_TIMEOUT_MS_DEFAULT = 60_000
# Kafka's consumer close() default: the final commit retries for at most this long.
CONSUMER_CLOSE_TIMEOUT_MS = 30_000
# poll(timeout_ms) returns within its timeout plus this: the calls it makes get this much
# past the timeout (so poll(0) can still fetch, and a Fetch long-polled for the remaining
# time is not cut off by the few ms its answer takes to arrive).
POLL_CALL_GRACE_MS = 50
# One CommitOffsets request carries at most this many offsets (one etcd transaction).
COMMIT_OFFSETS_PER_REQUEST_MAX = limits.COMMIT_OFFSETS_PER_REQUEST_MAX

# --- consumer groups (clients/group_member.py) ---------------------------------
# "consumer": subscribe() with a group id joins the group and reads the partitions its
# coordinator assigns (KIP-848); "none": reads every partition of the subscription, the
# group id only naming where offsets are committed.
GROUP_PROTOCOL_VALUES = ("consumer", "none")
# Kafka's session.timeout.ms: a member silent this long is removed and its partitions move.
SESSION_TIMEOUT_MS_DEFAULT = 10_000
SESSION_TIMEOUT_MS_MIN = 2_000
SESSION_TIMEOUT_MS_MAX = 300_000
# Kafka's max.poll.interval.ms, sent as the member's rebalance timeout: how long it may take
# to give up partitions (its poll loop's longest gap).
MAX_POLL_INTERVAL_MS_DEFAULT = 300_000
# Kafka's group.remote.assignor: the server assignor the member asks for (None: the group's).
GROUP_REMOTE_ASSIGNOR_VALUES = ("uniform", "range")

# --- topics ----------------------------------------------------------------
TOPIC_NAME_MAX_CHARS = limits.TOPIC_NAME_MAX_CHARS

# --- internal bounds (not settings) -------------------------------------------
# While the consumer still has to act on an assignment (poll() revokes and takes partitions),
# its member heartbeats at least this often, keeping its session alive.
GROUP_HEARTBEAT_WHILE_RECONCILING_MS = 500
# close() waits this long for the gateway to acknowledge the leave; else the session expires.
GROUP_LEAVE_TIMEOUT_MS = 5_000
# How long LoopThread.stop() waits for the loop thread to finish its last callbacks.
LOOP_STOP_WAIT_S = 5.0
# How long a producer's close() waits for the sender task to end once everything is settled.
SENDER_STOP_WAIT_S = 5.0
# How long Producer.close() waits for that shutdown (failing what is left, stopping the
# sender, closing the channels) on its loop thread: SENDER_STOP_WAIT_S plus room to spare.
CLOSE_SHUTDOWN_TIMEOUT_MS = 10_000
# How often a blocked flush() or send() checks that the producer is still alive.
FLUSH_CHECK_INTERVAL_S = 0.5
# A batch larger than a partition's fetch size: the next Fetch of that partition asks for
# this many times more (up to fetch_max_bytes), so a few rounds reach any batch size.
PARTITION_FETCH_BYTES_GROWTH_FACTOR = 2
# A record joins a batch (appended, or merged at drain) only if the batch is younger than this
# percentage of delivery_timeout_ms: a batch times out by its creation, so a record fails at
# most this much before its own delivery timeout (6 s of the default 120 s).
DELIVERY_TIMEOUT_SPREAD_PERCENT = 5
# The sender's timer for the next delivery timeout fires this much after it, so the batch
# is found expired on the first look (asyncio timers may fire a little early).
EXPIRY_TIMER_MARGIN_MS = 1
# The gRPC deadline of a Produce is the server-side timeout plus this, so the
# gateway's own REQUEST_TIMED_OUT answer arrives before our deadline cuts it off.
RPC_DEADLINE_MARGIN_MS = 2_000
# An idempotent Produce unanswered by its leader this long (a Fetch: this long past its max
# wait) starts asking Metadata whether the leadership moved (a paused or partitioned leader
# answers nothing until request_timeout_ms, 30 s by default; the controller moves its
# partitions after its lease, 6 s). Far above a healthy acks=all round trip (milliseconds),
# so a healthy cluster sees no extra Metadata.
LEADER_MOVE_CHECK_AFTER_MS = 1_000
# Then it asks again this often; once Metadata names another leader for one of the request's
# partitions, the request is abandoned and goes to the new leader (a Produce with the same
# sequence numbers: a batch the old leader had replicated is answered as a duplicate).
LEADER_MOVE_CHECK_INTERVAL_MS = 250
# A topic a gateway answers UNKNOWN_TOPIC_OR_PARTITION for is asked about again until this
# long after the first such answer, then send() raises it (topics are never created on
# first use). Twice the gateway's least interval between two pulls from the controller
# (50 ms, services/common/limits.py): a later answer comes from a pull made after the first
# question, so a topic that CreateTopics has just created is found, not refused.
UNKNOWN_TOPIC_CONFIRM_MS = 100
# At interpreter exit a Producer never closed is closed (atexit): what is queued gets this
# long to be delivered, then fails with ClientClosed (its callbacks run), so the program
# neither hangs on a cluster that is down nor drops records silently.
PRODUCER_CLOSE_AT_EXIT_TIMEOUT_MS = 5_000


def check_topic_name(topic: object) -> str:
    """Return `topic` if it is a legal topic name (Kafka's rules), else raise InvalidArgument."""
    return _checked_name("topic", topic, topic_name_problem)


def check_group_id(group_id: object) -> str:
    """Return `group_id` if it can name a consumer group, else raise InvalidArgument."""
    return _checked_name("group_id", group_id, group_id_problem)


def _checked_name(what: str, value: object, problem_of: Callable[[str], str | None]) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a str, got {type(value).__name__}")
    problem = problem_of(value)
    if problem is not None:
        raise InvalidArgument(problem)
    return value


def check_int(name: str, value: object, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return `value` if it is an int (not a bool) within [minimum, maximum], else raise InvalidArgument."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidArgument(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise InvalidArgument(f"{name} must be <= {maximum}, got {value}")
    return value


def _check_ranges(config: object, ranges: dict[str, tuple[int | None, int | None]]) -> None:
    """check_int on fields of `config`, in order: {field name: (minimum, maximum)}, None: no bound."""
    for name, (minimum, maximum) in ranges.items():
        check_int(name, getattr(config, name), minimum=minimum, maximum=maximum)


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise InvalidArgument(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


def normalize_acks(acks: object) -> int:
    """'all' / -1 / 1 / 0 (or their strings) -> the wire value -1, 1 or 0."""
    if isinstance(acks, int) and not isinstance(acks, bool) and acks in (-1, 0, 1):
        return acks
    if isinstance(acks, str) and acks.lower() in ACKS_VALUES:
        return ACKS_VALUES[acks.lower()]
    raise InvalidArgument(f"acks must be 'all', -1, 1 or 0; got {acks!r}")


@dataclass(frozen=True)
class ConnectionConfig:
    """How to reach the gateways; shared by producers, consumers and admins."""

    bootstrap: str | list[str] | tuple[str, ...] = DEFAULT_BOOTSTRAP
    request_timeout_ms: int = REQUEST_TIMEOUT_MS_DEFAULT
    connect_timeout_ms: int = CONNECT_TIMEOUT_MS_DEFAULT
    retry_backoff_ms: int = RETRY_BACKOFF_MS_DEFAULT
    retry_backoff_max_ms: int = RETRY_BACKOFF_MAX_MS_DEFAULT
    metadata_max_age_ms: int = METADATA_MAX_AGE_MS_DEFAULT
    # TLS (docs/SECURITY.md): the CA of the gateways' certificates (None: the system's roots),
    # an optional client certificate and key (principal User:<CN>), and an optional bearer
    # token from `highwater token create`. Any of them set turns TLS on.
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    auth_token: str | None = None
    # Produce (and the Consumer's Fetch) straight to each partition's leader broker, whose
    # address Metadata gives, as Kafka's clients do: a record crosses one process fewer.
    # False sends them through the gateways (for clients that can reach only a gateway).
    direct_to_leaders: bool = True

    def __post_init__(self) -> None:
        bootstrap: object = self.bootstrap  # checked at run time: callers may pass anything
        if not isinstance(bootstrap, (str, list, tuple)):
            raise InvalidArgument(
                f"bootstrap must be 'host:port,host:port' or a list, got {self.bootstrap!r}"
            )
        _check_ranges(
            self,
            {
                "request_timeout_ms": (1, None),
                "connect_timeout_ms": (1, None),
                "retry_backoff_ms": (0, None),
                "retry_backoff_max_ms": (self.retry_backoff_ms, None),
                "metadata_max_age_ms": (1, None),
            },
        )
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "auth_token"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidArgument(f"{name} must be a non-empty str or None, got {value!r}")
        if not isinstance(self.direct_to_leaders, bool):
            raise InvalidArgument(f"direct_to_leaders must be a bool, got {self.direct_to_leaders!r}")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise InvalidArgument("ssl_certfile and ssl_keyfile go together: give both or neither")


@dataclass(frozen=True)
class ProducerConfig(ConnectionConfig):
    """Producer settings (Kafka's names); see the constants above for why each default."""

    acks: int | str = "all"
    linger_ms: int = LINGER_MS_DEFAULT
    batch_size_bytes: int = BATCH_SIZE_BYTES_DEFAULT
    max_request_bytes: int = MAX_REQUEST_BYTES_DEFAULT
    buffer_memory_bytes: int = BUFFER_MEMORY_BYTES_DEFAULT
    max_block_ms: int = MAX_BLOCK_MS_DEFAULT
    delivery_timeout_ms: int = DELIVERY_TIMEOUT_MS_DEFAULT
    max_in_flight_requests: int = MAX_IN_FLIGHT_REQUESTS_DEFAULT
    compression: str = "none"
    enable_idempotence: bool = True
    # Transactions (docs/CLIENTS.md): set, the producer runs transactions under this id (Kafka's
    # transactional.id); a newer producer with the same id fences this one.
    transactional_id: str | None = None
    transaction_timeout_ms: int = limits.TRANSACTION_TIMEOUT_MS_DEFAULT

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "acks", normalize_acks(self.acks))
        if self.transactional_id is not None:
            if not isinstance(self.transactional_id, str) or not (
                0 < len(self.transactional_id) <= limits.TRANSACTIONAL_ID_MAX_CHARS
            ):
                raise InvalidArgument(
                    f"transactional_id must be 1..{limits.TRANSACTIONAL_ID_MAX_CHARS} characters, "
                    f"got {self.transactional_id!r}"
                )
            if self.enable_idempotence is not True:
                # Kafka's rule: a transaction's batches are idempotent ones.
                raise InvalidArgument("transactional_id needs enable_idempotence=True")
        check_int(
            "transaction_timeout_ms",
            self.transaction_timeout_ms,
            minimum=1,
            maximum=limits.TRANSACTION_TIMEOUT_MS_MAX,
        )
        _check_ranges(
            self,
            {
                "linger_ms": (0, None),
                "max_request_bytes": (MAX_REQUEST_BYTES_MIN, GRPC_MAX_MESSAGE_BYTES // 2),
                "batch_size_bytes": (1, self.max_request_bytes),
                "buffer_memory_bytes": (self.max_request_bytes, None),
                "max_block_ms": (0, None),
                "max_in_flight_requests": (1, MAX_IN_FLIGHT_REQUESTS_MAX),
            },
        )
        _check_choice("compression", self.compression, COMPRESSION_VALUES)
        if not isinstance(self.enable_idempotence, bool):
            raise InvalidArgument(f"enable_idempotence must be a bool, got {self.enable_idempotence!r}")
        if self.enable_idempotence and self.acks != -1:
            # Kafka's rule: deduplication needs the leader to hold what it acknowledged.
            raise InvalidArgument(f"enable_idempotence needs acks='all', got acks={self.acks}")
        # Kafka's rule: a record must get a full request attempt after lingering.
        check_int(
            "delivery_timeout_ms", self.delivery_timeout_ms, minimum=self.linger_ms + self.request_timeout_ms
        )

    @property
    def acks_wire(self) -> int:
        return int(self.acks)

    @property
    def transactional(self) -> bool:
        return self.transactional_id is not None


@dataclass(frozen=True)
class ConsumerConfig(ConnectionConfig):
    """Consumer settings (Kafka's names)."""

    group_id: str | None = None
    auto_offset_reset: str = "latest"
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = AUTO_COMMIT_INTERVAL_MS_DEFAULT
    fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS_DEFAULT
    fetch_min_bytes: int = FETCH_MIN_BYTES_DEFAULT
    fetch_max_bytes: int = FETCH_MAX_BYTES_DEFAULT
    max_partition_fetch_bytes: int = MAX_PARTITION_FETCH_BYTES_DEFAULT
    max_poll_records: int = MAX_POLL_RECORDS_DEFAULT
    check_crcs: bool = True
    group_protocol: str = "consumer"
    group_instance_id: str | None = None
    session_timeout_ms: int = SESSION_TIMEOUT_MS_DEFAULT
    max_poll_interval_ms: int = MAX_POLL_INTERVAL_MS_DEFAULT
    group_remote_assignor: str | None = None
    default_api_timeout_ms: int = DEFAULT_API_TIMEOUT_MS_DEFAULT
    isolation_level: str = "read_uncommitted"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_id is not None:
            check_group_id(self.group_id)
        _check_choice("isolation_level", self.isolation_level, ISOLATION_LEVEL_VALUES)
        _check_choice("auto_offset_reset", self.auto_offset_reset, AUTO_OFFSET_RESET_VALUES)
        _check_ranges(
            self,
            {
                "auto_commit_interval_ms": (1, None),
                "fetch_max_wait_ms": (0, limits.FETCH_MAX_WAIT_MS_MAX),
                "fetch_min_bytes": (0, None),
                "fetch_max_bytes": (1, FETCH_MAX_BYTES_MAX),
                "max_partition_fetch_bytes": (1, self.fetch_max_bytes),
                "max_poll_records": (1, None),
                "default_api_timeout_ms": (1, None),
            },
        )
        _check_choice("group_protocol", self.group_protocol, GROUP_PROTOCOL_VALUES)
        if self.group_instance_id is not None and not (
            isinstance(self.group_instance_id, str)
            and 0 < len(self.group_instance_id) <= TOPIC_NAME_MAX_CHARS
        ):
            raise InvalidArgument(
                f"group_instance_id must be 1..{TOPIC_NAME_MAX_CHARS} characters, "
                f"got {self.group_instance_id!r}"
            )
        _check_ranges(
            self,
            {
                "session_timeout_ms": (SESSION_TIMEOUT_MS_MIN, SESSION_TIMEOUT_MS_MAX),
                "max_poll_interval_ms": (1, None),
            },
        )
        if self.group_remote_assignor is not None:
            _check_choice("group_remote_assignor", self.group_remote_assignor, GROUP_REMOTE_ASSIGNOR_VALUES)

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"


ConfigT = TypeVar("ConfigT", bound=ConnectionConfig)


def build_config(
    cls: type[ConfigT], bootstrap: str | list[str] | tuple[str, ...], settings: dict[str, Any]
) -> ConfigT:
    """cls(bootstrap=..., **settings), with an unknown setting named in InvalidArgument."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise InvalidArgument(
            f"unknown {cls.__name__} setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    return cls(bootstrap=bootstrap, **settings)
