"""The rows the connector reads, as Spark's Kafka source has them, and their Arrow form.

    key binary, value binary, topic string, partition int, offset long,
    timestamp timestamp, timestampType int [, headers array<struct<key string, value binary>>]

timestampType is 0 for CreateTime and 1 for LogAppendTime, as Kafka numbers them.
Arrow batches handed to Spark must match its schema exactly (FACTS.md: int32 for INT,
timestamp[us, tz=UTC]); `arrow_schema` derives it with Spark's own converter so the
two cannot drift. `columns_to_arrow` is the reader's path: spark_connector/columnar.py has
already decoded a Fetch response into Arrow arrays of the right types, and the topic and
partition columns are slices of arrays built once per task (`ConstantColumns`), so a
batch costs no work per row here. `records_to_arrow` builds the same batch from decoded
`Record`s (one list per column), for callers that have those.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from clients.common.errors import check
from clients.common.records import Record
from spark_connector import columnar
from spark_connector.columnar import RecordColumns

HEADER_TYPE = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
HEADERS_TYPE = ArrayType(HEADER_TYPE)

_BASE_FIELDS = [
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
]


def read_schema(include_headers: bool) -> StructType:
    return StructType(_BASE_FIELDS + ([StructField("headers", HEADERS_TYPE)] if include_headers else []))


@cache
def arrow_schema(include_headers: bool) -> pa.Schema:
    return to_arrow_schema(read_schema(include_headers), timezone="UTC")


def records_to_arrow(
    records: Sequence[Record], topic: str, partition: int, include_headers: bool
) -> pa.RecordBatch:
    """One Arrow batch of the read schema from decoded records of one partition."""
    schema = arrow_schema(include_headers)
    count = len(records)
    # Kafka timestamps are ms; Spark's are µs since the epoch in UTC.
    timestamps_us = pc.multiply(pa.array([r.timestamp_ms for r in records], pa.int64()), 1000)
    columns = [
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), count),
        pa.repeat(pa.scalar(partition, pa.int32()), count),
        pa.array([r.offset for r in records], pa.int64()),
        timestamps_us.cast(schema.field("timestamp").type),
        pa.array([r.timestamp_type for r in records], pa.int32()),
    ]
    if include_headers:
        columns.append(pa.array([r.headers for r in records], schema.field("headers").type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class ConstantColumns:
    """The topic and partition columns of one partition's batches: built once, sliced per batch.

    Spark's schema has `topic` as a plain string column (no dictionary), so every row
    carries the name's bytes; building that per batch cost ~6 ns a row (pa.repeat), a
    zero-copy slice of an array kept for the task costs nothing per row. Owned by one
    read_range call.
    """

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self._topic_column = pa.array([], pa.string())
        self._partition_column = pa.array([], pa.int32())

    def columns(self, rows: int) -> tuple[pa.Array, pa.Array]:
        if rows > len(self._topic_column):
            # Grow to the largest batch seen (a Fetch's worth of rows, ~80k for 100-byte records).
            self._topic_column = pa.repeat(pa.scalar(self.topic, pa.string()), rows)
            self._partition_column = pa.repeat(pa.scalar(self.partition, pa.int32()), rows)
        return self._topic_column.slice(0, rows), self._partition_column.slice(0, rows)


def columns_to_arrow(
    columns: RecordColumns, constants: ConstantColumns, include_headers: bool
) -> pa.RecordBatch:
    """One Arrow batch of the read schema from columns decoded by spark_connector.columnar
    (no copy of them)."""
    schema = arrow_schema(include_headers)
    topic, partition = constants.columns(len(columns))
    arrays = [
        columns.key,
        columns.value,
        topic,
        partition,
        columns.offset,
        columns.timestamp,
        columns.timestamp_type,
    ]
    if include_headers:
        check(columns.headers is not None, "columns_to_arrow: headers asked for but not decoded")
        arrays.append(columns.headers)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# spark_connector.columnar builds these types without importing Spark; they must be Spark's exactly
# (list field names included: Spark compares schemas before it takes a batch).
_SPARK_HEADERS = arrow_schema(True).field("headers").type
check(
    _SPARK_HEADERS.equals(columnar.HEADERS_TYPE)
    and _SPARK_HEADERS.value_field.name == columnar.HEADERS_TYPE.value_field.name,
    "spark_connector.columnar.HEADERS_TYPE %s is not Spark's %s",
    columnar.HEADERS_TYPE,
    _SPARK_HEADERS,
)
check(
    arrow_schema(False).field("timestamp").type.equals(columnar.TIMESTAMP_TYPE),
    "spark_connector.columnar.TIMESTAMP_TYPE %s is not Spark's %s",
    columnar.TIMESTAMP_TYPE,
    arrow_schema(False).field("timestamp").type,
)
