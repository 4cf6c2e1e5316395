"""The one place a service opens a gRPC channel to another Highwater process.

`configure` is called once at start-up (runtime.py), before any channel is
opened, and never again: a process has one identity and one certificate, so
its peer channels share one set of credentials, like its logging settings.
Without a call (plaintext, unit tests) channels are insecure, as before.
Used by PeerChannels (services/common/peers.py) and the replica fetcher's
GrpcLeaderEndpoint (services/broker/fetcher.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

_credentials: grpc.ChannelCredentials | None = None
_interceptors: tuple[Any, ...] = ()


def configure(credentials: grpc.ChannelCredentials | None, interceptors: Sequence[Any] = ()) -> None:
    """Set this process's peer-channel credentials (mutual TLS) and client interceptors."""
    global _credentials, _interceptors
    _credentials = credentials
    _interceptors = tuple(interceptors)


def open_channel(address: str, options: Sequence[tuple[str, Any]]) -> grpc.aio.Channel:
    """A channel to a peer: mutual TLS with our certificate when configured, else plaintext."""
    if _credentials is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=_interceptors or None)
    return grpc.aio.secure_channel(address, _credentials, options=options, interceptors=_interceptors or None)


def secure() -> bool:
    return _credentials is not None
