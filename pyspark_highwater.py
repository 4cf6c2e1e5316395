"""Automatic registration of the Highwater data source in PySpark 4.

On the first Python data source lookup, Spark imports every top-level module whose
name starts with `pyspark_` and registers its `DefaultSource` under
DefaultSource.name(), here "highwater" (pyspark/sql/worker/lookup_data_sources.py).
So once the package is installed where Spark's Python workers run, `format("highwater")`
works with no code. Spark finds modules with pkgutil.iter_modules(), which sees
regular installs and directories on the Python path but not setuptools' default
editable installs: see docs/SPARK.md.

The lookup runs in Spark's Python workers: if their interpreter cannot import this
module, Spark reports only DATA_SOURCE_NOT_FOUND. `spark_connector.configure(builder)`
makes the workers run this interpreter, and `spark_connector.check_spark_session(spark)`
names what to set when they do not.
"""

from spark_connector.source import HighwaterDataSource as DefaultSource

__all__ = ["DefaultSource"]
