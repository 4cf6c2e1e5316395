"""TLS and bearer-token settings: the transport package's (clients/common/transport/tls.py),
under the name the client library has always exported them by."""

from clients.common.transport.tls import ClientTls, ClientTlsError, tls_dir_settings

__all__ = ["ClientTls", "ClientTlsError", "tls_dir_settings"]
