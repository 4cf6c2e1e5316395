"""`cluster up --tls` on a TLS directory of the previous release (services/security/certs.py).

The previous release wrote the CAs' private keys beside the certificates, in the directory every
service reads. A cluster restarted on such a directory must keep its CAs (a new CA would orphan
every client certificate already handed out) and start; the keys are moved into ca-private/
(0700), every private key is left 0600, and the cluster serves Kafka clients with the
certificates it had, and with new ones signed by the same CA.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest

from services.security.certs import ensure_local_pki
from tests.integration.conftest import TEST_LEASE_TTL_S, TestCluster

pytestmark = pytest.mark.integration

STEP_TIMEOUT_S = 30.0
SERVICES = ("etcd", "admin", "controller-1", "broker-1", "gateway-1")
# The previous release's names, spelled out: this is the layout it wrote, whatever certs.py does now.
CA_KEY_FILES = ("ca-key.pem", "etcd-client-ca-key.pem")
CA_PRIVATE_DIR = "ca-private"


def previous_release_tls_dir(tls_dir: Path) -> None:
    """The files `cluster up --tls` of the previous release left: CA keys at the top level, here
    also readable by everyone (as a `cp -r` under umask 022 leaves them)."""
    ensure_local_pki(tls_dir, SERVICES, etcd_clients=SERVICES)
    for name in CA_KEY_FILES:
        (kept,) = tls_dir.rglob(name)
        os.replace(kept, tls_dir / name)
        (tls_dir / name).chmod(0o644)
    if (tls_dir / CA_PRIVATE_DIR).exists():
        (tls_dir / CA_PRIVATE_DIR).rmdir()
    (tls_dir / "admin-key.pem").chmod(0o644)


def kafka_config(c: TestCluster, name: str, **extra: Any) -> dict[str, Any]:
    settings = c.client_settings(name)
    return {
        "bootstrap.servers": c.kafka_bootstrap(),
        "security.protocol": "SSL",
        "ssl.ca.location": settings["ssl_cafile"],
        "ssl.certificate.location": settings["ssl_certfile"],
        "ssl.key.location": settings["ssl_keyfile"],
        "socket.timeout.ms": 10_000,
        **extra,
    }


def test_a_cluster_on_a_tls_directory_of_the_previous_release_starts_with_its_cas_and_hides_their_keys(
    tmp_path: Path,
) -> None:
    tls_dir = tmp_path / "cluster" / "tls"
    previous_release_tls_dir(tls_dir)
    ca_before = (tls_dir / "ca.pem").read_bytes()
    admin_before = (tls_dir / "admin.pem").read_bytes()

    c = TestCluster(tmp_path / "cluster", brokers=1, lease_ttl_s=TEST_LEASE_TTL_S, tls=True)
    try:
        c.start()
        assert (tls_dir / "ca.pem").read_bytes() == ca_before, "the CA was made again"
        assert (tls_dir / "admin.pem").read_bytes() == admin_before, "a certificate was made again"
        assert sorted(p.name for p in tls_dir.iterdir() if p.name in CA_KEY_FILES) == []
        assert stat.S_IMODE((tls_dir / CA_PRIVATE_DIR).stat().st_mode) == 0o700
        keys = [p for p in tls_dir.rglob("*-key.pem")]
        assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in keys} == {p.name: "0o600" for p in keys}

        # The old admin certificate and a new one from the kept CA both reach the Kafka listener.
        c.issue_client_certificate("alice")
        for name in ("admin", "alice"):
            producer = confluent_kafka.Producer(kafka_config(c, name))
            assert producer.list_topics(timeout=STEP_TIMEOUT_S).brokers, f"{name} gets Metadata"
    finally:
        c.stop()


# etcd's JSON gateway, when it ran, dialled etcd's own client port about once a second from the
# start: three seconds of etcd's log show its refusals (issue 43).
ETCD_SELF_CONNECTION_WATCH_S = 3.0


def test_etcd_of_a_tls_cluster_refuses_no_connection_of_its_own(tmp_path: Path) -> None:
    """etcd trusts the etcd client CA only, and its server certificate comes from the cluster
    CA: anything etcd dials at itself with that certificate is refused ("x509: certificate
    signed by unknown authority" over and over in its log, as a fresh `cluster up --tls` had).
    The services' connections must work, and etcd must refuse nothing while only they connect."""
    import asyncio
    import time

    from coordinator.store import EtcdStore
    from services.launcher.local_cluster import LocalCluster

    cluster = LocalCluster(tmp_path / "cluster", brokers=1, tls=True)
    etcd = cluster.etcd
    etcd.start()
    try:

        async def write_and_read() -> bytes | None:
            store = await EtcdStore.connect(etcd.endpoint, tls=cluster.etcd_tls(), timeout_s=STEP_TIMEOUT_S)
            try:
                await store.put("/probe", b"ok")
                found = await store.get("/probe")
                return found.value if found is not None else None
            finally:
                await store.close()

        assert asyncio.run(write_and_read()) == b"ok"
        log = tmp_path / "cluster" / "logs" / "etcd.log"
        deadline = time.monotonic() + ETCD_SELF_CONNECTION_WATCH_S
        while time.monotonic() < deadline:
            refused = [line for line in log.read_text().splitlines() if "rejected connection" in line]
            assert not refused, f"etcd refused a connection of its own: {refused[0]}"
            time.sleep(0.2)
    finally:
        etcd.stop()
