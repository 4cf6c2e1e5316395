"""TLS directories (services/security/certs.py, tls.py): etcd's own client CA; the CAs' keys kept
apart from the files services read; private keys 0600 from their first byte."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from services.security.certs import ensure_local_pki, issue_certificate
from services.security.tls import (
    CA_KEY_FILES,
    CA_PRIVATE_DIR,
    ETCD_CLIENT_CA_FILE,
    TlsConfigError,
    TlsMaterial,
    etcd_client_cert_path,
)


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


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def private_keys(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*.pem") if p.name.endswith("-key.pem"))


def previous_release_layout(directory: Path) -> None:
    """What the previous release wrote: the CAs' keys beside the certificates (here also left
    readable by everyone, as a copy with `cp` under umask 022 leaves them)."""
    for name in CA_KEY_FILES:
        os.replace(directory / CA_PRIVATE_DIR / name, directory / name)
        (directory / name).chmod(0o644)
    (directory / CA_PRIVATE_DIR).rmdir()


def test_the_cas_keys_are_not_in_the_directory_services_read(tmp_path: Path) -> None:
    ensure_local_pki(tmp_path, ["broker-1", "admin"], etcd_clients=["broker-1"])
    top_level = {p.name for p in tmp_path.iterdir()}
    assert not top_level & set(CA_KEY_FILES), f"a CA key beside the certificates: {sorted(top_level)}"
    private = tmp_path / CA_PRIVATE_DIR
    assert mode_of(private) == 0o700
    assert {p.name for p in private.iterdir()} == set(CA_KEY_FILES)


def test_every_private_key_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    old_umask = os.umask(0)  # the most permissive umask: the modes come from certs.py alone
    try:
        ensure_local_pki(tmp_path, ["broker-1", "admin"], etcd_clients=["broker-1"])
    finally:
        os.umask(old_umask)
    keys = private_keys(tmp_path)
    assert len(keys) == 5, keys  # 2 CAs, 2 leaves, 1 etcd client
    assert {k.name: oct(mode_of(k)) for k in keys} == {k.name: oct(0o600) for k in keys}
    assert oct(mode_of(tmp_path / "ca.pem")) == oct(0o644), "certificates stay readable"


def test_a_key_written_over_a_world_readable_file_is_a_new_0600_file(tmp_path: Path) -> None:
    ensure_local_pki(tmp_path, [])
    stale = tmp_path / "alice-key.pem"
    stale.write_bytes(b"an old key, copied with the wrong mode")
    stale.chmod(0o644)
    old_inode = stale.stat().st_ino
    issue_certificate(tmp_path, "alice")
    # Rewriting the old file in place would keep its 0644 while the new key is written into it.
    assert oct(mode_of(stale)) == oct(0o600)
    assert stale.stat().st_ino != old_inode, "the key was written into the world-readable file"
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file left behind"


def test_a_key_is_never_world_readable_while_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensure_local_pki(tmp_path, [])
    seen: list[tuple[str, int]] = []
    real_replace = os.replace

    def replace_watching(src: str | Path, dst: str | Path) -> None:
        seen.append(
            (Path(dst).name, mode_of(Path(src)))
        )  # the key is in src, complete, before it has its name
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_watching)
    old_umask = os.umask(0)
    try:
        issue_certificate(tmp_path, "alice")
    finally:
        os.umask(old_umask)
    assert ("alice-key.pem", 0o600) in seen, seen


def test_a_directory_of_the_previous_release_keeps_its_cas_and_has_their_keys_moved(tmp_path: Path) -> None:
    ensure_local_pki(tmp_path, ["broker-1"], etcd_clients=["broker-1"])
    previous_release_layout(tmp_path)
    ca_before = (tmp_path / "ca.pem").read_bytes()
    ca_key_before = (tmp_path / "ca-key.pem").read_bytes()
    broker_before = (tmp_path / "broker-1.pem").read_bytes()

    ensure_local_pki(tmp_path, ["broker-1", "broker-2"], etcd_clients=["broker-1", "broker-2"])

    assert (tmp_path / "ca.pem").read_bytes() == ca_before, "the CA was made again: every certificate lost"
    assert (tmp_path / "broker-1.pem").read_bytes() == broker_before
    assert (tmp_path / CA_PRIVATE_DIR / "ca-key.pem").read_bytes() == ca_key_before
    assert not any((tmp_path / name).exists() for name in CA_KEY_FILES)
    assert {k.name: oct(mode_of(k)) for k in private_keys(tmp_path)} == {
        k.name: oct(0o600) for k in private_keys(tmp_path)
    }
    assert "Highwater local CA" in issuer_of(tmp_path / "broker-2.pem"), "signed by the kept CA"
    TlsMaterial.load(tmp_path, "broker-2").etcd_tls()


def test_a_service_on_a_directory_of_the_previous_release_starts_and_says_what_to_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ensure_local_pki(tmp_path, ["broker-1"], etcd_clients=["broker-1"])
    previous_release_layout(tmp_path)
    with caplog.at_level(logging.WARNING, logger="highwater.security"):
        material = TlsMaterial.load(tmp_path, "broker-1")
    assert material.private_key is not None
    assert material.etcd_tls().cert_chain == etcd_client_cert_path(tmp_path, "broker-1").read_bytes()
    assert f"highwater tls init {tmp_path}" in caplog.text
    assert (tmp_path / "ca-key.pem").exists(), "a service reads its directory, it does not rearrange it"


def test_two_different_keys_for_one_ca_are_refused_not_overwritten(tmp_path: Path) -> None:
    ensure_local_pki(tmp_path, [])
    (tmp_path / "ca-key.pem").write_bytes(b"another CA's key")
    with pytest.raises(TlsConfigError, match="two different CA keys"):
        ensure_local_pki(tmp_path, ["broker-1"])
