"""The simulation's clock and event loop: one priority queue of (time_ms, seq, event), no real time.

Everything that happens in a run is an event taken off this queue in order; `seq`
breaks ties between events due at the same millisecond in the order they were
scheduled, so a run is a pure function of its seed. Nodes never read a clock of
their own: they read `loop.now_ms`.

A node can be up or down (crashed) and, while up, paused. Events for a paused node
wait in its backlog and run, in their original order, when it resumes (a stopped
process keeps its sockets: messages queue in the kernel, timers fire late). Events
for an incarnation that crashed are dropped: they belonged to a process that no
longer exists.

The trace keeps the last `trace_lines_max` lines, stored unformatted (formatting
costs more than the simulation step it describes) and formatted only when a run
fails or is asked to print.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import Any

# Lines of trace a failure report shows: enough to see a fault, the elections and
# fetches that followed, and the step that broke the rule.
TRACE_LINES_DEFAULT = 40


class Node:
    """Something that runs in the simulation: a broker, a controller candidate, a client."""

    def __init__(self, name: str, loop: EventLoop) -> None:
        self.name = name
        self.loop = loop
        self.up = True
        self.paused = False
        # Bumped on every crash/restart: events scheduled by an older incarnation are void.
        self.incarnation = 0
        self.backlog: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        # One token per reason the node is stopped (a pause fault, a slow disk write):
        # it runs again when every reason has ended.
        self._pause_tokens: set[int] = set()
        self._next_pause_token = 0

    # ---- timers ---------------------------------------------------------------------

    def after(self, delay_ms: int, fn: Callable[..., None], *args: Any) -> None:
        """Run fn(*args) on this node delay_ms from now, if this incarnation still lives then."""
        self.loop.schedule(self.loop.now_ms + max(0, delay_ms), self, self.incarnation, fn, args)

    # ---- faults ---------------------------------------------------------------------

    def pause(self) -> int:
        """Stop processing events; returns the token that resume() takes."""
        self._next_pause_token += 1
        self._pause_tokens.add(self._next_pause_token)
        self.paused = True
        return self._next_pause_token

    def resume(self, token: int) -> None:
        """End one pause; when none is left, replay the backlog now, in the order it arrived."""
        if token not in self._pause_tokens:
            return  # a pause of an incarnation that crashed since
        self._pause_tokens.discard(token)
        if self._pause_tokens:
            return
        self.paused = False
        backlog, self.backlog = self.backlog, []
        for fn, args in backlog:
            self.loop.schedule(self.loop.now_ms, self, self.incarnation, fn, args)

    def crash(self) -> None:
        self.up = False
        self.paused = False
        self._pause_tokens.clear()
        self.backlog = []
        self.incarnation += 1

    def restart(self) -> None:
        self.up = True
        self.incarnation += 1

    def trace(self, fmt: str, *args: object) -> None:
        self.loop.trace(self.name, fmt, args)


class EventLoop:
    """The discrete-event loop. Owns simulated time."""

    def __init__(self, *, trace_lines_max: int = TRACE_LINES_DEFAULT) -> None:
        self.now_ms = 0
        self._seq = 0
        self._queue: list[tuple[int, int, Node | None, int, Callable[..., None], tuple[Any, ...]]] = []
        self._trace: deque[tuple[int, str, str, tuple[object, ...]]] = deque(maxlen=trace_lines_max)
        self.events_run = 0
        # Called when time moves, before the events of the new millisecond (etcd's lease expiry).
        self.on_time: Callable[[int], None] = lambda now_ms: None
        # Called after every event with the node it ran on (None for global events): the checker.
        self.after_step: Callable[[Node | None], None] = lambda node: None

    def schedule(
        self, at_ms: int, node: Node | None, incarnation: int, fn: Callable[..., None], args: tuple[Any, ...]
    ) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at_ms, self._seq, node, incarnation, fn, args))

    def call_at(self, at_ms: int, fn: Callable[..., None], *args: Any) -> None:
        """A global event (a fault, a workload step): belongs to no node, always runs."""
        self.schedule(max(at_ms, self.now_ms), None, 0, fn, args)

    def run_until(self, end_ms: int) -> None:
        queue = self._queue
        while queue and queue[0][0] <= end_ms:
            at_ms, _, node, incarnation, fn, args = heapq.heappop(queue)
            if at_ms != self.now_ms:
                self.now_ms = at_ms
                self.on_time(at_ms)
            if node is not None:
                if not node.up or incarnation != node.incarnation:
                    continue  # the process this was meant for is gone
                if node.paused:
                    node.backlog.append((fn, args))
                    continue
            self.events_run += 1
            fn(*args)
            self.after_step(node)
        self.now_ms = max(self.now_ms, end_ms)

    # ---- trace ------------------------------------------------------------------------

    def trace(self, who: str, fmt: str, args: tuple[object, ...]) -> None:
        self._trace.append((self.now_ms, who, fmt, args))

    def trace_lines(self) -> list[str]:
        return [f"{at_ms:>8} ms  {who:<6} {_format(fmt, args)}" for at_ms, who, fmt, args in self._trace]


def _format(fmt: str, args: tuple[object, ...]) -> str:
    if not args:
        return fmt
    try:
        return fmt % args
    except (TypeError, ValueError):
        return f"{fmt} {args!r}"  # a malformed trace call must not hide the failure it reports
