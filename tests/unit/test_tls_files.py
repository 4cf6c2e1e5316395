"""TLS directories (services/security/certs.py, tls.py): etcd's own client CA."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from services.security.certs import ensure_local_pki
from services.security.tls import ETCD_CLIENT_CA_FILE, TlsConfigError, TlsMaterial, etcd_client_cert_path


def issuer_of(path: Path) -> str:
    return x509.load_pem_x509_certificate(path.read_bytes()).issuer.rfc4514_string()


def test_etcd_client_certificates_come_from_a_ca_clients_never_get_certificates_from(tmp_path: Path) -> None:
    ensure_local_pki(tmp_path, ["broker-1", "alice"], etcd_clients=["broker-1"])
    assert (tmp_path / ETCD_CLIENT_CA_FILE).exists()
    etcd_cert = etcd_client_cert_path(tmp_path, "broker-1")
    assert "etcd clients CA" in issuer_of(etcd_cert)
    assert "etcd clients CA" not in issuer_of(tmp_path / "alice.pem")
    usages = (
        x509.load_pem_x509_certificate(etcd_cert.read_bytes())
        .extensions.get_extension_for_class(x509.ExtendedKeyUsage)
        .value
    )
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH], "an etcd client certificate serves nothing"


def test_a_service_presents_its_etcd_client_certificate_to_etcd(tmp_path: Path) -> None:
    ensure_local_pki(tmp_path, ["broker-1"], etcd_clients=["broker-1"])
    tls = TlsMaterial.load(tmp_path, "broker-1").etcd_tls()
    assert tls.cert_chain == etcd_client_cert_path(tmp_path, "broker-1").read_bytes()
    assert tls.ca_cert == (tmp_path / "ca.pem").read_bytes(), "etcd's server certificate is the cluster CA's"


def test_a_name_without_an_etcd_client_certificate_is_told_how_to_get_one(tmp_path: Path) -> None:
    ensure_local_pki(tmp_path, ["alice"], etcd_clients=["admin"])
    with pytest.raises(TlsConfigError, match=r"alice has no etcd client certificate.*--etcd-client alice"):
        TlsMaterial.load(tmp_path, "alice").etcd_tls()


def test_an_older_directory_without_an_etcd_client_ca_keeps_working(tmp_path: Path) -> None:
    ensure_local_pki(tmp_path, ["broker-1"])
    tls = TlsMaterial.load(tmp_path, "broker-1").etcd_tls()
    assert tls.cert_chain == (tmp_path / "broker-1.pem").read_bytes()
