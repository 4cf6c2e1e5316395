"""Kafka's AlterConfigs (33) and IncrementalAlterConfigs (44) resources, read into the
controller's AlterTopicConfigs. Pure: no sockets, no clock.

A topic resource becomes one AlterTopicConfigsTopic: AlterConfigs replaces the topic's whole
config (what it does not name returns to its default, as in Kafka), IncrementalAlterConfigs
sets and deletes the keys it names and keeps the rest. The controller checks names and
values against the one topic config schema (clients/common/topics.py); what is refused here
is what Kafka refuses before it looks at a value:

    a key named twice in one resource          INVALID_REQUEST ("duplicate config keys")
    SET (or an AlterConfigs entry) with null   INVALID_REQUEST
    APPEND / SUBTRACT                          INVALID_CONFIG: they apply to list configs only,
                                               and are not served on those (cleanup.policy, the
                                               throttled-replica lists) yet: SET the whole list
    an operation Kafka does not define         INVALID_REQUEST

Broker resources are refused with INVALID_REQUEST: a Highwater broker's settings are its
command-line flags, read at start-up, so none is dynamic (Kafka answers a change to a
read-only broker config the same way). DescribeConfigs still describes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode as K

from clients.common.topics import TOPIC_CONFIG_SCHEMA
from protos.highwater.v1 import common_pb2

# Kafka's ConfigResource types (DescribeConfigs, AlterConfigs, IncrementalAlterConfigs).
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_BROKER_LOGGER = 8

# IncrementalAlterConfigs' operations (Kafka's AlterConfigOp.OpType ids).
OP_SET = 0
OP_DELETE = 1
OP_APPEND = 2
OP_SUBTRACT = 3
_OP_NAMES = {OP_SET: "SET", OP_DELETE: "DELETE", OP_APPEND: "APPEND", OP_SUBTRACT: "SUBTRACT"}


@dataclass(frozen=True)
class Refused(Exception):
    """One resource answered with a Kafka error code and message, never sent to the controller."""

    code: K
    message: str


def refusal_of_resource_type(resource_type: int, name: str) -> Refused | None:
    """Why a resource of this type cannot be altered here, or None for a topic."""
    if resource_type == RESOURCE_TOPIC:
        return None
    if resource_type in (RESOURCE_BROKER, RESOURCE_BROKER_LOGGER):
        return Refused(
            K.invalid_request,
            f"broker {name or '(default)'}: broker configs are not dynamic in Highwater; a broker's "
            "settings are its command-line flags (highwater-broker --help): restart it with the new "
            "flag. Topic configs can be changed (resource type 2)",
        )
    return Refused(
        K.invalid_request, f"resource type {resource_type} cannot be altered here; only topics (2)"
    )


def topic_change(resource: Any, *, incremental: bool) -> common_pb2.AlterTopicConfigsTopic:
    """The controller's change for one topic resource of either request (kio's body objects).

    Raises Refused for what Kafka refuses before validating values (the module's table).
    """
    names = [c.name for c in resource.configs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise Refused(
            K.invalid_request, f"duplicate config keys {twice} for topic {resource.resource_name!r}"
        )
    change = common_pb2.AlterTopicConfigsTopic(name=resource.resource_name, replace=not incremental)
    for entry in resource.configs:
        operation = entry.config_operation if incremental else OP_SET
        if operation == OP_SET:
            if entry.value is None:
                raise Refused(K.invalid_request, f"null value for config {entry.name!r}; give a value")
            change.set_configs[entry.name] = entry.value
        elif operation == OP_DELETE:
            change.delete_configs.append(entry.name)
        elif operation in (OP_APPEND, OP_SUBTRACT):
            known = entry.name in TOPIC_CONFIG_SCHEMA
            raise Refused(
                K.invalid_config,
                f"config value {_OP_NAMES[operation].lower()} is not allowed for config key "
                f"{entry.name!r}: "
                + (
                    (
                        "not served on list configs yet; SET the whole list"
                        if TOPIC_CONFIG_SCHEMA[entry.name].kind is list
                        else "it is not a list; use SET"
                    )
                    if known
                    else f"unknown topic config; known: {', '.join(sorted(TOPIC_CONFIG_SCHEMA))}"
                ),
            )
        else:
            raise Refused(
                K.invalid_request,
                f"config operation {operation} for {entry.name!r} is not one of 0 (SET), 1 (DELETE), "
                "2 (APPEND), 3 (SUBTRACT)",
            )
    return change
