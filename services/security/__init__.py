"""The security layer: TLS on every listener and channel, authentication, ACLs, limits.

Everything is off unless a flag turns it on (docs/SECURITY.md). The pieces:

- `config.py`    SecurityConfig: the flags of one service and the checks between them.
- `tls.py`       certificate files -> gRPC server/channel credentials and etcd TLS.
- `certs.py`     a local certificate authority with the `cryptography` package.
- `identity.py`  who is calling: service identities from certificates, principals, Caller.
- `tokens.py`    bearer tokens: format, salted hash, verification (pure).
- `cache.py`     ACLs and tokens from etcd, kept current by a watch.
- `rules.py`     per-RPC authorization and request limits: protobuf in, decision out.
- `interceptor.py` the grpc.aio server interceptor that runs them, and the gateway's
                 client interceptor that forwards a principal to brokers and controller.
- `channels.py`  the one place service-to-service channels are opened.
- `runtime.py`   ServiceSecurity: what a service's serve() and ServiceRuntime use.
- `client.py`    TLS and token credentials for the client library.
- `cli_options.py` the service commands' security flags (`@security_options`).

The decision logic itself is pure: services/security/authz.py (the ACL
authorizer) and services/security/quotas.py (byte-rate quotas).
"""
