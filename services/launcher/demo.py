"""The `highwater cluster up --demo` tour: create a topic, produce keyed records, read them back.

Shows in a few seconds that the whole path works (gateway -> leader -> ISR ->
high watermark -> consumer) and what the clients look like in use.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from clients.admin import Admin
from clients.common.errors import TopicAlreadyExists
from clients.consumer import Consumer
from clients.producer import Producer
from clients.types import TopicPartition

DEMO_TOPIC = "demo"
DEMO_PARTITIONS = 3
DEMO_RECORDS = 9
# How long the demo waits to read back what it produced.
DEMO_POLL_MS = 10_000
# One poll of that wait: short, so the loop notices it has read everything.
DEMO_POLL_STEP_MS = 500
DEMO_POLL_RECORDS_MAX = 1_000


def run_demo(bootstrap: str, console: Console, settings: dict[str, str] | None = None) -> None:
    """Create `demo` (3 partitions, RF 3 or fewer brokers), produce 9 keyed records, consume them.

    settings: extra client settings (TLS files, a token) for every client of the demo."""
    settings = settings or {}
    with Admin(bootstrap, **settings) as admin:
        brokers = len(admin.describe_cluster().brokers)
        try:
            admin.create_topics(DEMO_TOPIC, DEMO_PARTITIONS, min(3, max(brokers, 1)))
            console.print(f"created topic [bold]{DEMO_TOPIC}[/bold]")
        except TopicAlreadyExists:
            console.print(f"topic [bold]{DEMO_TOPIC}[/bold] exists")
    with Producer(bootstrap, **settings) as producer:
        futures = [
            producer.send(
                DEMO_TOPIC, f"hello {i}".encode(), key=f"user-{i % 3}".encode(), headers=[("source", b"demo")]
            )
            for i in range(DEMO_RECORDS)
        ]
        producer.flush()
        acked = [future.result() for future in futures]
    console.print(f"produced {len(acked)} records (acks=all, idempotent)")
    table = Table(title=f"consumed from {DEMO_TOPIC}", title_justify="left")
    for column in ("partition", "offset", "key", "value"):
        table.add_column(column)
    with Consumer(
        bootstrap=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False, **settings
    ) as consumer:
        partitions = [TopicPartition(DEMO_TOPIC, p) for p in consumer.partitions_for_topic(DEMO_TOPIC)]
        consumer.assign(partitions)
        ends = consumer.end_offsets(partitions)
        seen = 0
        deadline = time.monotonic() + DEMO_POLL_MS / 1000
        while time.monotonic() < deadline and any(consumer.position(tp) < ends[tp] for tp in partitions):
            for record in consumer.poll(timeout_ms=DEMO_POLL_STEP_MS, max_records=DEMO_POLL_RECORDS_MAX):
                seen += 1
                table.add_row(
                    str(record.partition),
                    str(record.offset),
                    (record.key or b"").decode(),
                    (record.value or b"").decode(),
                )
    console.print(table)
    console.print(f"consumed {seen} records; keys keep their partition, offsets grow per partition")
