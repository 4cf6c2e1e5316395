"""etcd value formats (coordinator/values.py): the bytes stay what they were, and the readers agree.

Values already in etcd must still read after any change here, so the encodings are pinned
to the exact bytes earlier versions wrote, and the event loop's converters into the
controller context's types are pinned to what they read.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from coordinator import values
from services.controller import event_loop, metadata_image
from services.controller.context import BrokerInfo, LeaderAndIsr, TopicInfo
from tests.python_source import parse_python
from tests.unit.test_pure_imports import ROOT, _io_in, _reached

# ---- the bytes on disk -------------------------------------------------------------------------


def test_partition_state_bytes_are_unchanged():
    raw = values.encode_partition_state(2, 7, (2, 3), 4)
    assert raw == b'{"leader": 2, "leader_epoch": 7, "isr": [2, 3], "controller_epoch": 4}'
    assert event_loop.encode_partition_state(LeaderAndIsr(2, 7, (2, 3), 4, 9)) == raw


def test_topic_assignment_bytes_are_unchanged():
    topic = TopicInfo("t", "id-1", {1: (2, 3), 0: (1, 2)}, {"retention.ms": "5"}, {0: (2,)}, {})
    raw = event_loop.encode_topic(topic)
    assert raw == (
        b'{"version": 1, "topic_id": "id-1", "partitions": {"0": [1, 2], "1": [2, 3]}, '
        b'"adding_replicas": {"0": [2]}, "removing_replicas": {}}'
    )


def test_other_value_bytes_are_unchanged():
    assert values.encode_topic_configs({"b": "1", "a": "2"}) == b'{"a": "2", "b": "1"}'
    assert values.encode_consumer_offset(5, "m", 3, 1000) == (
        b'{"offset": 5, "metadata": "m", "leader_epoch": 3, "commit_time_ms": 1000}'
    )
    assert values.encode_producer_id_block(2000) == b'{"next": 2000}'
    assert values.encode_controller_epoch(12) == b"12"
    assert values.encode_registration({"port": 1, "host": "h"}) == b'{"host":"h","port":1}'
    assert values.encode_controller({"epoch": 3, "controller_id": 1}) == b'{"controller_id":1,"epoch":3}'
    assert values.DELETE_TOPIC_MARK == b"{}"
    assert values.encode_cluster_id("abc") == b"abc"


# ---- reading: the event loop's converters and the context's leftover readers agree -------------

BROKERS = [
    (b'{"broker_id": 1, "host": "h", "port": 9001}', BrokerInfo(1, "h", 9001, "", 0, 44, False)),
    (
        b'{"broker_id": 2, "host": "h", "port": 9002, "rack": "r", "metrics_port": 7, '
        b'"unclean_shutdown": true}',
        BrokerInfo(2, "h", 9002, "r", 7, 44, True),
    ),
    # Only a JSON true marks an unclean shutdown.
    (
        values.encode_registration({"broker_id": 3, "host": "x", "port": 1, "unclean_shutdown": "yes"}),
        BrokerInfo(3, "x", 1, "", 0, 44, False),
    ),
    # A broker started with --replicas-max says so; one that does not gets the default (0).
    (
        values.encode_registration({"broker_id": 4, "host": "x", "port": 1, "replicas_max": 40000}),
        BrokerInfo(4, "x", 1, "", 0, 44, False, 40000),
    ),
]


@pytest.mark.parametrize(("raw", "expected"), BROKERS)
def test_broker_registration_reads(raw: bytes, expected: BrokerInfo) -> None:
    assert metadata_image.broker_info(raw, 44) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            b'{"leader": 1, "leader_epoch": 0, "isr": [1], "controller_epoch": 1}',
            LeaderAndIsr(leader=1, leader_epoch=0, isr=(1,), controller_epoch=1, partition_epoch=5),
        ),
        (
            values.encode_partition_state(-1, 3, (), 2),
            LeaderAndIsr(leader=-1, leader_epoch=3, isr=(), controller_epoch=2, partition_epoch=5),
        ),
    ],
)
def test_partition_state_reads(raw: bytes, expected: LeaderAndIsr) -> None:
    assert metadata_image.partition_state(raw, 5) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            b'{"version": 1, "topic_id": "a", "partitions": {"0": [1]}}',
            TopicInfo("t", "a", {0: (1,)}, {}, {}, {}),
        ),
        (
            event_loop.encode_topic(TopicInfo("t", "b", {0: (1, 2)}, {}, {}, {0: (2,)})),
            TopicInfo("t", "b", {0: (1, 2)}, {}, {}, {0: (2,)}),
        ),
    ],
)
def test_topic_assignment_reads(raw: bytes, expected: TopicInfo) -> None:
    assert metadata_image.topic_info("t", raw) == expected


def test_admin_request_decoders_read_kafka_json():
    raw = b'{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1, "2"]}]}'
    assert values.decode_reassignment_request(raw) == [("t", 0, [1, 2])]
    assert values.decode_preferred_election_request(b'{"partitions": []}') == []
    with pytest.raises(AttributeError):
        values.decode_preferred_election_request(b"[]")


# ---- layering ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "module",
    [
        "services/controller/results.py",
        "services/controller/deletion.py",
        "services/controller/reassignment.py",
    ],
)
def test_split_controller_modules_are_pure(module: str):
    problems = [
        f"{' -> '.join(chain)}: {bad}"
        for path, chain in _reached(ROOT / module).items()
        for bad in _io_in(path)
    ]
    assert not problems, "\n".join(problems)


def test_values_module_imports_only_the_standard_json_and_typing():
    tree = parse_python(Path(ROOT / "coordinator" / "values.py").read_text())
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert imported <= {"__future__", "json", "typing"}, imported
