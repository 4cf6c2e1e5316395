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

Files are read once at start-up; a missing or unreadable file stops the
service with a message naming it. Rotating certificates means restarting the
process (one at a time: the cluster keeps serving).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from coordinator.store import EtcdTls

CA_FILE = "ca.pem"


class TlsConfigError(SystemExit):
    """The TLS files cannot be used; stops the process with a message naming the file."""


def cert_path(directory: Path, name: str) -> Path:
    return Path(directory) / f"{name}.pem"


def key_path(directory: Path, name: str) -> Path:
    return Path(directory) / f"{name}-key.pem"


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TlsConfigError(f"TLS: cannot read {what} {path} ({exc.strerror}); create it with "
                             "`highwater tls issue` or point --tls-dir at the right directory") from exc
    if b"-----BEGIN" not in data:
        raise TlsConfigError(f"TLS: {what} {path} is not PEM")
    return data


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
        return cls(directory, name, ca, _read(cert_file, "certificate"), _read(key_file, "private key"))

    def server_credentials(self, *, require_client_cert: bool) -> grpc.ServerCredentials:
        """Our certificate on a listener; require_client_cert makes it mutual TLS.

        gRPC Python cannot *request* a client certificate without requiring it,
        so a listener is either mTLS-only or takes no client certificates at all
        (the token listener, --client-port).
        """
        if self.cert_chain is None or self.private_key is None:
            raise TlsConfigError(f"TLS: a listener needs a certificate and key ({self.name}) in {self.directory}")
        return grpc.ssl_server_credentials([(self.private_key, self.cert_chain)],
                                           root_certificates=self.ca_cert if require_client_cert else None,
                                           require_client_auth=require_client_cert)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Verify the server against our CA and present our certificate (when we have one)."""
        return grpc.ssl_channel_credentials(root_certificates=self.ca_cert, private_key=self.private_key,
                                            certificate_chain=self.cert_chain)

    def etcd_tls(self, server_name: str | None = None) -> EtcdTls:
        return EtcdTls(ca_cert=self.ca_cert, cert_chain=self.cert_chain, cert_key=self.private_key,
                       server_name=server_name)
