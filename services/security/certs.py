"""A local certificate authority and certificates, made with the `cryptography` package.

For `highwater cluster up --tls`, the tests and `highwater tls ...`: one CA per
directory (ca.pem, ca-key.pem) and one certificate per name (<name>.pem,
<name>-key.pem), CN = name. Keys are ECDSA P-256 (fast handshakes, small
certificates); signatures SHA-256. Every leaf certificate carries both
serverAuth and clientAuth usages (a service uses one certificate for its
listener and for its own calls) and subject alternative names for the name
itself, localhost and 127.0.0.1, plus any extra hosts given (container names
in deploy/).

A second CA, etcd-client-ca.pem, issues the certificates etcd accepts from its
clients (<name>.etcd-client.pem, clientAuth only): the services and the
operators, never ordinary clients (services/security/tls.py says why).

Private keys are written with mode 0600. Existing files are kept, so a
restarted local cluster keeps its certificates. This is a development CA: in
production issue certificates from your own CA with the same names.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.common import limits
from services.security.tls import (
    CA_FILE,
    ETCD_CLIENT_CA_FILE,
    cert_path,
    etcd_client_cert_path,
    etcd_client_key_path,
    key_path,
)

CA_KEY_FILE = "ca-key.pem"
ETCD_CLIENT_CA_KEY_FILE = "etcd-client-ca-key.pem"
DEFAULT_HOSTS = ("localhost", "127.0.0.1")
# Certificates start this long before "now", so a peer whose clock is slightly behind accepts them.
CLOCK_SKEW_ALLOWANCE = datetime.timedelta(minutes=5)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def create_ca(
    directory: Path,
    *,
    common_name: str = "Highwater local CA",
    valid_days: int = limits.CA_VALID_DAYS,
    ca_file: str = CA_FILE,
    key_file: str = CA_KEY_FILE,
) -> Path:
    """Write ca.pem and ca-key.pem (or the names given) into directory (created if missing); returns the
    certificate's path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Highwater"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW_ALLOWANCE)
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(directory / key_file, _key_pem(key))
    (directory / ca_file).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return directory / ca_file


def _load_ca(
    directory: Path, ca_file: str = CA_FILE, key_file: str = CA_KEY_FILE
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate((directory / ca_file).read_bytes())
    key = serialization.load_pem_private_key((directory / key_file).read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{directory / key_file} is not an EC key made by highwater")
    return cert, key


def issue_certificate(
    directory: Path,
    name: str,
    *,
    hosts: Iterable[str] = (),
    ca_dir: Path | None = None,
    valid_days: int = limits.CERT_VALID_DAYS,
    not_before_days_ago: float = 0.0,
    etcd_client: bool = False,
) -> tuple[Path, Path]:
    """Write <name>.pem and <name>-key.pem into directory, signed by the CA in ca_dir (default: directory).

    etcd_client: write <name>.etcd-client.pem and its key instead, signed by the etcd client CA,
    for client authentication only. `not_before_days_ago` with a small valid_days makes an
    already expired certificate (for tests). Returns (certificate path, key path).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ca_files = (ETCD_CLIENT_CA_FILE, ETCD_CLIENT_CA_KEY_FILE) if etcd_client else (CA_FILE, CA_KEY_FILE)
    ca_cert, ca_key = _load_ca(Path(ca_dir) if ca_dir is not None else directory, *ca_files)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for host in dict.fromkeys([name, *DEFAULT_HOSTS, *hosts]):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    start = (
        datetime.datetime.now(datetime.UTC)
        - CLOCK_SKEW_ALLOWANCE
        - datetime.timedelta(days=not_before_days_ago)
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Highwater"),
                    x509.NameAttribute(NameOID.COMMON_NAME, name),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                key_cert_sign=False,
                crl_sign=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH]
                if etcd_client
                else [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    if etcd_client:
        cert_file, key_file = etcd_client_cert_path(directory, name), etcd_client_key_path(directory, name)
    else:
        cert_file, key_file = cert_path(directory, name), key_path(directory, name)
    _write_private(key_file, _key_pem(key))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_file, key_file


def ensure_local_pki(
    directory: Path, names: Iterable[str], *, hosts: Iterable[str] = (), etcd_clients: Iterable[str] = ()
) -> Path:
    """A CA in directory (made if missing) and a certificate for every name that has none yet;
    with etcd_clients, the etcd client CA too and an etcd client certificate for each of those."""
    directory = Path(directory)
    if not (directory / CA_FILE).exists() or not (directory / CA_KEY_FILE).exists():
        create_ca(directory)
    hosts = tuple(hosts)
    for name in names:
        if not cert_path(directory, name).exists() or not key_path(directory, name).exists():
            issue_certificate(directory, name, hosts=hosts)
    etcd_clients = tuple(etcd_clients)
    if etcd_clients and not (
        (directory / ETCD_CLIENT_CA_FILE).exists() and (directory / ETCD_CLIENT_CA_KEY_FILE).exists()
    ):
        create_ca(
            directory,
            common_name="Highwater etcd clients CA",
            ca_file=ETCD_CLIENT_CA_FILE,
            key_file=ETCD_CLIENT_CA_KEY_FILE,
        )
    for name in etcd_clients:
        if (
            not etcd_client_cert_path(directory, name).exists()
            or not etcd_client_key_path(directory, name).exists()
        ):
            issue_certificate(directory, name, etcd_client=True)
    return directory
