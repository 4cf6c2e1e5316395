"""What a topic may be called and configured with, and what a consumer group may be called:
one set of rules for every process.

The controller refuses a bad name or config at CreateTopics (INVALID_TOPIC_EXCEPTION,
INVALID_CONFIG), the client library and the CLI refuse it before sending, and the
controller reads stored configs through the same schema, so a value that got into
etcd some other way is reported and skipped instead of stopping the controller (a
max.message.bytes above int32 once made every controller start fail). The brokers'
LogConfig checks the same bounds again as an invariant of the log.

Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from clients.common import limits
from clients.common.errors import InvalidConfig, InvalidRequest
from clients.common.record_batch import BATCH_HEADER_SIZE, TIMESTAMP_TYPES
from protos.highwater.v1 import common_pb2

# Kafka's legal characters; fullmatch, so "orders\n" is not a name (a `$` match allowed it,
# and the newline then split a line of the brokers' replication-offset-checkpoint).
TOPIC_NAME_CHARS = re.compile(r"[a-zA-Z0-9._-]+")


def topic_name_problem(name: str) -> str | None:
    """Why `name` is not a legal topic name (Kafka's rules), or None if it is."""
    if not name:
        return "topic name is empty"
    if len(name) > limits.TOPIC_NAME_MAX_CHARS:
        return f"topic name is {len(name)} characters; the limit is {limits.TOPIC_NAME_MAX_CHARS}"
    if name in (".", ".."):
        return f"topic name {name!r} is not allowed"
    if not TOPIC_NAME_CHARS.fullmatch(name):
        return f"topic name {name!r} may contain only ASCII letters, digits, '.', '_' and '-'"
    return None


def group_id_problem(group_id: str) -> str | None:
    """Why `group_id` cannot name a consumer group, or None if it can."""
    if not group_id:
        return "group id is empty"
    if len(group_id) > limits.GROUP_ID_MAX_CHARS:
        return f"group id is {len(group_id)} characters; the limit is {limits.GROUP_ID_MAX_CHARS}"
    if "/" in group_id:
        return f"group id {group_id[:40]!r} contains '/'"
    if not group_id.isprintable():
        return f"group id {group_id[:40]!r} contains control characters (NUL, newline, ...)"
    return None


INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


# Kafka's DescribeConfigs config_type codes (DescribeConfigsResponse.json, v3+).
KAFKA_CONFIG_TYPE_BOOLEAN = 1
KAFKA_CONFIG_TYPE_STRING = 2
KAFKA_CONFIG_TYPE_INT = 3
KAFKA_CONFIG_TYPE_LONG = 5
KAFKA_CONFIG_TYPE_DOUBLE = 6
KAFKA_CONFIG_TYPE_LIST = 7


# Kafka's cleanup.policy values; a topic's policy is a non-empty set of them.
CLEANUP_POLICY_DELETE = "delete"
CLEANUP_POLICY_COMPACT = "compact"
CLEANUP_POLICIES = (CLEANUP_POLICY_COMPACT, CLEANUP_POLICY_DELETE)

# Why accepted configs have no effect here (ConfigKey.note; described by DescribeConfigs).
_KEPT_AS_SENT = "no effect here: batches are stored as the producer compressed them (Kafka's 'producer')"
_BROKER_FLUSH = "no effect here: the broker's own flush policy applies to every topic"
_BROKER_INDEX = "no effect here: the broker's own index settings apply to every topic"
_NOT_THROTTLED = "no effect here: replication is not throttled"
_NO_TIERS = "no effect here: there is no tiered storage"
# Kafka's ThrottledReplicaListValidator: empty, "*", or partition:broker pairs.
_THROTTLED_REPLICAS = r"|\*|\d+:\d+(,\d+:\d+)*"
_THROTTLED_REPLICAS_TEXT = "empty, '*', or a comma-separated list of partition:broker pairs"


def retention_applies(cleanup_policy: str) -> bool:
    """Whether time and size retention delete segments under this canonical cleanup.policy
    ("" is the default, delete): as in Kafka, only a policy that includes "delete"."""
    return not cleanup_policy or CLEANUP_POLICY_DELETE in cleanup_policy.split(",")


@dataclass(frozen=True)
class ConfigKey:
    """One topic config: its kind, bounds, unit and default (bounds inclusive; -1 means unlimited
    where allowed).

    max.message.bytes starts at one batch header: no batch fits below it. A `str` key
    takes one of `choices`, spelled exactly as Kafka spells them, or matches `pattern`. A `list`
    key is Kafka's comma-separated LIST: with `choices`, a non-empty set of them (canonical:
    sorted, each once, so "delete,compact" is "compact,delete"); else its canonical text matches
    `pattern`. A `float` key is a number from `minimum` to `maximum`. `default` is the value in
    force while the topic does not set the key, in canonical text (the brokers' LogConfig
    takes the same constants).

    `pattern_text` says in words what `pattern` takes. `note` is empty for a config Highwater
    honours; for one it only accepts (validated with Kafka's type and bounds, stored and
    described so that a client written for Kafka never fails on it) it says why the config has
    no effect here. `refused` maps a canonical value Kafka's type allows but Highwater cannot
    serve to the reason it is refused.
    """

    name: str
    kind: type
    minimum: int = 0
    maximum: int = 0
    unit: str = ""
    unlimited: bool = False
    choices: tuple[str, ...] = ()
    default: str = ""
    note: str = ""
    pattern: str = ""
    refused: tuple[tuple[str, str], ...] = ()
    # How the bounds read in a refusal, for a key checked by `pattern` (a regex says little).
    pattern_text: str = ""

    @property
    def honoured(self) -> bool:
        return not self.note

    @property
    def kafka_config_type(self) -> int:
        """Kafka's DescribeConfigs config_type of this key (INT for int32 bounds, else LONG)."""
        if self.kind is bool:
            return KAFKA_CONFIG_TYPE_BOOLEAN
        if self.kind is list:
            return KAFKA_CONFIG_TYPE_LIST
        if self.kind is float:
            return KAFKA_CONFIG_TYPE_DOUBLE
        if self.kind is int:
            return KAFKA_CONFIG_TYPE_INT if self.maximum <= INT32_MAX else KAFKA_CONFIG_TYPE_LONG
        return KAFKA_CONFIG_TYPE_STRING

    def bounds(self) -> str:
        if self.kind is bool:
            return "true or false"
        if self.kind is list and self.choices:
            return "a comma-separated list of " + ", ".join(self.choices)
        if self.pattern:
            return self.pattern_text or f"text matching {self.pattern}"
        if self.kind is str:
            return "one of " + ", ".join(self.choices)
        if self.kind is float:
            return f"a number from {self.minimum} to {self.maximum}"
        unit = f" {self.unit}" if self.unit else ""
        low = "-1 (unlimited) or " if self.unlimited else ""
        first = 1 if self.unlimited else self.minimum
        return f"{low}an integer from {first} to {self.maximum}{unit}"

    def typed(self, text: str) -> int | bool | str | float:
        """A canonical value (parse's output, or `default`) as its Python type (a list stays text)."""
        if self.kind is bool:
            return text == "true"
        if self.kind is float:
            return float(text)
        return int(text) if self.kind is int else text

    def parse(self, value: object) -> str:
        """The value in its canonical text, or InvalidConfig naming the key and its bounds."""
        text = self._canonical(value)
        reason = dict(self.refused).get(text)
        if reason is not None:
            raise InvalidConfig(f"{self.name}={text} is not served here: {reason}")
        return text

    def _canonical(self, value: object) -> str:
        text = str(value).strip()
        if self.kind is bool:
            if text.lower() not in ("true", "false"):
                raise InvalidConfig(f"{self.name} must be {self.bounds()}, got {text!r}")
            return text.lower()
        if self.kind is list:
            items = [item.strip() for item in text.split(",") if item.strip()]
            if self.choices:
                if not items or any(item not in self.choices for item in items):
                    raise InvalidConfig(f"{self.name} must be {self.bounds()}, got {text!r}")
                return ",".join(sorted(set(items)))
            text = ",".join(items)
        if self.pattern:
            if not re.fullmatch(self.pattern, text):
                raise InvalidConfig(f"{self.name} must be {self.bounds()}, got {text!r}")
            return text
        if self.kind is str:
            if text not in self.choices:
                raise InvalidConfig(f"{self.name} must be {self.bounds()}, got {text!r}")
            return text
        if self.kind is float:
            try:
                ratio = float(text)
            except ValueError:
                raise InvalidConfig(f"{self.name} must be {self.bounds()}, got {text!r}") from None
            if not math.isfinite(ratio) or not self.minimum <= ratio <= self.maximum:
                raise InvalidConfig(f"{self.name} must be {self.bounds()}, got {text!r}")
            return repr(ratio)
        try:
            number = int(text)
        except ValueError:
            raise InvalidConfig(f"{self.name} must be {self.bounds()}, got {text!r}") from None
        # 0 is refused where -1 means unlimited: on the wire 0 means "the broker's default", so a
        # stored 0 would silently mean 7 days of retention instead of none.
        if not self.minimum <= number <= self.maximum or (self.unlimited and number == 0):
            raise InvalidConfig(f"{self.name} must be {self.bounds()}, got {number}")
        return str(number)


TOPIC_CONFIG_SCHEMA: dict[str, ConfigKey] = {
    key.name: key
    for key in (
        ConfigKey(
            "min.insync.replicas",
            int,
            1,
            INT32_MAX,
            "replicas",
            default=str(limits.DEFAULT_MIN_INSYNC_REPLICAS),
        ),
        ConfigKey("unclean.leader.election.enable", bool, default="false"),
        ConfigKey(
            "retention.ms",
            int,
            -1,
            INT64_MAX,
            "ms",
            unlimited=True,
            default=str(limits.LOG_RETENTION_MS_DEFAULT),
        ),
        ConfigKey(
            "retention.bytes",
            int,
            -1,
            INT64_MAX,
            "bytes",
            unlimited=True,
            default=str(limits.LOG_RETENTION_BYTES_DEFAULT),
        ),
        ConfigKey(
            "segment.bytes",
            int,
            limits.SEGMENT_BYTES_MIN,
            limits.SEGMENT_BYTES_MAX,
            "bytes",
            default=str(limits.LOG_SEGMENT_BYTES_DEFAULT),
        ),
        ConfigKey("segment.ms", int, 1, INT64_MAX, "ms", default=str(limits.LOG_SEGMENT_MS_DEFAULT)),
        ConfigKey(
            "max.message.bytes",
            int,
            BATCH_HEADER_SIZE,
            limits.MAX_MESSAGE_BYTES_MAX,
            "bytes",
            default=str(limits.MAX_MESSAGE_BYTES),
        ),
        # Kafka's names since 3.6 (KIP-937), bounds (atLeast(0)) and defaults (before: Long.MAX_VALUE,
        # no limit; after: one hour since Kafka 4.0).
        ConfigKey("message.timestamp.type", str, choices=TIMESTAMP_TYPES, default="CreateTime"),
        ConfigKey("message.timestamp.before.max.ms", int, 0, INT64_MAX, "ms", default=str(INT64_MAX)),
        ConfigKey(
            "message.timestamp.after.max.ms",
            int,
            0,
            INT64_MAX,
            "ms",
            default=str(limits.MESSAGE_TIMESTAMP_AFTER_MAX_MS_DEFAULT),
        ),
        # A policy without "delete" turns time and size retention off, as in Kafka; one with
        # "compact" has the log cleaner keep each key's latest record (services/broker/log_cleaner.py).
        ConfigKey("cleanup.policy", list, choices=CLEANUP_POLICIES, default=CLEANUP_POLICY_DELETE),
        # The cleaner's configs (Kafka's names, bounds and defaults; KIP-58, KIP-354). Their relation
        # (max.compaction.lag.ms >= min.compaction.lag.ms) is checked by topic_configs_problem.
        ConfigKey(
            "min.cleanable.dirty.ratio",
            float,
            0,
            1,
            default=repr(limits.MIN_CLEANABLE_DIRTY_RATIO_DEFAULT),
        ),
        ConfigKey("min.compaction.lag.ms", int, 0, INT64_MAX, "ms", default="0"),
        ConfigKey("max.compaction.lag.ms", int, 1, INT64_MAX, "ms", default=str(INT64_MAX)),
        ConfigKey(
            "delete.retention.ms",
            int,
            0,
            INT64_MAX,
            "ms",
            default=str(limits.DELETE_RETENTION_MS_DEFAULT),
        ),
        # Accepted, not acted on: every other topic config Kafka 3.x defines, with Kafka's type,
        # bounds and default (LogConfig / TopicConfig), so a client that sends one is not refused.
        ConfigKey(
            "compression.type",
            str,
            choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
            default="producer",
            note=_KEPT_AS_SENT,
        ),
        # Kafka 3.8 (KIP-390).
        ConfigKey(
            "compression.gzip.level",
            int,
            -1,
            9,
            default="-1",
            note=_KEPT_AS_SENT,
            pattern=r"-1|[1-9]",
            pattern_text="-1 (gzip's default level) or an integer from 1 to 9",
        ),
        ConfigKey("compression.lz4.level", int, 1, 17, default="9", note=_KEPT_AS_SENT),
        ConfigKey("compression.zstd.level", int, -131072, 22, default="3", note=_KEPT_AS_SENT),
        ConfigKey(
            "file.delete.delay.ms",
            int,
            0,
            INT64_MAX,
            "ms",
            default="60000",
            note="no effect here: a segment's files are removed when retention deletes it",
        ),
        ConfigKey(
            "flush.messages", int, 1, INT64_MAX, "messages", default=str(INT64_MAX), note=_BROKER_FLUSH
        ),
        ConfigKey("flush.ms", int, 0, INT64_MAX, "ms", default=str(INT64_MAX), note=_BROKER_FLUSH),
        ConfigKey(
            "follower.replication.throttled.replicas",
            list,
            pattern=_THROTTLED_REPLICAS,
            pattern_text=_THROTTLED_REPLICAS_TEXT,
            default="",
            note=_NOT_THROTTLED,
        ),
        ConfigKey("index.interval.bytes", int, 0, INT32_MAX, "bytes", default="4096", note=_BROKER_INDEX),
        ConfigKey(
            "leader.replication.throttled.replicas",
            list,
            pattern=_THROTTLED_REPLICAS,
            pattern_text=_THROTTLED_REPLICAS_TEXT,
            default="",
            note=_NOT_THROTTLED,
        ),
        # -2: use retention.bytes / retention.ms (Kafka's default).
        ConfigKey("local.retention.bytes", int, -2, INT64_MAX, "bytes", default="-2", note=_NO_TIERS),
        ConfigKey("local.retention.ms", int, -2, INT64_MAX, "ms", default="-2", note=_NO_TIERS),
        ConfigKey(
            "message.downconversion.enable",
            bool,
            default="true",
            note="no effect here: records are never down-converted (fetches need record format v2)",
        ),
        ConfigKey(
            "message.format.version",
            str,
            pattern=r"\d+\.\d+(\.\d+)?(-IV\d+)?",
            pattern_text="a Kafka version such as 2.8 or 3.0-IV1",
            default="3.0-IV1",
            note="no effect here: records are always format v2 (Kafka 3.x ignores it too)",
        ),
        # Deprecated by Kafka 3.6 (KIP-937) for message.timestamp.before/after.max.ms, honoured above.
        ConfigKey(
            "message.timestamp.difference.max.ms",
            int,
            0,
            INT64_MAX,
            "ms",
            default=str(INT64_MAX),
            note="no effect here: set message.timestamp.before.max.ms and message.timestamp.after.max.ms",
        ),
        ConfigKey(
            "preallocate",
            bool,
            default="false",
            note="no effect here: segment files grow as they are written",
        ),
        # Kafka 3.9 (KIP-950).
        ConfigKey("remote.log.copy.disable", bool, default="false", note=_NO_TIERS),
        ConfigKey("remote.log.delete.on.disable", bool, default="false", note=_NO_TIERS),
        # true is refused as Kafka refuses it on a broker without tiered storage.
        ConfigKey(
            "remote.storage.enable",
            bool,
            default="false",
            note=_NO_TIERS,
            refused=(("true", "tiered storage is not supported; every segment stays on the brokers' disks"),),
        ),
        ConfigKey("segment.index.bytes", int, 4, INT32_MAX, "bytes", default="10485760", note=_BROKER_INDEX),
        ConfigKey(
            "segment.jitter.ms",
            int,
            0,
            INT64_MAX,
            "ms",
            default="0",
            note="no effect here: segments roll at segment.ms exactly",
        ),
    )
}


def _schema_of(key: str) -> ConfigKey:
    schema = TOPIC_CONFIG_SCHEMA.get(key)
    if schema is None:
        raise InvalidConfig(f"unknown topic config {key!r}; known: {', '.join(sorted(TOPIC_CONFIG_SCHEMA))}")
    return schema


def validate_topic_configs(configs: Mapping[str, object]) -> dict[str, str]:
    """Every key known, every value within its bounds and the values consistent together
    (topic_configs_problem); raise InvalidConfig naming the first bad one."""
    valid = {key: _schema_of(key).parse(value) for key, value in configs.items()}
    problem = topic_configs_problem(valid)
    if problem is not None:
        raise InvalidConfig(problem)
    return valid


def topic_config_value(configs: Mapping[str, str], name: str) -> str:
    """The value in force of config `name` under a topic's validated configs: its own or the default."""
    value = configs.get(name)
    return TOPIC_CONFIG_SCHEMA[name].default if value is None else value


# Configs whose values must not decrease in this order (Kafka's LogConfig.validateValues): a
# record cannot have to be cleaned (max.compaction.lag.ms) before it may be (min.compaction.lag.ms).
_ORDERED_CONFIGS = (("min.compaction.lag.ms", "max.compaction.lag.ms"),)


def topic_configs_problem(configs: Mapping[str, str], kept: Iterable[str] = ()) -> str | None:
    """Why a topic's validated configs cannot go together, or None. A config the topic does not
    set counts with its default; `kept` names the configs that are the topic's current values
    (not in the request), so that the sentence says which one to change."""
    for low, high in _ORDERED_CONFIGS:
        problem = _order_problem(configs, low, high, set(kept))
        if problem is not None:
            return problem
    return None


def _order_problem(configs: Mapping[str, str], low: str, high: str, kept: set[str]) -> str | None:
    if int(topic_config_value(configs, low)) <= int(topic_config_value(configs, high)):
        return None

    def named(name: str) -> str:
        text = f"{name}={topic_config_value(configs, name)}"
        if name not in configs:
            return f"{text} (the default)"
        return f"{text} (the topic's current value)" if name in kept else text

    return (
        f"{named(low)} is larger than {named(high)}: a record would have to be cleaned "
        f"before it may be; set {high} to at least {low}, or lower {low}"
    )


def altered_topic_configs(
    current: Mapping[str, str],
    set_configs: Mapping[str, object],
    delete_configs: Iterable[str],
    *,
    replace: bool = False,
) -> dict[str, str]:
    """A topic's configs after a change (Kafka's AlterConfigs with `replace`, else
    IncrementalAlterConfigs): `set_configs` validated by the schema, `delete_configs` back to
    their defaults, and with `replace` every config not set here back to its default too.

    Raises InvalidConfig naming an unknown key or a value out of bounds, InvalidRequest for a
    key both set and deleted (Kafka: "duplicate config keys"). Pure.
    """
    deleted = list(delete_configs)
    both = sorted(set(set_configs) & set(deleted))
    if both:
        raise InvalidRequest(f"configs {both} are both set and deleted in one request; name each once")
    for key in deleted:
        _schema_of(key)
    new = {} if replace else {k: v for k, v in current.items() if k not in deleted}
    changed = {key: _schema_of(key).parse(value) for key, value in set_configs.items()}
    new.update(changed)
    problem = topic_configs_problem(new, kept=set(new) - set(changed))
    if problem is not None:
        raise InvalidConfig(problem)
    return new


@dataclass(frozen=True)
class ConfigValue:
    """A topic config as in force: its value in canonical text, and whether the topic sets it
    (Kafka's config source TOPIC_CONFIG) or it is the default (DEFAULT_CONFIG)."""

    name: str
    value: str
    is_default: bool

    @property
    def source(self) -> str:
        return "DEFAULT_CONFIG" if self.is_default else "TOPIC_CONFIG"

    def typed(self) -> int | bool | str | float:
        return TOPIC_CONFIG_SCHEMA[self.name].typed(self.value)

    @property
    def note(self) -> str:
        """Empty for a config Highwater honours; else why it has no effect here."""
        return TOPIC_CONFIG_SCHEMA[self.name].note

    @property
    def kafka_config_type(self) -> int:
        return TOPIC_CONFIG_SCHEMA[self.name].kafka_config_type


def effective_topic_configs(configs: Mapping[str, str]) -> list[ConfigValue]:
    """Every topic config in schema order, with the value in force: the topic's own or the default.

    `configs` are a topic's set configs (validated; topic_configs_from_proto reads them off the wire).
    """
    return [
        ConfigValue(key.name, configs[key.name], False)
        if key.name in configs
        else ConfigValue(key.name, key.default, True)
        for key in TOPIC_CONFIG_SCHEMA.values()
    ]


def topic_configs_from_proto(config: common_pb2.TopicConfig) -> dict[str, str]:
    """The configs a topic sets, from their wire form (topic_config_proto's inverse).

    A field is set when present (optional fields) or non-zero / non-empty: no key's legal value
    is 0 or "" unless its field is optional. Field names are the config names with '_' for '.'.
    Configs accepted but not honoured travel as text in `unserved_configs`; so does a config
    honoured since (the compaction configs), when a controller of an older release sent it:
    a config whose field is not set is taken from there, so an upgraded broker acts on it.
    """
    out: dict[str, str] = {}
    for key in TOPIC_CONFIG_SCHEMA.values():
        if key.honoured:
            field = key.name.replace(".", "_")
            value = getattr(config, field)
            if config.HasField(field) if _is_optional(field) else value:
                out[key.name] = _field_text(key, value)
                continue
        text = config.unserved_configs.get(key.name)
        if text is not None:
            out[key.name] = text
    return out


def _field_text(key: ConfigKey, value: bool | int | float | str) -> str:
    """A field's value in the canonical text ConfigKey.parse gives."""
    if key.kind is bool:
        return "true" if value else "false"
    if key.kind is float:
        return repr(float(value))
    return str(value)


def _is_optional(field: str) -> bool:
    return bool(common_pb2.TopicConfig.DESCRIPTOR.fields_by_name[field].has_presence)


def stored_topic_configs(configs: Mapping[str, object]) -> tuple[dict[str, str], list[str]]:
    """Configs read back from etcd: the valid ones, and a sentence for each one skipped.

    A skipped key falls back to its default; the caller logs the sentences. Values that cannot
    go together (stored by a release that did not check topic_configs_problem) all fall back.
    """
    good: dict[str, str] = {}
    skipped: list[str] = []
    for key, value in configs.items():
        try:
            good[key] = _schema_of(key).parse(value)
        except InvalidConfig as exc:
            skipped.append(f"{exc.message}; using the default")
    for low, high in _ORDERED_CONFIGS:
        problem = _order_problem(good, low, high, set())
        if problem is not None:
            good.pop(low, None)
            good.pop(high, None)
            skipped.append(f"{problem}; using the defaults of both until the topic's configs are altered")
    return good, skipped


def topic_config_proto(configs: Mapping[str, str]) -> common_pb2.TopicConfig:
    """The wire form of validated configs (0, "" or an absent optional field: the broker's default)."""
    unclean = configs.get("unclean.leader.election.enable")
    return common_pb2.TopicConfig(
        # Optional: present only when the topic sets them (topic_configs_from_proto tells them apart).
        min_insync_replicas=_optional_int(configs.get("min.insync.replicas")),
        unclean_leader_election_enable=None if unclean is None else unclean == "true",
        retention_ms=int(configs.get("retention.ms", 0)),
        retention_bytes=int(configs.get("retention.bytes", 0)),
        segment_bytes=int(configs.get("segment.bytes", 0)),
        segment_ms=int(configs.get("segment.ms", 0)),
        max_message_bytes=int(configs.get("max.message.bytes", 0)),
        message_timestamp_type=configs.get("message.timestamp.type", ""),
        # Optional on the wire (0 is a legal limit): set only when the topic sets them.
        message_timestamp_before_max_ms=_optional_int(configs.get("message.timestamp.before.max.ms")),
        message_timestamp_after_max_ms=_optional_int(configs.get("message.timestamp.after.max.ms")),
        cleanup_policy=configs.get("cleanup.policy", ""),
        # Optional: 0 is a legal value of each.
        min_cleanable_dirty_ratio=_optional_float(configs.get("min.cleanable.dirty.ratio")),
        min_compaction_lag_ms=_optional_int(configs.get("min.compaction.lag.ms")),
        max_compaction_lag_ms=_optional_int(configs.get("max.compaction.lag.ms")),
        delete_retention_ms=_optional_int(configs.get("delete.retention.ms")),
        unserved_configs={
            name: value
            for name, value in configs.items()
            if name in TOPIC_CONFIG_SCHEMA and not TOPIC_CONFIG_SCHEMA[name].honoured
        },
    )


def _optional_int(value: str | None) -> int | None:
    return None if value is None else int(value)


def _optional_float(value: str | None) -> float | None:
    return None if value is None else float(value)


def topic_config_note(name: str) -> str:
    """Why a topic config Highwater accepts has no effect here; "" for one it honours or does not know."""
    key = TOPIC_CONFIG_SCHEMA.get(name)
    return "" if key is None else key.note
