"""Data source options: parsed and checked once, at planning, into frozen dataclasses.

Pure: no Spark, no gRPC. Every error is an `OptionError` whose message names the
option (or input column) that is wrong, so a bad query fails at planning with a
sentence a user can act on, not with a stack trace from a worker.

Option names follow Spark's Kafka source (Structured Streaming + Kafka Integration
Guide) where one exists: subscribe / subscribePattern / assign, startingOffsets,
endingOffsets, startingOffsetsByTimestamp, startingTimestamp, endingOffsetsByTimestamp,
endingTimestamp, startingOffsetsByTimestampStrategy, maxOffsetsPerTrigger,
maxBytesPerTrigger, minPartitions, failOnDataLoss, includeHeaders, topic. Spark hands
options over case-insensitively (keys may arrive lower-cased), so every lookup here
is by lower-cased name. Offsets JSON is Kafka's: {"topic": {"0": 23, "1": -2}} with -2
meaning earliest and -1 latest.

A job ported from format("kafka") keeps its options: Kafka client settings (`kafka.`
prefix) and Spark's Kafka-only options either map to the connector's setting of the same
meaning (kafka.ssl.* stores to its TLS material: kafka_tls.py), are accepted with no effect
where they change nothing here (KAFKA_NO_EFFECT, each with why), or are refused with a
message naming them (translate_kafka_options).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clients.common.failover import BootstrapError, bootstrap_addresses
from clients.common.topics import topic_name_problem
from clients.common.types import TopicPartitionKey
from spark_connector import limits
from spark_connector.kafka_tls import KafkaTls, parse_kafka_tls
from spark_connector.options_error import OptionError as OptionError  # re-exported

EARLIEST = -2  # Kafka's offsets-JSON value (and ListOffsets timestamp) for the log start
LATEST = -1  # ... and for the high watermark (the last stable offset, read_committed)

# kafka.isolation.level's values (Kafka's consumer setting; ReadOptions.read_committed).
ISOLATION_LEVEL = "isolation.level"
READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"

_BYTE_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_BYTE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass(frozen=True)
class ClientSettings:
    """Settings passed through with the `highwater.` prefix (see CLIENT_SETTINGS), or Kafka's names for them.

    The TLS material and the token are read on the driver at planning and travel to the
    tasks inside the pickled reader or writer (never in the plan's printed options), so
    executors need no copy of the files. They are left out of repr() so no log shows them.
    """

    request_timeout_ms: int = limits.REQUEST_TIMEOUT_MS_DEFAULT
    connect_timeout_ms: int = limits.CONNECT_TIMEOUT_MS_DEFAULT
    retry_timeout_ms: int = limits.RETRY_TIMEOUT_MS_DEFAULT
    fetch_max_bytes: int = limits.FETCH_MAX_BYTES_DEFAULT
    acks: int = -1
    batch_size_bytes: int = limits.WRITE_BATCH_BYTES_DEFAULT
    compression: str = "none"
    fetch_from_leaders: bool = True
    local_reads: bool = True
    linger_ms: int | None = None  # None: a Produce leaves when it is full or the task ends
    max_request_bytes: int = limits.PRODUCE_REQUEST_BYTES_MAX
    ca_cert: bytes | None = field(default=None, repr=False)
    cert_chain: bytes | None = field(default=None, repr=False)
    private_key: bytes | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)

    @property
    def secure(self) -> bool:
        """TLS is on: any of the CA, a client certificate or a token was given."""
        return bool(self.ca_cert or self.cert_chain or self.token)


# option name (after the prefix) -> (ClientSettings field, minimum, maximum); the others are
# checked on their own.
CLIENT_PREFIX = "highwater."
_INT_SETTINGS: dict[str, tuple[str, int, int]] = {
    "request.timeout.ms": ("request_timeout_ms", 1, 3_600_000),
    "connect.timeout.ms": ("connect_timeout_ms", 1, 3_600_000),
    "retry.timeout.ms": ("retry_timeout_ms", 0, 3_600_000),
    "fetch.max.bytes": ("fetch_max_bytes", 1024, limits.FETCH_MAX_BYTES_MAX),
    "batch.size.bytes": ("batch_size_bytes", 1, limits.WRITE_BATCH_BYTES_MAX),
    "linger.ms": ("linger_ms", 0, 3_600_000),
    "max.request.size": ("max_request_bytes", 1024, limits.PRODUCE_REQUEST_BYTES_MAX),
}
# Files read on the driver (PEM), and the bearer token. The token's option name contains
# "token", which Spark's default spark.redaction.regex matches, so explain() and the UI
# show it as *********(redacted).
_TLS_FILES = {"ssl.cafile": "ca_cert", "ssl.certfile": "cert_chain", "ssl.keyfile": "private_key"}
TOKEN_SETTING = "auth.token"
CLIENT_SETTINGS = (
    *_INT_SETTINGS,
    "acks",
    "compression",
    "fetch.from.leaders",
    "local.reads",
    *_TLS_FILES,
    TOKEN_SETTING,
)
_COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")


# --- Spark's Kafka source and sink options --------------------------------------------------
# A job ported from format("kafka") keeps its options. Each one either means here what it
# means there, is accepted with no effect because it changes nothing here (said why, in
# KAFKA_NO_EFFECT and docs/SPARK.md), or is refused with a message naming it and what to use
# instead: an option that changes results, accepted and ignored, would change the job silently.
KAFKA_PREFIX = "kafka."
_SECURITY_INSTEAD = (
    "use kafka.security.protocol=SSL with kafka.ssl.truststore.* (the cluster's CA) and "
    "kafka.ssl.keystore.* (a client certificate), or highwater.ssl.cafile, highwater.ssl.certfile and "
    "highwater.ssl.keyfile, or highwater.auth.token (a bearer token from `highwater token create`)"
)
# Kafka client settings with the same meaning here: kafka.<name> -> highwater.<name>.
KAFKA_READ_EQUIVALENTS = {
    "request.timeout.ms": "request.timeout.ms",
    "max.partition.fetch.bytes": "fetch.max.bytes",  # one Fetch reads one partition, so both bound it
    "fetch.max.bytes": "fetch.max.bytes",
}
KAFKA_WRITE_EQUIVALENTS = {
    "acks": "acks",
    "compression.type": "compression",
    "linger.ms": "linger.ms",
    "batch.size": "batch.size.bytes",
    "max.request.size": "max.request.size",
    "request.timeout.ms": "request.timeout.ms",
    "delivery.timeout.ms": "retry.timeout.ms",
}
# Kafka client settings that change nothing a query reads or writes here: accepted (any
# value), with why. name -> (reads, writes, why).
_NO_GROUP = (
    "no consumer group is joined (tasks read assigned offset ranges, as Spark's Kafka consumers do), "
    "so there is no membership to time out"
)
_TRANSPORT = "gRPC manages its connections (HTTP/2 flow control, its own reconnect back-off)"
KAFKA_NO_EFFECT: dict[str, tuple[bool, bool, str]] = {
    "client.id": (
        True,
        True,
        "the cluster knows a client by its principal (certificate or token): quotas, ACLs and logs use that",
    ),
    "max.poll.records": (
        True,
        False,
        "tasks do not poll: each reads its whole offset range in Fetches of highwater.fetch.max.bytes, "
        "so the rows are the same whatever the value; bound a micro-batch with maxOffsetsPerTrigger",
    ),
    "session.timeout.ms": (True, False, _NO_GROUP),
    "heartbeat.interval.ms": (True, False, _NO_GROUP),
    "max.poll.interval.ms": (True, False, _NO_GROUP),
    "fetch.min.bytes": (
        True,
        False,
        "tasks read ranges already below the high watermark: a Fetch never waits for more records",
    ),
    "fetch.max.wait.ms": (
        True,
        False,
        "tasks read ranges already below the high watermark: a Fetch never waits for more records",
    ),
    "retries": (
        False,
        True,
        "a failed batch is retried until kafka.delivery.timeout.ms (highwater.retry.timeout.ms) passes, as "
        "Kafka's producer does with its default retries; a count is not kept",
    ),
    "buffer.memory": (
        False,
        True,
        "a writer task holds one Produce being sent and one being filled (highwater.max.request.size each)",
    ),
    "send.buffer.bytes": (True, True, _TRANSPORT),
    "receive.buffer.bytes": (True, True, _TRANSPORT),
    "reconnect.backoff.ms": (True, True, _TRANSPORT),
    "reconnect.backoff.max.ms": (True, True, _TRANSPORT),
    "connections.max.idle.ms": (True, True, _TRANSPORT + "; channels stay open for the process's life"),
    "retry.backoff.ms": (
        True,
        True,
        "calls are retried with the connector's own back-off until highwater.retry.timeout.ms",
    ),
    "metadata.max.age.ms": (True, True, "metadata is read when a query is planned and at every trigger"),
}
# Kafka client settings accepted with some values only: name -> (reads, writes, accepted
# values (lower-cased), why the others are refused).
KAFKA_VALUES: dict[str, tuple[bool, bool, tuple[str, ...], str]] = {
    "enable.idempotence": (
        False,
        True,
        ("true",),
        "writes are always idempotent (a replayed task writes nothing twice) at no cost (no InitProducerId "
        "call); turning it off would only let duplicates in; remove it",
    ),
    "max.in.flight.requests.per.connection": (
        False,
        True,
        ("1", "2", "3", "4", "5"),
        "an idempotent writer keeps record order with sequence numbers at up to 5, as Kafka's idempotent "
        "producer requires; the writer has one Produce in flight",
    ),
    ISOLATION_LEVEL: (
        True,
        False,
        (READ_UNCOMMITTED, READ_COMMITTED),
        "read_uncommitted (the default) reads every record below the high watermark; read_committed "
        "reads below the last stable offset and leaves out the records of aborted transactions",
    ),
}
# Kafka client settings refused with a reason and what to use instead.
KAFKA_REFUSED: dict[str, str] = {
    "auto.offset.reset": "set the option startingOffsets (earliest, latest or per-partition JSON) instead, "
    "as Spark's Kafka source also requires",
    "enable.auto.commit": "no offsets are committed to a group; the query's checkpoint keeps them",
    "key.deserializer": "keys are always read as binary (cast them in the query)",
    "value.deserializer": "values are always read as binary (cast them in the query)",
    "key.serializer": "keys are written as binary or UTF-8 strings (serialize them in the query)",
    "value.serializer": "values are written as binary or UTF-8 strings (serialize them in the query)",
    "interceptor.classes": "there are no client interceptors; transform the DataFrame instead",
    "transactional.id": "the writer names its transactions itself, one per task: set deliveryGuarantee="
    "exactly-once (and transactionalIdPrefix to choose the ids' prefix; docs/SPARK.md, Guarantees)",
    "partitioner.class": "rows go to murmur2(key) like Kafka's default partitioner; set a 'partition' column "
    "to choose",
    "sasl.mechanism": "Highwater authenticates with a client certificate or a bearer token: "
    + _SECURITY_INSTEAD,
    "sasl.jaas.config": "Highwater authenticates with a client certificate or a bearer token: "
    + _SECURITY_INSTEAD,
}
# Consumer settings read by the reader itself (ReadOptions.group_id), not renamed.
GROUP_ID = "group.id"
# Spark's own (unprefixed) Kafka source options that have no meaning here.
SPARK_REFUSED: dict[str, str] = {
    "fetchOffset.numRetries": "offset look-ups are retried with a back-off until highwater.retry.timeout.ms "
    "passes; set that instead",
    "fetchOffset.retryIntervalMs": "offset look-ups are retried with a back-off until "
    "highwater.retry.timeout.ms passes; set that instead",
}
GROUP_ID_PREFIX = "groupIdPrefix"
# Spark's Kafka option with a Highwater equivalent of the same meaning (a task's wait for one Fetch).
SPARK_READ_EQUIVALENTS = {"kafkaConsumer.pollTimeoutMs": "request.timeout.ms"}


def _kafka_refusal(option: str, why: str) -> OptionError:
    return OptionError(f"option {option!r} is a Kafka client setting with no Highwater meaning: {why}")


def _wrong_side(key: str, writing: bool) -> OptionError:
    what = (
        "a producer setting, and this is a read" if not writing else "a consumer setting, and this is a write"
    )
    return OptionError(f"option {key!r} is {what}: it has no meaning here; remove it")


def translate_kafka_options(
    options: Mapping[str, str], *, writing: bool
) -> tuple[dict[str, str], dict[str, str]]:
    """Kafka's option names turned into the connector's, or refused (OptionError naming the option).

    Takes lower-cased options; returns them with each equivalent moved to its `highwater.`
    name, and display names (highwater name -> the option the user wrote) for messages.
    Settings with no effect here (KAFKA_NO_EFFECT) are left as they are; kafka.group.id,
    kafka.security.protocol and kafka.ssl.* are read by their own parsers. The same setting
    given under two names with different values is an error.
    """
    out = dict(options)
    display: dict[str, str] = {}
    equivalents = KAFKA_WRITE_EQUIVALENTS if writing else KAFKA_READ_EQUIVALENTS
    other = KAFKA_READ_EQUIVALENTS if writing else KAFKA_WRITE_EQUIVALENTS
    renames: dict[str, str] = {}
    for name, target in SPARK_READ_EQUIVALENTS.items():
        if not writing:
            renames[name.lower()] = CLIENT_PREFIX + target
    for name, why in SPARK_REFUSED.items():
        if name.lower() in options:
            raise OptionError(f"option {name!r} of Spark's Kafka source has no Highwater meaning: {why}")
    if writing and GROUP_ID_PREFIX.lower() in options:
        raise OptionError(
            f"option {GROUP_ID_PREFIX!r} is an option of Spark's Kafka source, and this is a write"
        )
    for key in options:
        if not key.startswith(KAFKA_PREFIX):
            continue
        name = key[len(KAFKA_PREFIX) :]
        if name == "bootstrap.servers" or name == "security.protocol" or name.startswith("ssl."):
            continue  # bootstrap: parse_bootstrap; TLS: parse_kafka_tls
        if name in equivalents:
            renames[key] = CLIENT_PREFIX + equivalents[name]
        elif name in KAFKA_NO_EFFECT or name in KAFKA_VALUES or name == GROUP_ID:
            reads, writes = KAFKA_NO_EFFECT.get(name, KAFKA_VALUES.get(name, (True, False)))[:2]
            if not (writes if writing else reads):
                raise _wrong_side(key, writing)
            if name in KAFKA_VALUES:
                accepted, why = KAFKA_VALUES[name][2:]
                if options[key].strip().lower() not in accepted:
                    raise OptionError(
                        f"option {key!r}={options[key]!r} is refused: {why} (accepted: {', '.join(accepted)})"
                    )
        elif name in KAFKA_REFUSED:
            raise _kafka_refusal(key, KAFKA_REFUSED[name])
        elif name.startswith("sasl."):
            raise _kafka_refusal(key, _SECURITY_INSTEAD)
        elif name in other:
            raise _wrong_side(key, writing)
        else:
            settings = ", ".join(f"{KAFKA_PREFIX}{k}" for k in sorted(equivalents))
            raise _kafka_refusal(
                key,
                f"remove it; the Kafka settings with a Highwater equivalent for "
                f"{'writes' if writing else 'reads'} are {settings}, and the connector's "
                f"own are the highwater.* options (docs/SPARK.md lists the Kafka settings accepted "
                f"with no effect)",
            )
    # Options arrive lower-cased; messages use the names as Spark documents them.
    spelled = {name.lower(): name for name in SPARK_READ_EQUIVALENTS}
    for key, target in renames.items():
        if key not in options:
            continue
        name = spelled.get(key, key)
        if target in out and out[target].strip().lower() != options[key].strip().lower():
            shown = display.get(target, target)
            raise OptionError(
                f"options {shown!r} and {name!r} set the same thing to different values "
                f"({out[target]!r}, {options[key]!r}); give one"
            )
        out[target] = options[key]
        display[target] = name
    return out, display


def parse_isolation_level(options: Mapping[str, str]) -> str:
    """kafka.isolation.level of a read, lower-cased: read_uncommitted (the default, as Kafka's
    consumer and Spark's Kafka source) or read_committed. translate_kafka_options has refused
    any other value already."""
    return options.get(KAFKA_PREFIX + ISOLATION_LEVEL, READ_UNCOMMITTED).strip().lower()


def parse_group(options: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(kafka.group.id, groupIdPrefix) of a read, as Spark's Kafka source takes them.

    Spark names its consumers' group with kafka.group.id, else with groupIdPrefix and a unique
    suffix per query, and commits no offsets to it: the group matters for the ACLs the
    principal needs. So here: the reader checks at planning that the principal may use the
    group (reader.check_group) and commits nothing. groupIdPrefix is ignored when
    kafka.group.id is set, as in Spark.
    """
    group_id = options.get(KAFKA_PREFIX + GROUP_ID)
    prefix = options.get(GROUP_ID_PREFIX.lower())
    for name, value in ((KAFKA_PREFIX + GROUP_ID, group_id), (GROUP_ID_PREFIX, prefix)):
        if value is not None and not value.strip():
            raise OptionError(f"option {name!r} is empty: give a group id (or prefix), or remove it")
    if group_id is not None:
        return group_id.strip(), None
    return None, prefix.strip() if prefix is not None else None


@dataclass(frozen=True)
class Subscription:
    """What to read: exactly one of subscribe, subscribePattern, assign."""

    option: str  # the option that was given, for messages
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[TopicPartitionKey, ...] = ()

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return topic in self.topics or any(t == topic for t, _ in self.assigned)


@dataclass(frozen=True)
class OffsetSpec:
    """Where to start or end: earliest, latest, per-partition offsets, or timestamps.

    `option` names the option it came from. For kind "offsets", partitions not listed
    take `default` (EARLIEST or LATEST). For kind "timestamps", `timestamp_all` (ms)
    applies to every partition unless a per-partition one is given.
    """

    option: str
    kind: str  # "earliest" | "latest" | "offsets" | "timestamps"
    offsets: dict[TopicPartitionKey, int] = field(default_factory=dict)
    timestamps: dict[TopicPartitionKey, int] = field(default_factory=dict)
    timestamp_all: int | None = None


@dataclass(frozen=True)
class ReadOptions:
    bootstrap: str
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec | None  # None for streaming queries
    timestamp_strategy: str  # "error" | "latest": no record at/after a starting timestamp
    max_offsets_per_trigger: int | None
    max_bytes_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay_ms: int  # only with min_offsets_per_trigger
    min_partitions: int | None
    max_records_per_partition: int | None
    fail_on_data_loss: bool
    include_headers: bool
    push_filters: bool
    client: ClientSettings
    # kafka.group.id, or groupIdPrefix: a group the principal must be allowed to use
    # (reader.check_group); nothing is committed to it.
    group_id: str | None = None
    group_id_prefix: str | None = None
    # kafka.isolation.level=read_committed: Fetch and ListOffsets ask for it (isolation_level 1),
    # so reads stop at the last stable offset, and tasks drop aborted transactions' records.
    read_committed: bool = False


# deliveryGuarantee's values (a write): idempotent writes that a replay does not repeat, or
# transactions committed with Spark's commit (spark_connector/transactions.py).
DELIVERY_GUARANTEE = "deliveryGuarantee"
IDEMPOTENT = "idempotent"
EXACTLY_ONCE = "exactly-once"
TRANSACTIONAL_ID_PREFIX = "transactionalIdPrefix"
TRANSACTIONAL_ID_PREFIX_DEFAULT = "highwater-spark"
TRANSACTION_TIMEOUT_MS = "transactionTimeoutMs"


@dataclass(frozen=True)
class WriteOptions:
    bootstrap: str
    topic: str | None  # overrides a `topic` column, as in Spark's Kafka sink
    client: ClientSettings
    # deliveryGuarantee=exactly-once: each task writes in a transaction the driver commits.
    exactly_once: bool = False
    transactional_id_prefix: str = TRANSACTIONAL_ID_PREFIX_DEFAULT
    transaction_timeout_ms: int = limits.TRANSACTION_TIMEOUT_MS_DEFAULT


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def check_topic(topic: object, where: str) -> str:
    if not isinstance(topic, str) or not topic:
        raise OptionError(f"{where}: a topic name must be a non-empty string, got {topic!r}")
    problem = topic_name_problem(topic)
    if problem is not None:
        raise OptionError(f"{where}: {problem}")
    return topic


def parse_bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name.lower())
    if text is None:
        return default
    if text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    raise OptionError(f"option {name!r} must be true or false, got {text!r}")


def parse_int(
    options: Mapping[str, str],
    name: str,
    *,
    minimum: int,
    maximum: int = 2**63 - 1,
    display: str | None = None,
) -> int | None:
    text = options.get(name.lower())
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(f"option {display or name!r} must be an integer, got {text!r}") from None
    if not minimum <= value <= maximum:
        raise OptionError(f"option {display or name!r} must be between {minimum} and {maximum}, got {value}")
    return value


_DURATION = re.compile(r"^\s*(\d+)\s*(us|ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_DURATION_MS = {
    "us": 0.001,
    "ms": 1,
    "": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}


def parse_duration_ms(options: Mapping[str, str], name: str, default_ms: int) -> int:
    """A duration as Spark writes them (Utils.timeStringAsMs): 15m, 5s, 100ms; a bare number is ms."""
    text = options.get(name.lower())
    if text is None:
        return default_ms
    match = _DURATION.match(text)
    if not match:
        raise OptionError(f"option {name!r} must be a duration such as 15m, 30s or 500ms, got {text!r}")
    return int(int(match.group(1)) * _DURATION_MS[(match.group(2) or "").lower()])


def parse_byte_size(options: Mapping[str, str], name: str) -> int | None:
    """Bytes, optionally with a binary unit: 1048576, 512k, 10m, 1g (also kb / mib ...)."""
    text = options.get(name.lower())
    if text is None:
        return None
    match = _BYTE_SIZE.match(text)
    unit = (match.group(2) or "").lower().replace("i", "").rstrip("b") if match else ""
    if not match or unit not in _BYTE_UNITS:
        raise OptionError(f"option {name!r} must be a byte size such as 1048576, 512k or 10m, got {text!r}")
    value = int(match.group(1)) * _BYTE_UNITS[unit]
    if value <= 0:
        raise OptionError(f"option {name!r} must be positive, got {text!r}")
    return value


def parse_client_settings(
    options: Mapping[str, str], display: Mapping[str, str] | None = None, kafka_tls: KafkaTls | None = None
) -> ClientSettings:
    """The `highwater.`-prefixed options; an unknown one is an error (a typo would be silently ignored).

    `display` maps a setting's name to the option the user wrote (a Kafka name), for messages.
    `kafka_tls` is what kafka.security.protocol and kafka.ssl.* gave (parse_kafka_tls): its
    PEM bytes take the place of the highwater.ssl.* files, which may not be given as well.
    """
    shown = display or {}
    values: dict[str, Any] = {}
    for key, text in options.items():
        if not key.startswith(CLIENT_PREFIX) or key == CLIENT_PREFIX + "bootstrap":
            continue
        name = key[len(CLIENT_PREFIX) :]
        label = shown.get(key, key)
        if name in _INT_SETTINGS:
            attr, minimum, maximum = _INT_SETTINGS[name]
            values[attr] = parse_int(options, key, minimum=minimum, maximum=maximum, display=label)
        elif name == "acks":
            acks = {"all": -1, "-1": -1, "1": 1, "0": 0}.get(text.strip().lower())
            if acks is None:
                raise OptionError(f"option {label!r} must be all, 1 or 0, got {text!r}")
            values["acks"] = acks
        elif name == "compression":
            if text.strip().lower() not in _COMPRESSIONS:
                raise OptionError(f"option {label!r} must be one of {', '.join(_COMPRESSIONS)}, got {text!r}")
            values["compression"] = text.strip().lower()
        elif name == "fetch.from.leaders":
            values["fetch_from_leaders"] = parse_bool(options, key, True)
        elif name == "local.reads":
            values["local_reads"] = parse_bool(options, key, True)
        elif name in _TLS_FILES:
            values[_TLS_FILES[name]] = _read_pem(key, text)
        elif name == TOKEN_SETTING:
            if not text.strip():
                raise OptionError(f"option {key!r} is empty")
            values["token"] = text.strip()
        else:
            known = ", ".join(CLIENT_PREFIX + s for s in sorted(CLIENT_SETTINGS))
            raise OptionError(f"unknown option {key!r}; the client settings are {known}")
    if bool(values.get("cert_chain")) != bool(values.get("private_key")):
        raise OptionError(
            "options 'highwater.ssl.certfile' and 'highwater.ssl.keyfile' go together: give both or neither"
        )
    if kafka_tls is not None:
        _merge_kafka_tls(values, kafka_tls)
    return ClientSettings(**values)


def _merge_kafka_tls(values: dict[str, Any], tls: KafkaTls) -> None:
    """Put kafka.ssl.*'s PEM bytes into `values`; refuse what contradicts the highwater.* options."""
    own = [CLIENT_PREFIX + name for name, attr in _TLS_FILES.items() if values.get(attr)]
    if tls.given and own:
        raise OptionError(
            f"options {', '.join(map(repr, tls.given))} and {', '.join(map(repr, own))} both give TLS "
            "material; give one set"
        )
    values.update(
        {
            attr: data
            for attr, data in (
                ("ca_cert", tls.ca_cert),
                ("cert_chain", tls.cert_chain),
                ("private_key", tls.private_key),
            )
            if data is not None
        }
    )
    tls_on = bool(values.get("ca_cert") or values.get("cert_chain") or values.get("token"))
    if tls.protocol == "PLAINTEXT" and tls_on:
        raise OptionError(
            "option 'kafka.security.protocol' is PLAINTEXT, but highwater.ssl.* or highwater.auth.token turn "
            "TLS on; set kafka.security.protocol=SSL, or remove one"
        )
    if tls.protocol == "SSL" and not values.get("ca_cert"):
        raise OptionError(
            "option 'kafka.security.protocol' is SSL but no CA is given: set kafka.ssl.truststore.location "
            "(a PEM, PKCS12 or JKS file holding the cluster's CA) or highwater.ssl.cafile"
        )


def _read_pem(option: str, path: str) -> bytes:
    """A PEM file's bytes, read on the driver so executors need no copy of it."""
    try:
        data = Path(path.strip()).read_bytes()
    except OSError as exc:
        raise OptionError(f"option {option!r}: cannot read {path!r} on the driver: {exc.strerror}") from None
    if b"-----BEGIN" not in data:
        raise OptionError(f"option {option!r}: {path!r} is not a PEM file")
    return data


def parse_bootstrap(options: Mapping[str, str]) -> str:
    given = {
        name: options[name].strip()
        for name in ("bootstrap", "highwater.bootstrap", "kafka.bootstrap.servers")
        if options.get(name) and options[name].strip()
    }
    if len(set(given.values())) > 1:
        raise OptionError(
            f"options {', '.join(map(repr, given))} name different gateways "
            f"({', '.join(map(repr, given.values()))}); give one"
        )
    text = next(iter(given.values()), None)
    if not text or not text.strip():
        raise OptionError("option 'bootstrap' is required: the gateway addresses, e.g. 127.0.0.1:9092")
    try:
        bootstrap_addresses(text)  # the client library's rule: host:port, port 1-65535
    except BootstrapError as error:
        raise OptionError(f"option 'bootstrap': {error}") from None
    return text.strip()


def _json(options: Mapping[str, str], name: str) -> Any:
    text = options[name.lower()]
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionError(
            f"option {name!r} is not valid JSON ({exc.msg} at character {exc.pos}): {text!r}"
        ) from None


def _partition_map(name: str, value: object, what: str) -> dict[TopicPartitionKey, int]:
    """{"topic": {"0": n, ...}, ...} -> {(topic, 0): n}; OptionError naming `name` if malformed."""
    example = '{"topicA": {"0": 23, "1": -2}}'
    if not isinstance(value, dict) or not value:
        raise OptionError(
            f"option {name!r} must be a JSON object of topic -> {{partition: {what}}}, "
            f"e.g. {example}; got {json.dumps(value)}"
        )
    out: dict[TopicPartitionKey, int] = {}
    for topic, partitions in value.items():
        check_topic(topic, f"option {name!r}")
        if not isinstance(partitions, dict) or not partitions:
            raise OptionError(
                f"option {name!r}: topic {topic!r} must map to an object of partition -> {what}, "
                f"e.g. {example}"
            )
        for partition, number in partitions.items():
            if not str(partition).isdigit():
                raise OptionError(
                    f"option {name!r}: partition {partition!r} of {topic!r} is not a non-negative integer"
                )
            if not isinstance(number, int) or isinstance(number, bool):
                raise OptionError(
                    f"option {name!r}: {what} for {topic}-{partition} must be an integer, "
                    f"got {json.dumps(number)}"
                )
            out[(topic, int(partition))] = number
    return out


def parse_subscription(options: Mapping[str, str]) -> Subscription:
    given = [name for name in ("subscribe", "subscribePattern", "assign") if name.lower() in options]
    if len(given) != 1:
        raise OptionError(
            "exactly one of the options 'subscribe', 'subscribePattern', 'assign' must be given"
            + (f", got {', '.join(given)}" if given else "")
        )
    name = given[0]
    text = options[name.lower()]
    if name == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
        if not topics:
            raise OptionError("option 'subscribe' must list at least one topic (comma-separated)")
        for topic in topics:
            check_topic(topic, "option 'subscribe'")
        return Subscription(name, topics=topics)
    if name == "subscribePattern":
        try:
            re.compile(text)
        except re.error as exc:
            raise OptionError(
                f"option 'subscribePattern': {text!r} is not a regular expression: {exc}"
            ) from None
        return Subscription(name, pattern=text)
    value = _json(options, "assign")
    if not isinstance(value, dict) or not value:
        raise OptionError(
            "option 'assign' must be a JSON object of topic -> [partitions], e.g. {\"topicA\": [0, 1]}"
        )
    assigned: list[TopicPartitionKey] = []
    for topic, partitions in value.items():
        check_topic(topic, "option 'assign'")
        if not isinstance(partitions, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
        ):
            raise OptionError(
                f"option 'assign': topic {topic!r} must map to a list of partition numbers, "
                f"got {json.dumps(partitions)}"
            )
        assigned.extend((topic, p) for p in partitions if (topic, p) not in assigned)
    return Subscription(name, assigned=tuple(assigned))


def _offset_spec(options: Mapping[str, str], *, starting: bool, streaming: bool) -> OffsetSpec:
    prefix = "starting" if starting else "ending"
    global_ts, by_ts, plain = f"{prefix}Timestamp", f"{prefix}OffsetsByTimestamp", f"{prefix}Offsets"
    # Spark's precedence: a global timestamp, then per-partition timestamps, then offsets.
    if global_ts.lower() in options:
        ts = parse_int(options, global_ts, minimum=0)
        return OffsetSpec(global_ts, "timestamps", timestamp_all=ts)
    if by_ts.lower() in options:
        timestamps = _partition_map(by_ts, _json(options, by_ts), "timestamp in ms")
        for tp, ts in timestamps.items():
            if ts < 0:
                raise OptionError(
                    f"option {by_ts!r}: timestamp for {tp[0]}-{tp[1]} must be >= 0 ms, got {ts}"
                )
        return OffsetSpec(by_ts, "timestamps", timestamps=timestamps)
    text = options.get(plain.lower())
    if text is None:
        return OffsetSpec(plain, "latest" if (streaming or not starting) else "earliest")
    if text.strip().lower() in ("earliest", "latest"):
        kind = text.strip().lower()
        if not streaming and starting and kind == "latest":
            raise OptionError(
                "option 'startingOffsets' cannot be latest for a batch query (it would read nothing)"
            )
        if not starting and kind == "earliest":
            raise OptionError("option 'endingOffsets' cannot be earliest")
        return OffsetSpec(plain, kind)
    offsets = _partition_map(plain, _json(options, plain), "offset (-2 earliest, -1 latest)")
    for tp, offset in offsets.items():
        if offset < EARLIEST:
            raise OptionError(
                f"option {plain!r}: offset {offset} for {tp[0]}-{tp[1]} is not an offset, "
                "-2 (earliest) or -1 (latest)"
            )
        if not starting and offset == EARLIEST:
            raise OptionError(f"option 'endingOffsets': -2 (earliest) is not allowed, for {tp[0]}-{tp[1]}")
        if not streaming and starting and offset == LATEST:
            raise OptionError(
                f"option 'startingOffsets': -1 (latest) is not allowed in a batch query, for {tp[0]}-{tp[1]}"
            )
    return OffsetSpec(plain, "offsets", offsets=offsets)


def parse_read_options(raw: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    options, display = translate_kafka_options(_lower(raw), writing=False)
    if not streaming and "maxoffsetspertrigger" in options:
        pass  # accepted and ignored in batch queries, as Spark's Kafka source does
    ending_names = ("endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp")
    if streaming and any(n.lower() in options for n in ending_names):
        raise OptionError(
            "options 'endingOffsets' / 'endingOffsetsByTimestamp' / 'endingTimestamp' are for "
            "batch queries only; a streaming query reads on as new records arrive"
        )
    strategy = options.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError(
            f"option 'startingOffsetsByTimestampStrategy' must be error or latest, got {strategy!r}"
        )
    min_partitions = parse_int(options, "minPartitions", minimum=1, maximum=1_000_000)
    min_offsets = parse_int(options, "minOffsetsPerTrigger", minimum=1)
    if "maxtriggerdelay" in options and min_offsets is None:
        raise OptionError(
            "option 'maxTriggerDelay' only applies with minOffsetsPerTrigger (as in Spark's Kafka "
            "source): set minOffsetsPerTrigger too, or remove it"
        )
    max_offsets = parse_int(options, "maxOffsetsPerTrigger", minimum=1)
    if min_offsets is not None and max_offsets is not None and min_offsets > max_offsets:
        raise OptionError(
            f"option 'minOffsetsPerTrigger' ({min_offsets}) is larger than 'maxOffsetsPerTrigger' "
            f"({max_offsets}): no micro-batch could satisfy both"
        )
    subscription = parse_subscription(options)
    group_id, group_id_prefix = parse_group(options)
    starting = _offset_spec(options, starting=True, streaming=streaming)
    ending = None if streaming else _offset_spec(options, starting=False, streaming=streaming)
    for spec in (starting, ending):
        if spec is None:
            continue
        for tp in (*spec.offsets, *spec.timestamps):
            if subscription.option == "assign" and tp not in subscription.assigned:
                raise OptionError(
                    f"option {spec.option!r} names {tp[0]}-{tp[1]}, which option 'assign' does not include"
                )
            if not subscription.matches(tp[0]):
                raise OptionError(
                    f"option {spec.option!r} names topic {tp[0]!r}, which option "
                    f"{subscription.option!r} does not select"
                )
    return ReadOptions(
        bootstrap=parse_bootstrap(options),
        subscription=subscription,
        starting=starting,
        ending=ending,
        timestamp_strategy=strategy,
        max_offsets_per_trigger=max_offsets,
        max_bytes_per_trigger=parse_byte_size(options, "maxBytesPerTrigger"),
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay_ms=parse_duration_ms(
            options, "maxTriggerDelay", limits.MAX_TRIGGER_DELAY_MS_DEFAULT
        ),
        min_partitions=min_partitions,
        max_records_per_partition=parse_int(options, "maxRecordsPerPartition", minimum=1),
        fail_on_data_loss=parse_bool(options, "failOnDataLoss", True),
        include_headers=parse_bool(options, "includeHeaders", False),
        push_filters=parse_bool(options, "pushFilters", False),
        client=parse_client_settings(options, display, parse_kafka_tls(options)),
        group_id=group_id,
        group_id_prefix=group_id_prefix,
        read_committed=parse_isolation_level(options) == READ_COMMITTED,
    )


def parse_write_options(raw: Mapping[str, str]) -> WriteOptions:
    options, display = translate_kafka_options(_lower(raw), writing=True)
    topic = options.get("topic")
    # Spark's Kafka sink takes includeHeaders and writes a 'headers' column whenever there is
    # one, whatever its value; so does this sink. Checked only for its form.
    parse_bool(options, "includeHeaders", False)
    guarantee = options.get(DELIVERY_GUARANTEE.lower(), IDEMPOTENT).strip().lower()
    if guarantee not in (IDEMPOTENT, EXACTLY_ONCE):
        raise OptionError(
            f"option {DELIVERY_GUARANTEE!r} must be {IDEMPOTENT} (the default: a replayed batch is not "
            f"written again) or {EXACTLY_ONCE} (transactions: read_committed readers see each batch whole, "
            f"once), got {guarantee!r}"
        )
    prefix = options.get(TRANSACTIONAL_ID_PREFIX.lower(), TRANSACTIONAL_ID_PREFIX_DEFAULT).strip()
    if not prefix or len(prefix) > limits.TRANSACTIONAL_ID_PREFIX_MAX_CHARS or "/" in prefix:
        raise OptionError(
            f"option {TRANSACTIONAL_ID_PREFIX!r} must be 1..{limits.TRANSACTIONAL_ID_PREFIX_MAX_CHARS} "
            f"characters without '/', got {prefix!r}"
        )
    timeout_ms = parse_int(
        options, TRANSACTION_TIMEOUT_MS, minimum=1, maximum=limits.TRANSACTION_TIMEOUT_MS_MAX
    )
    return WriteOptions(
        bootstrap=parse_bootstrap(options),
        topic=check_topic(topic.strip(), "option 'topic'") if topic is not None else None,
        client=parse_client_settings(options, display, parse_kafka_tls(options)),
        exactly_once=guarantee == EXACTLY_ONCE,
        transactional_id_prefix=prefix,
        transaction_timeout_ms=timeout_ms or limits.TRANSACTION_TIMEOUT_MS_DEFAULT,
    )


# --- offsets as Spark keeps them in the checkpoint ------------------------------------------


def offsets_to_json(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    """{(t, p): n} -> {"t": {"p": n}}: Kafka's per-partition JSON, sorted so equal offsets compare equal."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def offsets_from_json(value: Mapping[str, Any], what: str = "offset") -> dict[TopicPartitionKey, int]:
    """The inverse of offsets_to_json, for offsets read back from a checkpoint."""
    if not isinstance(value, Mapping):
        raise OptionError(f"{what} {value!r} is not a per-partition offsets object")
    return _partition_map(what, dict(value), "offset") if value else {}
