"""Format versions of what Highwater stores (docs/UPGRADING.md): old values read, newer ones refused.

Every persistent structure reads as its current version when it was written before versions
were recorded (the release of 2026-11-23 wrote them so), and a version this release does not
know stops the reader with a message naming the file or value, the version found, the
versions this release reads, and what to do; never a silent reset or a skipped value.
"""

from __future__ import annotations

import json

import pytest

from coordinator import values
from services.broker.core import RUN_MARKER_FILE
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.log.checkpoints import (
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    CheckpointVersionError,
    HighWatermarkCheckpoint,
    UnknownFileVersion,
    read_offset,
)
from tests.unit.broker_seams import Broker

# ---- etcd values: as the release of 2026-11-23 wrote them -----------------------------------------

OLD_TOPIC = (
    b'{"version": 1, "topic_id": "id-1", "partitions": {"0": [1, 2]}, '
    b'"adding_replicas": {}, "removing_replicas": {}}'
)
OLD_PARTITION_STATE = b'{"leader": 2, "leader_epoch": 7, "isr": [2, 3], "controller_epoch": 4}'
OLD_OFFSET = b'{"offset": 5, "metadata": "m", "leader_epoch": 3, "commit_time_ms": 1000}'
OLD_PRODUCER_ID_BLOCK = b'{"next": 2000}'


def with_version(raw: bytes, version: object) -> bytes:
    return json.dumps({**json.loads(raw), "version": version}).encode()


def test_values_written_before_versions_read_as_version_1() -> None:
    assert values.decode_topic_assignment(OLD_TOPIC)["partitions"] == {0: (1, 2)}
    assert values.decode_partition_state(OLD_PARTITION_STATE)["isr"] == (2, 3)
    assert values.decode_consumer_offset(OLD_OFFSET) == {
        "offset": 5,
        "metadata": "m",
        "leader_epoch": 3,
        "commit_time_ms": 1000,
    }
    assert values.decode_producer_id_block(OLD_PRODUCER_ID_BLOCK) == 2000


def test_values_with_version_1_read_and_the_version_is_not_part_of_an_offset() -> None:
    assert values.decode_partition_state(with_version(OLD_PARTITION_STATE, 1))["leader"] == 2
    assert "version" not in values.decode_consumer_offset(with_version(OLD_OFFSET, 1))
    assert values.decode_producer_id_block(with_version(OLD_PRODUCER_ID_BLOCK, 1)) == 2000


@pytest.mark.parametrize(
    ("what", "raw", "decode"),
    [
        ("topic assignment", OLD_TOPIC, values.decode_topic_assignment),
        ("partition state", OLD_PARTITION_STATE, values.decode_partition_state),
        ("committed offset", OLD_OFFSET, values.decode_consumer_offset),
        ("producer id block", OLD_PRODUCER_ID_BLOCK, values.decode_producer_id_block),
    ],
)
@pytest.mark.parametrize("future", [2, "2", None])
def test_a_value_from_a_newer_release_is_refused_not_skipped_as_malformed(
    what: str, raw: bytes, decode: object, future: object
) -> None:
    assert callable(decode)
    with pytest.raises(values.UnknownFormatVersion) as caught:
        decode(with_version(raw, future))
    message = str(caught.value)
    assert message.startswith("UNKNOWN_FORMAT_VERSION: ")
    assert what in message and f"format version {future!r}" in message
    assert "this release reads version(s) 1" in message and "docs/UPGRADING.md" in message
    # Not a ValueError: callers that skip malformed values must not skip this one.
    assert not isinstance(caught.value, (ValueError, KeyError, TypeError))


# ---- checkpoint files ----------------------------------------------------------------------------


def test_a_checkpoint_of_a_newer_version_names_the_file_and_the_versions() -> None:
    storage = MemoryStorage()
    storage.mkdir("/data/t-0")
    path = f"/data/t-0/{LOG_START_OFFSET_CHECKPOINT}"
    storage.write_atomic(path, b"0\n1\n42\n")
    assert read_offset(storage, path) == 42, "Kafka's version 0"
    storage.write_atomic(path, b"1\n1\n42\n")
    assert read_offset(storage, path) == 42, "version 1: a compacted log's (checkpoints.py)"
    storage.write_atomic(path, b"2\n1\n42\n")
    with pytest.raises(CheckpointVersionError) as caught:
        read_offset(storage, path)
    assert f"checkpoint {path} has format version 2; this release reads version(s) 0, 1" in str(caught.value)


def test_a_log_with_a_newer_leader_epoch_checkpoint_does_not_open() -> None:
    storage = MemoryStorage()
    log = Log.open("/data/t-0", LogConfig(), storage=storage, now_ms=0)
    log.close()
    storage.write_atomic(f"/data/t-0/{LEADER_EPOCH_CHECKPOINT}", b"7\n1\n0 0\n")
    with pytest.raises(CheckpointVersionError):
        Log.open("/data/t-0", LogConfig(), storage=storage, now_ms=0)


def test_a_newer_high_watermark_checkpoint_stops_the_broker_instead_of_resetting_every_hw() -> None:
    storage = MemoryStorage()
    storage.mkdir("/data")
    path = f"/data/{REPLICATION_OFFSET_CHECKPOINT}"
    storage.write_atomic(path, b"2\n1\nt 0 7\n")
    with pytest.raises(CheckpointVersionError):
        HighWatermarkCheckpoint(storage, "/data")
    assert storage.read_file(path) == b"2\n1\nt 0 7\n", "the newer release's file is left as it was"
    # Damage, unlike a newer version, still costs only the HWs (the broker starts).
    storage.write_atomic(path, b"0\n5\nt 0\n")
    assert HighWatermarkCheckpoint(storage, "/data", warn=lambda *a: None).stored_at_start(("t", 0)) == 0


# ---- the broker's start record (run marker) ------------------------------------------------------


def test_a_run_marker_written_before_versions_reads_as_version_1() -> None:
    storage = MemoryStorage()
    storage.mkdir("/data/b1")
    storage.write_atomic(f"/data/b1/{RUN_MARKER_FILE}", b'{"clean": true, "boot_id": "boot-1"}')
    previous = Broker(1, storage=storage).core.start("boot-2")
    assert previous.clean and not previous.unclean_shutdown
    written = json.loads(storage.read_file(f"/data/b1/{RUN_MARKER_FILE}"))
    assert written == {"version": 1, "clean": False, "boot_id": "boot-2"}


def test_a_run_marker_of_a_newer_version_stops_the_start() -> None:
    storage = MemoryStorage()
    storage.mkdir("/data/b1")
    marker = b'{"version": 2, "clean": true, "boot_id": "boot-1"}'
    storage.write_atomic(f"/data/b1/{RUN_MARKER_FILE}", marker)
    with pytest.raises(UnknownFileVersion) as caught:
        Broker(1, storage=storage).core.start("boot-2")
    assert f"{RUN_MARKER_FILE} has format version 2; this release reads version(s) 1" in str(caught.value)
    assert storage.read_file(f"/data/b1/{RUN_MARKER_FILE}") == marker, "left for the newer release"
