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

The CAs' private keys (ca-key.pem, etcd-client-ca-key.pem) live in ca-private/
(mode 0700), never beside the certificates: the TLS directory is what every
service gets (--tls-dir), and whoever holds a CA key can mint `admin` or
`controller-1` (a super user, a service) or, with the etcd client CA's, a key to
etcd. Only `highwater tls init` and `cluster up --tls` read ca-private/; copy
the top level alone to a service's host. A directory written before this layout
(CA keys beside the certificates) has them moved into ca-private/ the next time
either command runs on it (`move_ca_keys_out`).

Every private key is written with mode 0600 through a temporary file renamed
into place: it never exists, even for an instant or half-written, with a wider
mode, and an older key file that was readable by others is replaced (a new
inode), not rewritten in place. Existing files are kept, so a restarted local
cluster keeps its certificates. This is a development CA: in production issue
certificates from your own CA with the same names.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.common import limits
from services.security.tls import (
    CA_FILE,
    CA_KEY_FILES,
    CA_PRIVATE_DIR,
    ETCD_CLIENT_CA_FILE,
    ETCD_CLIENT_CA_KEY_FILE,
    TlsConfigError,
    cert_path,
    etcd_client_cert_path,
    etcd_client_key_path,
    key_path,
)

CA_KEY_FILE = CA_KEY_FILES[0]
DEFAULT_HOSTS = ("localhost", "127.0.0.1")
# Certificates start this long before "now", so a peer whose clock is slightly behind accepts them.
CLOCK_SKEW_ALLOWANCE = datetime.timedelta(minutes=5)


PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700
PUBLIC_FILE_MODE = 0o644


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    """path holds data with exactly mode, or is untouched: a temporary file in the same
    directory (mkstemp makes it 0600 whatever the umask) is written, synced, set to mode and
    renamed over path. A crash leaves no half-written key or certificate behind, and a key
    is never readable by others, not even while it is written."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _write_private(path: Path, data: bytes) -> None:
    _write_atomically(path, data, PRIVATE_FILE_MODE)


def _write_public(path: Path, data: bytes) -> None:
    _write_atomically(path, data, PUBLIC_FILE_MODE)


def ca_private_dir(directory: Path) -> Path:
    """directory/ca-private, made with mode 0700 (tightened to it if it exists wider)."""
    private = Path(directory) / CA_PRIVATE_DIR
    private.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    if stat.S_IMODE(private.stat().st_mode) != PRIVATE_DIR_MODE:
        private.chmod(PRIVATE_DIR_MODE)
    return private


def move_ca_keys_out(directory: Path) -> list[Path]:
    """A TLS directory of the previous layout, CA keys beside the certificates, brought to this
    one: each CA key found at the top level is set to 0600 and renamed into ca-private/, and
    every other private key readable by group or others is set to 0600. Returns the keys moved.

    Raises TlsConfigError (stopping the command with its message) when ca-private/ already
    holds a different key of the same name: which of the two signed the certificates only the
    operator knows."""
    directory = Path(directory)
    moved: list[Path] = []
    for name in CA_KEY_FILES:
        beside = directory / name
        if not beside.exists():
            continue
        beside.chmod(PRIVATE_FILE_MODE)
        kept = ca_private_dir(directory) / name
        if kept.exists() and kept.read_bytes() != beside.read_bytes():
            raise TlsConfigError(
                f"TLS: {beside} and {kept} are two different CA keys; keep the one that signed "
                f"{directory / CA_FILE if name == CA_KEY_FILE else directory / ETCD_CLIENT_CA_FILE}, "
                "delete the other, and run the command again"
            )
        os.replace(beside, kept)
        moved.append(kept)
    for key in directory.glob("*-key.pem"):
        if stat.S_IMODE(key.stat().st_mode) & 0o077:
            key.chmod(PRIVATE_FILE_MODE)
    return moved


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
    """Write ca.pem (or ca_file) into directory and ca-key.pem (or key_file) into directory/ca-private
    (both created if missing); returns the certificate's path."""
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
    _write_private(ca_private_dir(directory) / key_file, _key_pem(key))
    _write_public(directory / ca_file, cert.public_bytes(serialization.Encoding.PEM))
    return directory / ca_file


def _load_ca(
    directory: Path, ca_file: str = CA_FILE, key_file: str = CA_KEY_FILE
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    move_ca_keys_out(directory)
    key_file_path = directory / CA_PRIVATE_DIR / key_file
    cert = x509.load_pem_x509_certificate((directory / ca_file).read_bytes())
    key = serialization.load_pem_private_key(key_file_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_file_path} is not an EC key made by highwater")
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
    """Write <name>.pem and <name>-key.pem into directory, signed by the CA in ca_dir (default: directory;
    its key in ca_dir/ca-private, moved there first from a directory of the previous layout).

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
    _write_public(cert_file, cert.public_bytes(serialization.Encoding.PEM))
    return cert_file, key_file


def ensure_local_pki(
    directory: Path, names: Iterable[str], *, hosts: Iterable[str] = (), etcd_clients: Iterable[str] = ()
) -> Path:
    """A CA in directory (made if missing) and a certificate for every name that has none yet;
    with etcd_clients, the etcd client CA too and an etcd client certificate for each of those.
    A directory of the previous layout has its CA keys moved into ca-private/ first (and keys
    readable by others tightened to 0600), so its CAs and certificates are kept."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    move_ca_keys_out(directory)
    private = directory / CA_PRIVATE_DIR
    if not (directory / CA_FILE).exists() or not (private / CA_KEY_FILE).exists():
        create_ca(directory)
    hosts = tuple(hosts)
    for name in names:
        if not cert_path(directory, name).exists() or not key_path(directory, name).exists():
            issue_certificate(directory, name, hosts=hosts)
    etcd_clients = tuple(etcd_clients)
    if etcd_clients and not (
        (directory / ETCD_CLIENT_CA_FILE).exists() and (private / ETCD_CLIENT_CA_KEY_FILE).exists()
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
