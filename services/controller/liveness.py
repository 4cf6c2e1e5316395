"""Which broker incarnations lost their stream to the controller and did not come back in time.

Pure bookkeeping driven by the caller's clock (milliseconds); the asyncio adapter in
server.py (`BrokerConnectionWatch`) feeds it stream openings and closings and acts on
`due`: it revokes the lease of each incarnation returned, if etcd still names it.

An incarnation is (broker_id, broker_epoch). It may hold more than one stream for a
moment (a broker that reconnects after a blip may open the new stream before the
controller has seen the old one end), so open streams are counted: it is disconnected
only when the count falls to zero, and reconnected when it rises again within the grace
period. Only the incarnation that lost its streams is ever named: a re-registered broker
(a newer epoch) is another incarnation, and its arrival forgets the older ones of the
same broker id, whose leases are gone or going anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Incarnation = tuple[int, int]  # (broker_id, broker_epoch)


@dataclass
class BrokerConnections:
    """Open streams per incarnation and, for those with none left, when the last one ended."""

    grace_ms: int
    _open: dict[Incarnation, int] = field(default_factory=dict)
    _closed_at_ms: dict[Incarnation, int] = field(default_factory=dict)

    def opened(self, broker_id: int, broker_epoch: int) -> None:
        """A stream of this incarnation was accepted: it is connected (again)."""
        key = (broker_id, broker_epoch)
        self._closed_at_ms.pop(key, None)
        for older in [
            k for k in (*self._open, *self._closed_at_ms) if k[0] == broker_id and k[1] < broker_epoch
        ]:
            self._open.pop(older, None)
            self._closed_at_ms.pop(older, None)
        self._open[key] = self._open.get(key, 0) + 1

    def closed(self, broker_id: int, broker_epoch: int, now_ms: int) -> None:
        """A stream of this incarnation ended (cancelled, reset, or closed by the broker)."""
        key = (broker_id, broker_epoch)
        count = self._open.get(key)
        if count is None:
            return  # forgotten: a newer incarnation of the broker arrived meanwhile
        if count > 1:
            self._open[key] = count - 1
            return
        del self._open[key]
        self._closed_at_ms[key] = now_ms

    def connected(self, broker_id: int, broker_epoch: int) -> bool:
        return (broker_id, broker_epoch) in self._open

    def connected_count(self) -> int:
        """Incarnations with at least one stream open."""
        return len(self._open)

    def due(self, now_ms: int) -> list[Incarnation]:
        """Incarnations disconnected for the whole grace period, oldest first; each is returned once."""
        expired = sorted((at, key) for key, at in self._closed_at_ms.items() if now_ms - at >= self.grace_ms)
        for _, key in expired:
            del self._closed_at_ms[key]
        return [key for _, key in expired]

    def next_deadline_ms(self) -> int | None:
        """When the next disconnected incarnation's grace period ends (None: none is pending)."""
        if not self._closed_at_ms:
            return None
        return min(self._closed_at_ms.values()) + self.grace_ms
