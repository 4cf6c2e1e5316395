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

import re
from collections.abc import Mapping
from dataclasses import dataclass

from clients.common import limits
from clients.common.errors import InvalidConfig
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


@dataclass(frozen=True)
class ConfigKey:
    """One topic config: its kind, bounds and unit (bounds inclusive; -1 means unlimited where allowed).

    max.message.bytes starts at one batch header: no batch fits below it. A `str` key
    takes one of `choices`, spelled exactly as Kafka spells them.
    """

    name: str
    kind: type
    minimum: int = 0
    maximum: int = 0
    unit: str = ""
    unlimited: bool = False
    choices: tuple[str, ...] = ()

    def bounds(self) -> str:
        if self.kind is bool:
            return "true or false"
        if self.kind is str:
            return "one of " + ", ".join(self.choices)
        unit = f" {self.unit}" if self.unit else ""
        low = "-1 (unlimited) or " if self.unlimited else ""
        first = 1 if self.unlimited else self.minimum
        return f"{low}an integer from {first} to {self.maximum}{unit}"

    def parse(self, value: object) -> str:
        """The value in its canonical text, or InvalidConfig naming the key and its bounds."""
        text = str(value).strip()
        if self.kind is bool:
            if text.lower() not in ("true", "false"):
                raise InvalidConfig(f"{self.name} must be {self.bounds()}, got {text!r}")
            return text.lower()
        if self.kind is str:
            if text not in self.choices:
                raise InvalidConfig(f"{self.name} must be {self.bounds()}, got {text!r}")
            return text
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
        ConfigKey("min.insync.replicas", int, 1, INT32_MAX, "replicas"),
        ConfigKey("unclean.leader.election.enable", bool),
        ConfigKey("retention.ms", int, -1, INT64_MAX, "ms", unlimited=True),
        ConfigKey("retention.bytes", int, -1, INT64_MAX, "bytes", unlimited=True),
        ConfigKey("segment.bytes", int, limits.SEGMENT_BYTES_MIN, limits.SEGMENT_BYTES_MAX, "bytes"),
        ConfigKey("segment.ms", int, 1, INT64_MAX, "ms"),
        ConfigKey("max.message.bytes", int, BATCH_HEADER_SIZE, limits.MAX_MESSAGE_BYTES_MAX, "bytes"),
        # Kafka's names since 3.6 (KIP-937) and bounds (atLeast(0)); defaults in LogConfig.
        ConfigKey("message.timestamp.type", str, choices=TIMESTAMP_TYPES),
        ConfigKey("message.timestamp.before.max.ms", int, 0, INT64_MAX, "ms"),
        ConfigKey("message.timestamp.after.max.ms", int, 0, INT64_MAX, "ms"),
    )
}


def validate_topic_configs(configs: Mapping[str, object]) -> dict[str, str]:
    """Every key known and every value within its bounds; raise InvalidConfig naming the first bad one."""
    out: dict[str, str] = {}
    for key, value in configs.items():
        schema = TOPIC_CONFIG_SCHEMA.get(key)
        if schema is None:
            raise InvalidConfig(
                f"unknown topic config {key!r}; known: {', '.join(sorted(TOPIC_CONFIG_SCHEMA))}"
            )
        out[key] = schema.parse(value)
    return out


def stored_topic_configs(configs: Mapping[str, object]) -> tuple[dict[str, str], list[str]]:
    """Configs read back from etcd: the valid ones, and a sentence for each one skipped.

    A skipped key falls back to its default; the caller logs the sentences.
    """
    good: dict[str, str] = {}
    skipped: list[str] = []
    for key, value in configs.items():
        try:
            good.update(validate_topic_configs({key: value}))
        except InvalidConfig as exc:
            skipped.append(f"{exc.message}; using the default")
    return good, skipped


def topic_config_proto(configs: Mapping[str, str]) -> common_pb2.TopicConfig:
    """The wire form of validated configs (0, false, "" or an absent optional field: the broker's default)."""
    return common_pb2.TopicConfig(
        min_insync_replicas=int(configs.get("min.insync.replicas", limits.DEFAULT_MIN_INSYNC_REPLICAS)),
        unclean_leader_election_enable=configs.get("unclean.leader.election.enable", "false") == "true",
        retention_ms=int(configs.get("retention.ms", 0)),
        retention_bytes=int(configs.get("retention.bytes", 0)),
        segment_bytes=int(configs.get("segment.bytes", 0)),
        segment_ms=int(configs.get("segment.ms", 0)),
        max_message_bytes=int(configs.get("max.message.bytes", 0)),
        message_timestamp_type=configs.get("message.timestamp.type", ""),
        # Optional on the wire (0 is a legal limit): set only when the topic sets them.
        message_timestamp_before_max_ms=_optional_int(configs.get("message.timestamp.before.max.ms")),
        message_timestamp_after_max_ms=_optional_int(configs.get("message.timestamp.after.max.ms")),
    )


def _optional_int(value: str | None) -> int | None:
    return None if value is None else int(value)
