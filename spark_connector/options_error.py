"""The one error a bad data source option raises (spark_connector.options re-exports it).

Its own module so that the option parsers split out of options.py (kafka_tls.py) raise the
same class without importing options.py back.
"""

from __future__ import annotations


class OptionError(ValueError):
    """A data source option or an input column is wrong; the message names it."""
