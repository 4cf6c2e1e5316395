"""Failover between gateways, as rules: which address next, when to pause, when to give up.

Gateways are stateless, so any of them will do. Two drivers walk the same rules: the
asyncio client library (clients/connection.py) and the Spark connector's blocking client
(spark_connector/gateway.py). A call starts a `FailoverWalk` over the client's
`GatewayRotation`; each address that will not connect, or whose call ends because the
process is gone (UNAVAILABLE/CANCELLED), is `failed()`: the walk moves the rotation on,
and answers how long to pause before the next try (after every address failed once in a
round: the client's retry back-off) or None when the connect deadline has passed, and the
driver raises its own error naming `tried()`.

Pure: no clock (times are passed in), no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

PORT_MAX = 65_535


class BootstrapError(ValueError):
    """A bootstrap list that names no usable gateway address; the message says which part."""


def bootstrap_addresses(bootstrap: str | Sequence[str]) -> list[str]:
    """'host:port,host:port' (or a list of them) -> ['host:port', ...] without repeats, in order.

    Raises BootstrapError naming the malformed part, or when no address is given.
    """
    if isinstance(bootstrap, str):
        parts = [part.strip() for part in bootstrap.split(",")]
    elif isinstance(bootstrap, (list, tuple)):
        parts = [str(part).strip() for part in bootstrap]
    else:
        raise BootstrapError(
            f"bootstrap must be 'host:port,host:port' or a list, got {type(bootstrap).__name__}"
        )
    addresses: list[str] = []
    for part in parts:
        if not part:
            continue
        host, sep, port_text = part.rpartition(":")
        if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) <= PORT_MAX:
            raise BootstrapError(f"gateway address {part!r} is not host:port (port 1-{PORT_MAX})")
        if part not in addresses:
            addresses.append(part)
    if not addresses:
        raise BootstrapError(f"no gateway address in bootstrap {bootstrap!r}")
    return addresses


class GatewayRotation:
    """A client's gateway addresses and the one its calls go to now.

    Starts with the bootstrap addresses; Metadata may add the gateways it names after them.
    The current address stays until a call fails there, so a healthy client keeps one gateway.
    """

    def __init__(self, addresses: Sequence[str]) -> None:
        if not addresses:
            raise BootstrapError("a gateway rotation needs at least one address")
        self.addresses = list(dict.fromkeys(addresses))
        self._current = 0

    @property
    def current(self) -> str:
        return self.addresses[self._current]

    def learn(self, addresses: Sequence[str]) -> None:
        """Add gateways another answer named, after the known ones, for failover."""
        for address in addresses:
            if address not in self.addresses:
                self.addresses.append(address)

    def move_on(self) -> None:
        """The current gateway failed: the next call goes to the next address."""
        self._current = (self._current + 1) % len(self.addresses)

    def walk(self, connect_deadline: float, *, pause_s: float) -> FailoverWalk:
        """One call's walk over the addresses, given up at `connect_deadline` (the caller's
        clock, seconds), pausing `pause_s` after each round in which every address failed."""
        return FailoverWalk(self, connect_deadline, pause_s)


@dataclass
class FailoverWalk:
    """One call's attempts: which addresses failed and why, and when to stop."""

    rotation: GatewayRotation
    connect_deadline: float
    pause_s: float
    failures: dict[str, str] = field(default_factory=dict)
    tried_in_round: int = 0

    def failed(self, address: str, why: str, now: float) -> float | None:
        """`address` could not take the call (`why`, for the message): move on.

        Returns the seconds to wait before trying the next address (0.0: at once; the pause
        after a whole round, cut at the deadline), or None once the connect deadline has passed.
        """
        self.failures[address] = why
        self.rotation.move_on()
        self.tried_in_round += 1
        if now >= self.connect_deadline:
            return None
        if self.tried_in_round < len(self.rotation.addresses):
            return 0.0
        self.tried_in_round = 0
        return min(self.pause_s, max(0.0, self.connect_deadline - now))

    def tried(self) -> str:
        """Every address with why it failed ('not tried' for those the walk did not reach)."""
        return ", ".join(
            f"{address} ({self.failures.get(address, 'not tried')})" for address in self.rotation.addresses
        )
