"""The transaction coordinator's metrics (issue 41), exported by the broker that hosts it.
Open transactions and the LSO's lag per partition leader are the broker's (services/broker/metrics.py)."""

from __future__ import annotations

from prometheus_client import Counter

TRANSACTIONS_COMPLETED = Counter(
    "highwater_transactions_completed",
    "Transactions this broker's coordinator completed (markers written, CompleteCommit or "
    "CompleteAbort stored), by outcome",
    ["outcome"],
)
TRANSACTION_TIMEOUTS = Counter(
    "highwater_transaction_timeouts",
    "Transactions this broker's coordinator aborted because they outlived their transaction.timeout.ms",
)
