"""Two stateful stream-processing applications, one per framework, for test_stream_frameworks.py.

Run as a process: `python -m tests.integration.stream_framework_apps quix|faust BOOTSTRAP INPUT OUTPUT
GROUP STATE_DIR`. Each keeps, per key, a running sum of the events' amounts in its framework's
state (a quixstreams state store, a faust table), both with the framework's default settings, so
each creates and restores from its own compacted changelog topic. For every input event it writes
one output record {"key", "seq", "sum", "i"}: the key's state after the event.

Processing is at-least-once (both frameworks' default), so after a crash the events since the last
commit are processed again. Each event carries its per-key sequence number (1, 2, ...) and the state
keeps the last one applied, so a replayed event is not added twice: the state is exact whatever the
replay, and any output's sum equals the sum of its key's first `seq` amounts.

`quix-eos` is the same quixstreams application with `processing_guarantee="exactly-once"` (Kafka
transactions, served by the brokers' Kafka listener: issue 41) and no such guard: its state adds
every event it is given, so a replayed event would show as a wrong sum. test_stream_exactly_once.py.
With HOLD_AT_EVENT_ENV set to an event's number `i`, it stops once that event's output is sent,
inside its open transaction (the commit runs between messages, so it never comes): a SIGKILL then
always leaves an unfinished transaction behind, wherever the 5 s commit timer stood.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

HOLD_AT_EVENT_ENV = "STREAM_APP_HOLD_AT_EVENT"
# The longest a held application waits to be killed (the test kills it within seconds).
HOLD_MAX_S = 600.0


def apply(state: dict[str, Any] | None, event: dict[str, Any]) -> dict[str, Any]:
    """The key's new state after `event`: the event's amount added once, a replay ignored."""
    acc = state or {"key": event["key"], "seq": 0, "sum": 0}
    if event["seq"] > acc["seq"]:
        acc = {"key": event["key"], "seq": event["seq"], "sum": acc["sum"] + event["amount"]}
    return acc


def run_quix(bootstrap: str, input_topic: str, output_topic: str, group: str, state_dir: str) -> None:
    from quixstreams import Application, State

    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        state_dir=state_dir,
    )
    source = app.topic(input_topic, key_deserializer="str", value_deserializer="json")
    sink = app.topic(output_topic, key_serializer="str", value_serializer="json")

    def update(event: dict[str, Any], state: State[str, dict[str, Any]]) -> dict[str, Any]:
        acc = apply(state.get("acc"), event)
        state.set("acc", acc)
        return {**acc, "i": event["i"]}

    app.dataframe(source).apply(update, stateful=True).to_topic(sink)
    app.run()


def run_quix_eos(bootstrap: str, input_topic: str, output_topic: str, group: str, state_dir: str) -> None:
    from quixstreams import Application, State

    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        state_dir=state_dir,
        processing_guarantee="exactly-once",
    )
    source = app.topic(input_topic, key_deserializer="str", value_deserializer="json")
    sink = app.topic(output_topic, key_serializer="str", value_serializer="json")

    def update(event: dict[str, Any], state: State[str, int]) -> dict[str, Any]:
        total = state.get("sum", 0) + event["amount"]
        state.set("sum", total)
        return {"key": event["key"], "seq": event["seq"], "sum": total, "i": event["i"]}

    hold_at = int(os.environ.get(HOLD_AT_EVENT_ENV, "-1"))

    def hold(output: dict[str, Any]) -> None:
        if output["i"] == hold_at:
            # Blocks inside the open transaction until the test kills the process; bounded, so
            # an application the test forgot would still end its transaction and go on.
            threading.Event().wait(HOLD_MAX_S)

    app.dataframe(source).apply(update, stateful=True).to_topic(sink).update(hold)
    app.run()


def run_faust(bootstrap: str, input_topic: str, output_topic: str, group: str, state_dir: str) -> None:
    import faust

    # The web server (statistics pages on port 6066) is not needed and could collide with
    # another process on a shared machine; nothing else differs from faust's defaults.
    app = faust.App(group, broker=f"kafka://{bootstrap}", datadir=state_dir, web_enabled=False)
    source = app.topic(input_topic, key_serializer="raw", value_serializer="json")
    sink = app.topic(output_topic, key_serializer="raw", value_serializer="json")
    sums = app.Table("sums", default=None)

    @app.agent(source)
    async def process(stream: Any) -> None:
        async for event in stream:
            acc = apply(sums.get(event["key"]), event)
            sums[event["key"]] = acc
            await sink.send(key=event["key"].encode(), value={**acc, "i": event["i"]})

    faust.Worker(app, loglevel="info").execute_from_commandline()


def main(argv: list[str]) -> None:
    framework, bootstrap, input_topic, output_topic, group, state_dir = argv
    run = {"quix": run_quix, "quix-eos": run_quix_eos, "faust": run_faust}[framework]
    run(bootstrap, input_topic, output_topic, group, state_dir)


if __name__ == "__main__":
    main(sys.argv[1:])
