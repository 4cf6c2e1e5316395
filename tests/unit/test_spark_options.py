"""Spark's Kafka options a ported job passes, parsed as docs/SPARK.md's table says (no Spark, no cluster).

kafka.security.protocol and kafka.ssl.* stores (PEM, PKCS12, JKS; JCEKS refused with the
keytool command) become the connector's TLS material; kafka.group.id / groupIdPrefix are kept for the
reader's group check; Kafka client settings that change nothing here are accepted, those that
would change semantics are refused with why. The certificates come from
services/security/certs.py's local PKI; the PKCS12 files are written with `cryptography`, and
with Java's keytool when it is installed (what a Spark user's stores are made with: JKS ones too).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from services.security.certs import ensure_local_pki
from spark_connector import options as spark_options
from spark_connector.options import OptionError, parse_read_options, parse_write_options

BASE = {"bootstrap": "127.0.0.1:9092"}
READ = {**BASE, "subscribe": "t"}
WRITE = {**BASE, "topic": "t"}
PASSWORD = "changeit"  # keytool's customary store password
KEYTOOL_TIMEOUT_S = 60
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.pem, alice.pem, alice-key.pem from the local PKI, and Kafka-style stores made of them."""
    directory = tmp_path_factory.mktemp("kafka-tls")
    ensure_local_pki(directory, ["alice"])
    ca = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    cert = x509.load_pem_x509_certificate((directory / "alice.pem").read_bytes())
    key = serialization.load_pem_private_key((directory / "alice-key.pem").read_bytes(), None)
    encryption = serialization.BestAvailableEncryption(PASSWORD.encode())
    (directory / "keystore.p12").write_bytes(
        pkcs12.serialize_key_and_certificates(b"alice", key, cert, [ca], encryption)  # type: ignore[arg-type]
    )
    (directory / "truststore.p12").write_bytes(
        pkcs12.serialize_key_and_certificates(b"ca", None, None, [ca], encryption)
    )
    # Kafka's PEM key store: the (here encrypted) key and the chain in one file.
    encrypted = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    (directory / "keystore.pem").write_bytes(encrypted + (directory / "alice.pem").read_bytes())
    return directory


def ssl_options(**kafka_ssl: str) -> dict[str, str]:
    return {
        "kafka.security.protocol": "SSL",
        **{f"kafka.ssl.{k.replace('_', '.')}": v for k, v in kafka_ssl.items()},
    }


def test_plaintext_is_accepted_and_changes_nothing() -> None:
    for protocol in ("PLAINTEXT", "plaintext"):
        read = parse_read_options({**READ, "kafka.security.protocol": protocol}, streaming=False)
        assert not read.client.secure
        assert not parse_write_options({**WRITE, "kafka.security.protocol": protocol}).client.secure


def test_pkcs12_stores_become_the_clients_tls_material(pki: Path) -> None:
    options = ssl_options(
        truststore_location=str(pki / "truststore.p12"),
        truststore_type="PKCS12",
        truststore_password=PASSWORD,
        keystore_location=str(pki / "keystore.p12"),
        keystore_type="PKCS12",
        keystore_password=PASSWORD,
        key_password=PASSWORD,
    )
    client = parse_read_options({**READ, **options}, streaming=False).client
    ca = x509.load_pem_x509_certificate((pki / "ca.pem").read_bytes())
    alice = x509.load_pem_x509_certificate((pki / "alice.pem").read_bytes())
    assert client.ca_cert is not None and x509.load_pem_x509_certificates(client.ca_cert) == [ca]
    assert client.cert_chain is not None and x509.load_pem_x509_certificates(client.cert_chain)[0] == alice
    assert client.private_key is not None and b"ENCRYPTED" not in client.private_key
    key = serialization.load_pem_private_key(client.private_key, None)
    assert key.public_key() == alice.public_key()
    assert PASSWORD not in repr(client) and b"PRIVATE" not in repr(client).encode()
    # The writer takes the same stores; the type may be left out (recognised from the bytes).
    options.pop("kafka.ssl.truststore.type")
    assert parse_write_options({**WRITE, **options}).client.cert_chain == client.cert_chain
    # Kafka's default type, JKS, on a PKCS12 file: Java opens it (keystore.type.compat), and so does this.
    as_jks = {**options, "kafka.ssl.truststore.type": "JKS", "kafka.ssl.keystore.type": "JKS"}
    assert parse_read_options({**READ, **as_jks}, streaming=False).client == client


def test_pem_stores_with_an_encrypted_key_and_inline_pem(pki: Path) -> None:
    client = parse_read_options(
        {
            **READ,
            **ssl_options(
                truststore_location=str(pki / "ca.pem"),
                truststore_type="PEM",
                keystore_location=str(pki / "keystore.pem"),
                keystore_type="PEM",
                key_password=PASSWORD,
            ),
        },
        streaming=False,
    ).client
    assert client.ca_cert == (pki / "ca.pem").read_bytes()
    assert client.private_key is not None and b"ENCRYPTED" not in client.private_key
    inline = parse_read_options(
        {
            **READ,
            **ssl_options(
                truststore_certificates=(pki / "ca.pem").read_text(),
                keystore_certificate_chain=(pki / "alice.pem").read_text(),
                keystore_key=(pki / "alice-key.pem").read_text(),
            ),
        },
        streaming=False,
    ).client
    assert inline.ca_cert == client.ca_cert and inline.cert_chain == client.cert_chain
    with pytest.raises(OptionError, match=r"kafka\.ssl\.key\.password"):
        parse_read_options(
            {
                **READ,
                **ssl_options(
                    truststore_location=str(pki / "ca.pem"), keystore_location=str(pki / "keystore.pem")
                ),
            },
            streaming=False,
        )


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"kafka.security.protocol": "SSL"}, r"is SSL but no CA is given.*kafka\.ssl\.truststore\.location"),
        ({"kafka.security.protocol": "SASL_SSL"}, r"highwater\.auth\.token.*not SASL"),
        ({"kafka.security.protocol": "TLS"}, r"must be PLAINTEXT or SSL"),
        ({"kafka.ssl.truststore.location": "ca.pem"}, r"kafka\.security\.protocol=SSL"),
        (
            {**ssl_options(truststore_type="PEM")},
            r"'kafka\.ssl\.truststore\.type' needs kafka\.ssl\.truststore\.location",
        ),
        ({**ssl_options(cipher_suites="X")}, r"'kafka\.ssl\.cipher\.suites' has no Highwater meaning"),
        ({**ssl_options(protocol="TLSv1.1")}, r"kafka\.ssl\.protocol.*TLSv1\.2 or TLSv1\.3"),
        (
            {**ssl_options(endpoint_identification_algorithm="")},
            r"endpoint\.identification\.algorithm.*names",
        ),
        ({**ssl_options(truststore_location="/no/such/file")}, r"truststore\.location.*cannot read"),
    ],
)
def test_tls_options_that_cannot_work_are_refused_by_name(options: dict[str, str], named: str) -> None:
    with pytest.raises(OptionError, match=named):
        parse_read_options({**READ, **options}, streaming=False)


def test_contradicting_tls_options_and_wrong_passwords_are_refused(pki: Path) -> None:
    trust = ssl_options(truststore_location=str(pki / "truststore.p12"), truststore_password=PASSWORD)
    with pytest.raises(OptionError, match=r"both give TLS material"):
        parse_read_options({**READ, **trust, "highwater.ssl.cafile": str(pki / "ca.pem")}, streaming=False)
    with pytest.raises(OptionError, match=r"PLAINTEXT, but highwater\.ssl"):
        parse_read_options(
            {**READ, "kafka.security.protocol": "PLAINTEXT", "highwater.ssl.cafile": str(pki / "ca.pem")},
            streaming=False,
        )
    with pytest.raises(OptionError, match=r"truststore\.location.*could not be opened with the password"):
        parse_read_options({**READ, **trust, "kafka.ssl.truststore.password": "wrong"}, streaming=False)
    with pytest.raises(OptionError, match=r"says PKCS12, but .* is a PEM file"):
        parse_read_options(
            {**READ, **ssl_options(truststore_location=str(pki / "ca.pem"), truststore_type="PKCS12")},
            streaming=False,
        )
    # highwater.ssl.cafile with kafka.security.protocol=SSL is fine: SSL names the CA's source, not its form.
    both = parse_read_options(
        {**READ, "kafka.security.protocol": "SSL", "highwater.ssl.cafile": str(pki / "ca.pem")},
        streaming=False,
    )
    assert both.client.ca_cert == (pki / "ca.pem").read_bytes()


KEY_PASSWORD = "key-secret"  # a key password unlike the store's (keytool -destkeypass)
needs_keytool = pytest.mark.skipif(shutil.which("keytool") is None, reason="Java's keytool is not installed")


def keytool(*arguments: str) -> None:
    subprocess.run(["keytool", *arguments], check=True, capture_output=True, timeout=KEYTOOL_TIMEOUT_S)


@pytest.fixture(scope="module")
def java_stores(pki: Path) -> Path:
    """Stores made by Java's keytool, as a Spark user has them: JKS (and PKCS12, JCEKS) files.

    truststore.{jks,pkcs12,jceks}: the CA as a trusted certificate entry. keystore.jks: alice's key
    and chain imported from keystore.p12, the key protected by the store password (keytool's
    default); keystore-keypass.jks: the same with its own key password.
    """
    for store_type in ("JKS", "PKCS12", "JCEKS"):
        keytool(
            *("-importcert", "-noprompt", "-alias", "ca", "-file", str(pki / "ca.pem")),
            *("-keystore", str(pki / f"truststore.{store_type.lower()}"), "-storetype", store_type),
            *("-storepass", PASSWORD),
        )
    source = ("-srckeystore", str(pki / "keystore.p12"), "-srcstoretype", "PKCS12", "-srcstorepass", PASSWORD)
    destination = ("-deststoretype", "JKS", "-deststorepass", PASSWORD, "-destkeystore")
    keytool("-importkeystore", "-noprompt", *source, *destination, str(pki / "keystore.jks"))
    keytool(
        *("-importkeystore", "-noprompt", *source, "-srcalias", "alice", "-destkeypass", KEY_PASSWORD),
        *destination,
        str(pki / "keystore-keypass.jks"),
    )
    return pki


def _keystore_options(pki: Path, store: str, **passwords: str) -> dict[str, str]:
    return {
        **READ,
        **ssl_options(
            truststore_location=str(pki / "truststore.jks"),
            keystore_location=str(pki / store),
            keystore_type="JKS",
            **passwords,
        ),
    }


@needs_keytool
def test_keytool_jks_stores_become_the_same_pem_as_the_originals(java_stores: Path) -> None:
    """A JKS truststore and keystore give the CA, alice's chain and her key, byte for byte."""
    pki = java_stores
    for name in ("truststore.jks", "keystore.jks", "keystore-keypass.jks"):  # real JKS files, not PKCS12
        assert (pki / name).read_bytes().startswith(b"\xfe\xed\xfe\xed"), name
    ca = x509.load_pem_x509_certificate((pki / "ca.pem").read_bytes())
    alice = x509.load_pem_x509_certificate((pki / "alice.pem").read_bytes())
    key_pem = serialization.load_pem_private_key((pki / "alice-key.pem").read_bytes(), None).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    chain_pem = alice.public_bytes(serialization.Encoding.PEM) + ca_pem
    for store, passwords in (
        # The key password falls back to the store's, as Java's key managers do.
        ("keystore.jks", {"truststore_password": PASSWORD, "keystore_password": PASSWORD}),
        ("keystore.jks", {"keystore_password": PASSWORD, "key_password": PASSWORD}),
        # Without a truststore password Java skips the integrity check, and so does this.
        ("keystore-keypass.jks", {"keystore_password": PASSWORD, "key_password": KEY_PASSWORD}),
    ):
        client = parse_read_options(_keystore_options(pki, store, **passwords), streaming=False).client
        assert (client.ca_cert, client.cert_chain, client.private_key) == (ca_pem, chain_pem, key_pem), store
    # The type may be left out (recognised by the magic number), or be PKCS12 (Java opens JKS as PKCS12).
    for truststore_type in ({}, {"truststore_type": "PKCS12"}):
        options = {**READ, **ssl_options(truststore_location=str(pki / "truststore.jks"), **truststore_type)}
        assert parse_write_options({**WRITE, **options}).client.ca_cert == ca_pem


@needs_keytool
def test_jks_wrong_passwords_and_a_tampered_file_are_refused_by_option(java_stores: Path) -> None:
    pki = java_stores
    trust = ssl_options(truststore_location=str(pki / "truststore.jks"), truststore_password="wrong")
    with pytest.raises(OptionError, match=r"'kafka\.ssl\.truststore\.password'.*password is wrong"):
        parse_read_options({**READ, **trust}, streaming=False)
    with pytest.raises(OptionError, match=r"'kafka\.ssl\.keystore\.password'.*password is wrong"):
        parse_read_options(_keystore_options(pki, "keystore.jks", keystore_password="wrong"), streaming=False)
    with pytest.raises(
        OptionError, match=r"'kafka\.ssl\.key\.password'.*does not open the private key 'alice'"
    ):
        parse_read_options(
            _keystore_options(pki, "keystore-keypass.jks", keystore_password=PASSWORD, key_password="wrong"),
            streaming=False,
        )
    # The key's own password differs from the store's: the fallback fails and says what to set.
    with pytest.raises(OptionError, match=r"'kafka\.ssl\.keystore\.password'.*set kafka\.ssl\.key\.password"):
        parse_read_options(
            _keystore_options(pki, "keystore-keypass.jks", keystore_password=PASSWORD), streaming=False
        )
    with pytest.raises(OptionError, match=r"keystore\.location.*protected by a password.*key\.password"):
        parse_read_options(_keystore_options(pki, "keystore.jks"), streaming=False)
    # One byte of the certificate changed: the digest over the file no longer matches.
    tampered = bytearray((pki / "truststore.jks").read_bytes())
    tampered[len(tampered) // 2] ^= 0x01
    (pki / "tampered.jks").write_bytes(bytes(tampered))
    with pytest.raises(OptionError, match=r"'kafka\.ssl\.truststore\.password'.*file was altered"):
        parse_read_options(
            {
                **READ,
                **ssl_options(truststore_location=str(pki / "tampered.jks"), truststore_password=PASSWORD),
            },
            streaming=False,
        )
    with pytest.raises(OptionError, match=r"says PEM, but .* is a JKS file"):
        parse_read_options(
            {**READ, **ssl_options(truststore_location=str(pki / "truststore.jks"), truststore_type="PEM")},
            streaming=False,
        )
    # Cut short: not a JKS file, said of the location.
    (pki / "truncated.jks").write_bytes((pki / "truststore.jks").read_bytes()[:60])
    with pytest.raises(OptionError, match=r"'kafka\.ssl\.truststore\.location'.*not a JKS file"):
        parse_read_options(
            {**READ, **ssl_options(truststore_location=str(pki / "truncated.jks"))}, streaming=False
        )


@needs_keytool
def test_keytool_pkcs12_truststore_is_read_and_jceks_is_refused_with_the_conversion(
    java_stores: Path,
) -> None:
    pki = java_stores
    client = parse_read_options(
        {
            **READ,
            **ssl_options(
                truststore_location=str(pki / "truststore.pkcs12"),
                truststore_type="PKCS12",
                truststore_password=PASSWORD,
            ),
        },
        streaming=False,
    ).client
    assert client.ca_cert is not None
    assert x509.load_pem_x509_certificates(client.ca_cert) == [
        x509.load_pem_x509_certificate((pki / "ca.pem").read_bytes())
    ]
    with pytest.raises(
        OptionError, match=r"JCEKS truststore.*keytool -importkeystore.*-deststoretype PKCS12"
    ):
        parse_read_options(
            {**READ, **ssl_options(truststore_location=str(pki / "truststore.jceks"), truststore_type="JKS")},
            streaming=False,
        )


def test_group_id_and_prefix_are_kept_for_the_readers_group_check() -> None:
    read = parse_read_options({**READ, "kafka.group.id": "etl", "groupIdPrefix": "ignored"}, streaming=True)
    assert (read.group_id, read.group_id_prefix) == ("etl", None)  # as in Spark, the id wins
    read = parse_read_options({**READ, "groupIdPrefix": "ported"}, streaming=False)
    assert (read.group_id, read.group_id_prefix) == (None, "ported")
    assert parse_read_options(READ, streaming=False).group_id is None
    with pytest.raises(OptionError, match=r"'kafka\.group\.id' is empty"):
        parse_read_options({**READ, "kafka.group.id": " "}, streaming=False)
    with pytest.raises(OptionError, match=r"kafka\.group\.id' is a consumer setting, and this is a write"):
        parse_write_options({**WRITE, "kafka.group.id": "etl"})
    with pytest.raises(OptionError, match=r"groupIdPrefix.*this is a write"):
        parse_write_options({**WRITE, "groupIdPrefix": "etl"})


def test_isolation_level_is_read_uncommitted_unless_read_committed_is_asked() -> None:
    """kafka.isolation.level as Kafka's consumer takes it (issue 41); the default is Kafka's."""
    assert parse_read_options(READ, streaming=False).read_committed is False
    for value, committed in (
        ("read_uncommitted", False),
        ("read_committed", True),
        (" READ_Committed ", True),
    ):
        for streaming in (False, True):
            got = parse_read_options({**READ, "kafka.isolation.level": value}, streaming=streaming)
            assert got.read_committed is committed, (value, streaming)
    # Spark hands options over in any case: the key too.
    assert parse_read_options(
        {**READ, "KAFKA.ISOLATION.LEVEL": "read_committed"}, streaming=True
    ).read_committed


def test_kafka_settings_with_no_effect_are_accepted_and_semantic_ones_refused() -> None:
    read = parse_read_options(
        {
            **READ,
            "kafka.client.id": "etl",
            "kafka.max.poll.records": "500",
            "kafka.session.timeout.ms": "30000",
            "kafka.heartbeat.interval.ms": "3000",
            "kafka.fetch.min.bytes": "1",
            "kafka.isolation.level": "read_uncommitted",
            "kafka.retry.backoff.ms": "100",
        },
        streaming=True,
    )
    assert read.client == parse_read_options(READ, streaming=True).client
    write = parse_write_options(
        {
            **WRITE,
            "kafka.client.id": "etl",
            "kafka.retries": "0",
            "kafka.enable.idempotence": "true",
            "kafka.max.in.flight.requests.per.connection": "5",
            "kafka.buffer.memory": "33554432",
        }
    )
    assert write.client == parse_write_options(WRITE).client
    for options, named in (
        (
            {**WRITE, "kafka.enable.idempotence": "false"},
            r"enable\.idempotence'='false' is refused.*duplicates",
        ),
        ({**WRITE, "kafka.max.in.flight.requests.per.connection": "6"}, r"at up to 5"),
        (
            {**READ, "kafka.isolation.level": "serializable"},
            r"isolation\.level'='serializable' is refused.*accepted: read_uncommitted, read_committed",
        ),
        ({**WRITE, "kafka.isolation.level": "read_committed"}, r"consumer setting, and this is a write"),
        ({**READ, "kafka.retries": "3"}, r"producer setting, and this is a read"),
        ({**WRITE, "kafka.max.poll.records": "3"}, r"consumer setting, and this is a write"),
        ({**READ, "kafka.no.such.setting": "3"}, r"no Highwater meaning"),
    ):
        with pytest.raises(OptionError, match=named):
            if "topic" in options:
                parse_write_options(options)
            else:
                parse_read_options(options, streaming=False)


def test_docs_table_says_what_each_kafka_setting_does() -> None:
    """docs/SPARK.md's table names every Kafka setting the parser maps, accepts or refuses by name."""
    text = (REPO_ROOT / "docs" / "SPARK.md").read_text()
    section = text.split("## Options of Spark's Kafka source", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = {m for row in rows for m in re.findall(r"`(kafka\.[a-z.]+|[a-zA-Z.]+)`", row.split(" | ")[0])}
    tables = (
        "KAFKA_NO_EFFECT",
        "KAFKA_VALUES",
        "KAFKA_REFUSED",
        "KAFKA_READ_EQUIVALENTS",
        "KAFKA_WRITE_EQUIVALENTS",
    )
    for name in (name for table in tables for name in getattr(spark_options, table)):
        assert f"kafka.{name}" in named, f"kafka.{name} has no row in docs/SPARK.md's Kafka options table"
    for name in (
        "kafka.group.id",
        "groupIdPrefix",
        "kafka.security.protocol",
        "kafka.ssl.truststore.location",
    ):
        assert name in named, name


def test_the_exactly_once_write_options_are_parsed_and_bad_values_named() -> None:
    plain = parse_write_options(WRITE)
    assert not plain.exactly_once and plain.transactional_id_prefix == "highwater-spark"
    eos = parse_write_options(
        {
            **WRITE,
            "deliveryGuarantee": "Exactly-Once",
            "transactionalIdPrefix": "etl",
            "transactionTimeoutMs": "120000",
        }
    )
    assert (eos.exactly_once, eos.transactional_id_prefix, eos.transaction_timeout_ms) == (
        True,
        "etl",
        120_000,
    )
    for options, named in (
        ({"deliveryGuarantee": "at-most-once"}, "deliveryGuarantee"),
        ({"transactionalIdPrefix": "a/b"}, "transactionalIdPrefix"),
        ({"transactionTimeoutMs": "900001"}, "transactionTimeoutMs"),
        ({"kafka.transactional.id": "t"}, "deliveryGuarantee=exactly-once"),
    ):
        with pytest.raises(OptionError, match=re.escape(named)):
            parse_write_options({**WRITE, **options})
