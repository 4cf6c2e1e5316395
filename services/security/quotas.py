"""Per-principal byte-rate quotas (Kafka's producer_byte_rate / consumer_byte_rate), pure.

One token bucket per (principal, kind): it fills at `rate_bytes_per_s` up to
`rate * burst_s`, and each request takes the bytes it moved. A request that
leaves the bucket below zero is still served (it already crossed the wire),
and its response says how long to stay quiet: `throttle_time_ms`, the time the
bucket needs to climb back to zero. That is Kafka's contract since KIP-219:
answer at once, tell the client to back off, and hold back the principal's
next request if it does not (`delay_ms`), so a client ignoring the hint gains
nothing.

Time is an argument (`now_ms`, monotonic); this module reads no clock and
holds no lock: the owner is the service's one event loop.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from services.common import limits


class QuotaKind(enum.Enum):
    PRODUCE = "produce"
    FETCH = "fetch"


@dataclass(slots=True)
class _Bucket:
    balance_bytes: float
    updated_ms: int
    throttled_until_ms: int = 0


class QuotaManager:
    """Token buckets per (principal, kind). A rate of 0 means unlimited (nothing is tracked)."""

    def __init__(
        self,
        *,
        produce_bytes_per_s: int = 0,
        fetch_bytes_per_s: int = 0,
        burst_s: float = limits.QUOTA_BURST_S,
        throttle_time_ms_max: int = limits.THROTTLE_TIME_MS_MAX,
        principals_max: int = limits.PRINCIPALS_TRACKED_MAX,
    ) -> None:
        if produce_bytes_per_s < 0 or fetch_bytes_per_s < 0:
            raise ValueError(
                f"quota rates must be >= 0, got produce {produce_bytes_per_s}, fetch {fetch_bytes_per_s}"
            )
        if burst_s <= 0:
            raise ValueError(f"burst_s must be > 0, got {burst_s}")
        self.rates = {QuotaKind.PRODUCE: produce_bytes_per_s, QuotaKind.FETCH: fetch_bytes_per_s}
        self.burst_s = burst_s
        self.throttle_time_ms_max = throttle_time_ms_max
        self.principals_max = principals_max
        # Insertion order = recency (moved to the end on every use): the first entry is the LRU.
        self._buckets: dict[tuple[str, QuotaKind], _Bucket] = {}

    def enabled(self, kind: QuotaKind) -> bool:
        return self.rates[kind] > 0

    def _bucket(self, principal: str, kind: QuotaKind, now_ms: int) -> _Bucket:
        rate = self.rates[kind]
        key = (principal, kind)
        bucket = self._buckets.pop(key, None)
        capacity = rate * self.burst_s
        if bucket is None:
            bucket = _Bucket(capacity, now_ms)
            if len(self._buckets) >= self.principals_max:
                del self._buckets[next(iter(self._buckets))]
        else:
            elapsed_ms = max(now_ms - bucket.updated_ms, 0)
            bucket.balance_bytes = min(capacity, bucket.balance_bytes + rate * elapsed_ms / 1000)
            bucket.updated_ms = now_ms
        self._buckets[key] = bucket
        return bucket

    def delay_ms(self, principal: str, kind: QuotaKind, now_ms: int) -> int:
        """How long to hold a request that arrived while its principal should still be backing off."""
        if not self.enabled(kind):
            return 0
        bucket = self._buckets.get((principal, kind))
        if bucket is None:
            return 0
        return max(bucket.throttled_until_ms - now_ms, 0)

    def record(self, principal: str, kind: QuotaKind, size_bytes: int, now_ms: int) -> int:
        """Charge `size_bytes` to the principal; return the throttle time (ms) its response should carry."""
        if not self.enabled(kind) or size_bytes <= 0:
            return 0
        rate = self.rates[kind]
        bucket = self._bucket(principal, kind, now_ms)
        bucket.balance_bytes -= size_bytes
        if bucket.balance_bytes >= 0:
            return 0
        throttle_ms = min(math.ceil(-bucket.balance_bytes * 1000 / rate), self.throttle_time_ms_max)
        bucket.throttled_until_ms = max(bucket.throttled_until_ms, now_ms + throttle_ms)
        return throttle_ms
