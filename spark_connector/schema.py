"""The rows the connector reads, as Spark's Kafka source has them, and their Arrow form.

    key binary, value binary, topic string, partition int, offset long,
    timestamp timestamp, timestampType int [, headers array<struct<key string, value binary>>]

timestampType is 0 for CreateTime and 1 for LogAppendTime, as Kafka numbers them.
Arrow batches handed to Spark must match its schema exactly (FACTS.md: int32 for INT,
timestamp[us, tz=UTC]); `arrow_schema` derives it with Spark's own converter so the
two cannot drift, and `records_to_arrow` builds every column at once from decoded
records (column-wise: one list per column, one pa.array per column, no row objects).
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

from clients.records import Record

HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))

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


def records_to_arrow(records: Sequence[Record], topic: str, partition: int, include_headers: bool
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
