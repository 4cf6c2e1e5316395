"""The Kafka listener's per-client bounds an operator sets (`highwater broker --kafka-*`). Pure.

Kept apart from listener.py so the command line reads them without importing the listener.
Defaults and the reason for each are in services/common/limits.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from services.common import limits


@dataclass(frozen=True)
class KafkaListenerLimits:
    """connections_per_ip_overrides: {client address: its bound instead of connections_per_ip_max}."""

    connections_per_ip_max: int = limits.KAFKA_CONNECTIONS_PER_IP_MAX
    connections_per_ip_overrides: Mapping[str, int] = field(default_factory=dict)
    request_body_timeout_ms: int = limits.KAFKA_REQUEST_BODY_TIMEOUT_MS
    partial_frame_bytes_max: int = limits.KAFKA_PARTIAL_FRAME_BYTES_MAX

    def problem(self, request_bytes_max: int) -> str | None:
        """What is wrong with these bounds for a listener taking requests of up to
        `request_bytes_max` bytes, as a sentence naming the flags; None when nothing is."""
        if self.partial_frame_bytes_max < request_bytes_max:
            return (
                f"--kafka-partial-frame-bytes-max ({self.partial_frame_bytes_max}) must be at least the "
                f"largest request ({request_bytes_max} bytes, --max-request-bytes or its default), or "
                "such a request could never be read; raise it"
            )
        if self.request_body_timeout_ms <= 0:
            return f"--kafka-request-body-timeout-ms must be > 0, got {self.request_body_timeout_ms}"
        if self.connections_per_ip_max < 0 or any(n < 0 for n in self.connections_per_ip_overrides.values()):
            return "--kafka-connections-per-ip-max and its overrides must be >= 0"
        return None


def parse_connection_overrides(text: str) -> dict[str, int]:
    """Kafka's max.connections.per.ip.overrides: "address:count[,address:count...]" -> {address: count}.

    The count is after the last colon, so IPv6 addresses ("::1:500") read too. Raises ValueError
    saying which entry is wrong."""
    overrides: dict[str, int] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        address, sep, count = entry.rpartition(":")
        if not sep or not address.strip() or not count.strip().isdigit():
            raise ValueError(f"connection override {entry!r} is not address:count (e.g. 127.0.0.2:500)")
        overrides[address.strip()] = int(count)
    return overrides
