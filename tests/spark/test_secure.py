"""The connector on a cluster started with TLS and the ACL authorizer (--tls --authorizer acl).

One cluster for the module: TLS everywhere, `--authorizer acl`, User:admin a super user.
User:alice (a client certificate) may read and write the sspark- topics; User:mallory (a
client certificate) may only Describe them; User:tok (a bearer token, through the gateway's
client port) may do everything on them. Batch and streaming reads and writes run as each;
the refused ones fail with the ACL authorizer's refusal as a sentence naming the topic and
the operation. The token is an option whose name Spark redacts: explain() must not show it.
"""

from __future__ import annotations

import contextlib
import io
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pyspark.sql import functions as F

from clients.admin import Admin
from clients.consumer import Consumer
from clients.tools.cli import cli
from clients.types import TopicPartition
from protos.highwater.v1 import common_pb2
from spark_connector.gateway import GatewayClient
from spark_connector.options import parse_read_options
from tests.integration.conftest import TEST_LEASE_TTL_S, TestCluster
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.integration

QUERY_TIMEOUT_S = 90
ACL_PROPAGATION_TIMEOUT_S = 10
RECORDS = 60


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(
        tmp_path_factory.mktemp("spark-secure"),
        brokers=2,
        lease_ttl_s=TEST_LEASE_TTL_S,
        tls=True,
        service_args=["--authorizer", "acl", "--super-users", "User:admin"],
    )
    c.start()
    try:
        for name in ("alice", "mallory"):
            c.issue_client_certificate(name)
        with Admin(c.gateway_address, **c.client_settings("admin")) as admin:
            for topic in ("sspark-in", "sspark-out", "sspark-stream"):
                admin.create_topics(topic, 2, 2)
        acl(
            c,
            "add",
            "--principal",
            "User:alice",
            "--operation",
            "Read",
            "--operation",
            "Write",
            "--topic",
            "sspark-",
            "--prefixed",
        )
        acl(
            c,
            "add",
            "--principal",
            "User:mallory",
            "--operation",
            "Describe",
            "--topic",
            "sspark-",
            "--prefixed",
        )
        acl(c, "add", "--principal", "User:tok", "--operation", "All", "--topic", "sspark-", "--prefixed")
        wait_for(
            lambda: "sspark-in" in topics_seen(c, "mallory"),
            timeout_s=ACL_PROPAGATION_TIMEOUT_S,
            what="the ACLs to reach the gateway",
        )
        with Admin(c.gateway_address, **c.client_settings("admin")) as admin:
            admin_produce(c, "sspark-in", [f"in-{i}".encode() for i in range(RECORDS)])
        yield c
    finally:
        c.stop()


def acl(c: TestCluster, *args: str) -> None:
    """`highwater acl ARGS` as the super user User:admin, as an operator runs it."""
    result = CliRunner().invoke(
        cli, ["--bootstrap", c.gateway_address, "--tls-dir", str(c.tls_dir), "acl", *args]
    )
    assert result.exit_code == 0, (args, result.output)


def topics_seen(c: TestCluster, name: str) -> set[str]:
    with Admin(c.gateway_address, **c.client_settings(name)) as admin:
        return set(admin.list_topics())


def admin_produce(c: TestCluster, topic: str, values: list[bytes]) -> None:
    from clients.producer import Producer

    with Producer(c.gateway_address, linger_ms=0, **c.client_settings("admin")) as producer:
        futures = [producer.send(topic, v, partition=i % 2) for i, v in enumerate(values)]
        producer.flush()
        for future in futures:
            future.result()


def admin_read(c: TestCluster, topic: str) -> list[bytes]:
    """Every value of `topic` below its high watermark, read as the super user."""
    out: list[bytes] = []
    with Consumer(
        bootstrap=c.gateway_address,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **c.client_settings("admin"),
    ) as consumer:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            out.extend(r.value for r in consumer.poll(timeout_ms=500, max_records=10_000))
    return out


def cert_options(c: TestCluster, name: str) -> dict[str, str]:
    tls = Path(str(c.tls_dir))
    return {
        "bootstrap": c.gateway_address,
        "highwater.ssl.cafile": str(tls / "ca.pem"),
        "highwater.ssl.certfile": str(tls / f"{name}.pem"),
        "highwater.ssl.keyfile": str(tls / f"{name}-key.pem"),
    }


def token_options(c: TestCluster, token: str) -> dict[str, str]:
    # A token client has no certificate: it names the gateway's client port (TLS, no client certificate).
    return {
        "bootstrap": c.gateway_client_address,
        "highwater.ssl.cafile": str(Path(str(c.tls_dir)) / "ca.pem"),
        "highwater.auth.token": token,
    }


@pytest.fixture(scope="module")
def token(secure: TestCluster) -> str:
    with Admin(secure.gateway_address, **secure.client_settings("admin")) as admin:
        return str(admin.create_token("User:tok", 0).token)


def _fails(action: Any, *named: str) -> str:
    with pytest.raises(Exception) as info:
        action()
    message = str(info.value)
    for name in named:
        assert name in message, f"{name!r} not in: {message[:3000]}"
    return message


def test_batch_read_and_write_with_a_client_certificate_that_may(spark: Any, secure: TestCluster) -> None:
    options = cert_options(secure, "alice")
    rows = spark.read.format("highwater").options(subscribe="sspark-in", **options).load()
    assert sorted(r.value for r in rows.collect()) == sorted(f"in-{i}".encode() for i in range(RECORDS))
    rows.select("value").write.format("highwater").options(topic="sspark-out", **options).mode(
        "append"
    ).save()
    assert sorted(admin_read(secure, "sspark-out")) == sorted(f"in-{i}".encode() for i in range(RECORDS))


def test_a_principal_that_may_not_read_or_write_gets_the_authorizers_refusal(
    spark: Any, secure: TestCluster, tmp_path: Path
) -> None:
    options = cert_options(secure, "mallory")  # may Describe the topics, not Read or Write them
    _fails(
        lambda: spark.read.format("highwater").options(subscribe="sspark-in", **options).load().count(),
        "not authorized to Read topic 'sspark-in'",
        "TOPIC_AUTHORIZATION_FAILED",
        "highwater acl add",
    )
    values = spark.range(3).select(F.col("id").cast("string").alias("value"))
    _fails(
        lambda: values.write.format("highwater").options(topic="sspark-out", **options).mode("append").save(),
        "not authorized to Write topic 'sspark-out'",
        "TOPIC_AUTHORIZATION_FAILED",
    )
    query = (
        spark.readStream.format("highwater")
        .options(subscribe="sspark-in", startingOffsets="earliest", **options)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    _fails(lambda: query.awaitTermination(QUERY_TIMEOUT_S), "not authorized to Read topic 'sspark-in'")
    # A stream that alice reads and mallory writes: the write is refused.
    query = (
        spark.readStream.format("highwater")
        .options(subscribe="sspark-in", startingOffsets="earliest", **cert_options(secure, "alice"))
        .load()
        .select("value")
        .writeStream.format("highwater")
        .options(topic="sspark-out", **options)
        .option("checkpointLocation", str(tmp_path / "cp-write"))
        .trigger(availableNow=True)
        .start()
    )
    _fails(lambda: query.awaitTermination(QUERY_TIMEOUT_S), "not authorized to Write topic 'sspark-out'")
    # A principal the cluster does not know at all, and no credentials on a TLS cluster.
    _fails(
        lambda: (
            spark.read.format("highwater")
            .options(subscribe="sspark-in", **token_options(secure, "hwt.0.not-a-token"))
            .load()
            .count()
        ),
        "UNAUTHENTICATED",
        "highwater.auth.token",
    )
    _fails(
        lambda: (
            spark.read.format("highwater")
            .options(
                subscribe="sspark-in",
                bootstrap=secure.gateway_address,
                **{"highwater.connect.timeout.ms": "1500"},
            )
            .load()
            .count()
        ),
        "option 'bootstrap'",
        "highwater.ssl.cafile",
    )


def test_streaming_read_and_write_with_a_token(
    spark: Any, secure: TestCluster, token: str, tmp_path: Path
) -> None:
    options = token_options(secure, token)
    query = (
        spark.readStream.format("highwater")
        .options(subscribe="sspark-in", startingOffsets="earliest", maxOffsetsPerTrigger="25", **options)
        .load()
        .select("key", "value")
        .writeStream.format("highwater")
        .options(topic="sspark-stream", **options)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(QUERY_TIMEOUT_S)
    assert query.exception() is None
    assert sorted(admin_read(secure, "sspark-stream")) == sorted(f"in-{i}".encode() for i in range(RECORDS))


def test_explain_does_not_show_the_token(spark: Any, secure: TestCluster, token: str, tmp_path: Path) -> None:
    options = token_options(secure, token)
    batch = spark.read.format("highwater").options(subscribe="sspark-in", **options).load()
    stream = (
        spark.readStream.format("highwater")
        .options(subscribe="sspark-in", **options)
        .load()
        .writeStream.format("highwater")
        .options(topic="sspark-stream", **options)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        wait_for(
            lambda: stream.lastProgress is not None, timeout_s=QUERY_TIMEOUT_S, what="a first micro-batch"
        )
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown):
            batch.explain(extended=True)
            stream.explain(extended=True)
    finally:
        stream.stop()
    text = shown.getvalue()
    assert "sspark-in" in text or "highwater" in text.lower(), text  # explain did describe the plans
    assert token not in text and token.split(".")[-1] not in text, text
    # Wherever Spark prints a source's options (the UI, event logs, DESCRIBE), it redacts those
    # whose names match spark.redaction.regex; the token's option name is one of them.
    redaction = spark.sparkContext.getConf().get(
        "spark.redaction.regex", "(?i)secret|password|token|access[.]?key"
    )
    assert re.search(redaction, "highwater.auth.token")


def test_a_certificate_client_fetches_from_leaders_and_a_token_client_through_the_gateway(
    secure: TestCluster, token: str
) -> None:
    """Brokers' registered ports are mutual TLS: a certificate reaches the leaders there; a token
    alone could not, so it reads through the gateway's client port."""
    for options, direct in ((cert_options(secure, "alice"), True), (token_options(secure, token), False)):
        parsed = parse_read_options({**options, "subscribe": "sspark-in"}, streaming=False)
        with GatewayClient(parsed.bootstrap, parsed.client) as client:
            part = client.fetch_future(("sspark-in", 0), 0, 1 << 20)()
            assert part.error_code == common_pb2.NONE and len(bytes(part.records)) > 0
            assert bool(client._leader_channels) is direct  # which path the Fetch took
