"""Certificate files -> gRPC credentials and etcd TLS settings.

A TLS directory holds, in PEM:

    ca.pem                  the cluster's certificate authority (trusted by everyone)
    <name>.pem              a certificate signed by it, CN = <name>
    <name>-key.pem          its private key

where <name> is the process's identity: controller-<id>, broker-<id>,
gateway-<id> for services, anything else for clients (admin, alice, ...).
A service uses its one certificate both ways: as server certificate on its
listeners and as client certificate on its channels to peers and to etcd, so
each certificate needs the serverAuth and clientAuth extended key usages and
subject alternative names for the addresses it is reached at (certs.py makes
such certificates).

etcd trusts a CA of its own, never the cluster's: with the cluster CA, every
client certificate (`highwater tls init --name alice`) was an etcd client with
the run of every key (ACLs, tokens, deletion marks). Who may reach etcd has

    etcd-client-ca.pem              the CA etcd accepts client certificates from
    <name>.etcd-client.pem          a client certificate from it (clientAuth only)
    <name>.etcd-client-key.pem      its key

in the same directory: the services, and the operators who run `highwater acl`
and `highwater token`. A directory without etcd-client-ca.pem is an older one:
etcd then trusts the cluster CA, as before, and every holder of one of its
certificates can reach etcd.

The CAs' private keys are no service's business: whoever holds ca-key.pem can
mint `admin` or `controller-1`. certs.py keeps them in ca-private/ (0700);
a service never reads that directory and warns at start-up when it finds a CA
key beside the certificates (a directory of the previous layout: `highwater tls
init DIR` moves them) or its own key readable by group or others.

Files are read once at start-up; a missing or unreadable file stops the
service with a message naming it. Rotating certificates means restarting the
process (one at a time: the cluster keeps serving).
"""

from __future__ import annotations

import logging
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path

import grpc

from coordinator.store import EtcdTls

CA_FILE = "ca.pem"
ETCD_CLIENT_CA_FILE = "etcd-client-ca.pem"
# Where certs.py keeps the CAs' private keys: a subdirectory only the operator's tools read.
CA_PRIVATE_DIR = "ca-private"
ETCD_CLIENT_CA_KEY_FILE = "etcd-client-ca-key.pem"
CA_KEY_FILES = ("ca-key.pem", ETCD_CLIENT_CA_KEY_FILE)

log = logging.getLogger("highwater.security")


class TlsConfigError(SystemExit):
    """The TLS files cannot be used; stops the process with a message naming the file."""


def cert_path(directory: Path, name: str) -> Path:
    return Path(directory) / f"{name}.pem"


def key_path(directory: Path, name: str) -> Path:
    return Path(directory) / f"{name}-key.pem"


def etcd_client_cert_path(directory: Path, name: str) -> Path:
    return Path(directory) / f"{name}.etcd-client.pem"


def etcd_client_key_path(directory: Path, name: str) -> Path:
    return Path(directory) / f"{name}.etcd-client-key.pem"


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TlsConfigError(
            f"TLS: cannot read {what} {path} ({exc.strerror}); create it with "
            "`highwater tls issue` or point --tls-dir at the right directory"
        ) from exc
    if b"-----BEGIN" not in data:
        raise TlsConfigError(f"TLS: {what} {path} is not PEM")
    return data


def _warn_about_exposed_keys(directory: Path, key_file: Path) -> None:
    """A directory of the previous layout still starts (refusing it would stop a running cluster
    at its next restart); the operator is told what to fix."""
    for name in CA_KEY_FILES:
        if (directory / name).exists():
            log.warning(
                "TLS: %s, a CA's private key, is in the directory every service reads: whoever reads it "
                "can issue any certificate. Move it out: `highwater tls init %s` moves it to %s/",
                directory / name,
                directory,
                directory / CA_PRIVATE_DIR,
            )
    try:
        mode = stat.S_IMODE(key_file.stat().st_mode)
    except OSError:
        return  # _read says what is wrong with it
    if mode & 0o077:
        log.warning(
            "TLS: private key %s has mode %o, readable by others than its owner; chmod 600 it", key_file, mode
        )


@dataclass(frozen=True)
class TlsMaterial:
    """One process's CA, certificate and key, read from a TLS directory."""

    directory: Path
    name: str
    ca_cert: bytes
    cert_chain: bytes | None
    private_key: bytes | None

    @classmethod
    def load(cls, directory: Path, name: str | None, *, require_cert: bool = True) -> TlsMaterial:
        """Read ca.pem and, when name is given, <name>.pem and <name>-key.pem. Raises TlsConfigError."""
        directory = Path(directory)
        ca = _read(directory / CA_FILE, "CA certificate")
        if not name:
            if require_cert:
                raise TlsConfigError(f"TLS: no certificate name given for {directory}")
            return cls(directory, "", ca, None, None)
        cert_file, key_file = cert_path(directory, name), key_path(directory, name)
        if not require_cert and not cert_file.exists():
            return cls(directory, name, ca, None, None)
        _warn_about_exposed_keys(directory, key_file)
        return cls(directory, name, ca, _read(cert_file, "certificate"), _read(key_file, "private key"))

    def server_credentials(self, *, require_client_cert: bool) -> grpc.ServerCredentials:
        """Our certificate on a listener; require_client_cert makes it mutual TLS.

        gRPC Python cannot *request* a client certificate without requiring it,
        so a listener is either mTLS-only or takes no client certificates at all
        (the token listener, --client-port).
        """
        if self.cert_chain is None or self.private_key is None:
            raise TlsConfigError(
                f"TLS: a listener needs a certificate and key ({self.name}) in {self.directory}"
            )
        return grpc.ssl_server_credentials(
            [(self.private_key, self.cert_chain)],
            root_certificates=self.ca_cert if require_client_cert else None,
            require_client_auth=require_client_cert,
        )

    def server_ssl_context(self) -> ssl.SSLContext:
        """Mutual TLS for a listener outside gRPC (the Kafka protocol port): our certificate,
        client certificates required and verified against the cluster CA, TLS 1.2 or newer.
        Reads the same files as `server_credentials`; raises TlsConfigError if they are unusable."""
        if self.cert_chain is None or self.private_key is None:
            raise TlsConfigError(
                f"TLS: a listener needs a certificate and key ({self.name}) in {self.directory}"
            )
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=self.ca_cert.decode("ascii"))
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        try:
            context.load_cert_chain(cert_path(self.directory, self.name), key_path(self.directory, self.name))
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(
                f"TLS: cannot use certificate {cert_path(self.directory, self.name)} with its key: {exc}"
            ) from exc
        return context

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Verify the server against our CA and present our certificate (when we have one)."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_cert, private_key=self.private_key, certificate_chain=self.cert_chain
        )

    def etcd_tls(self, server_name: str | None = None) -> EtcdTls:
        """Mutual TLS to etcd: etcd's certificate checked against the cluster CA, and this name's
        etcd client certificate (or, in an older directory without an etcd client CA, its own)."""
        if not (self.directory / ETCD_CLIENT_CA_FILE).exists():
            return EtcdTls(
                ca_cert=self.ca_cert,
                cert_chain=self.cert_chain,
                cert_key=self.private_key,
                server_name=server_name,
            )
        cert_file = etcd_client_cert_path(self.directory, self.name)
        if not self.name or not cert_file.exists():
            raise TlsConfigError(
                f"TLS: {self.name or 'this client'} has no etcd client certificate ({cert_file}); etcd "
                "accepts "
                f"only certificates of {self.directory / ETCD_CLIENT_CA_FILE}. An operator makes one with "
                f"`highwater tls init {self.directory} --etcd-client {self.name or 'NAME'}`"
            )
        return EtcdTls(
            ca_cert=self.ca_cert,
            cert_chain=_read(cert_file, "etcd client certificate"),
            cert_key=_read(etcd_client_key_path(self.directory, self.name), "etcd client key"),
            server_name=server_name,
        )
