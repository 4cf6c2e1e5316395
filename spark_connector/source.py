"""The data source Spark sees: `HighwaterDataSource`, short name "highwater".

Spark constructs it in a planner Python worker with the query's options and asks it
for a schema, readers and writers. Options are parsed (and checked) here, once, so a
bad option fails the query at planning with a message naming it.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from spark_connector.options import OptionError, parse_bool, parse_read_options, parse_write_options
from spark_connector.reader import HighwaterBatchReader, HighwaterFilteringBatchReader, HighwaterStreamReader
from spark_connector.schema import read_schema
from spark_connector.writer import (
    HighwaterBatchWriter,
    HighwaterStreamWriter,
    check_input_schema,
    check_topic_exists,
)

SHORT_NAME = "highwater"


class HighwaterDataSource(DataSource):
    """Read and write Highwater topics: spark.read / readStream / write / writeStream .format("highwater")."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def schema(self) -> StructType:
        lowered = {str(k).lower(): str(v) for k, v in self.options.items()}
        return read_schema(parse_bool(lowered, "includeHeaders", False))

    def _check_schema(self, schema: StructType) -> None:
        expected = self.schema()
        if schema != expected:
            raise OptionError(
                f"a Highwater read has a fixed schema ({expected.simpleString()}); "
                f"do not pass .schema(...): got {schema.simpleString()}"
            )

    def reader(self, schema: StructType) -> DataSourceReader:
        self._check_schema(schema)
        options = parse_read_options(self.options, streaming=False)
        return (
            HighwaterFilteringBatchReader(options) if options.push_filters else HighwaterBatchReader(options)
        )

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._check_schema(schema)
        return HighwaterStreamReader(parse_read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise OptionError(
                "save mode overwrite is not supported: records are appended to a log; use mode('append')"
            )
        options = parse_write_options(self.options)
        columns = check_input_schema(schema, options)
        check_topic_exists(options)
        return HighwaterBatchWriter(options, columns)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        if overwrite:
            raise OptionError(
                "output mode complete is not supported: records are appended to a log; "
                "use outputMode('append') or 'update'"
            )
        options = parse_write_options(self.options)
        columns = check_input_schema(schema, options)
        check_topic_exists(options)
        return HighwaterStreamWriter(options, columns)
