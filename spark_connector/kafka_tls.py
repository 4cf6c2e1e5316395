"""Spark's Kafka TLS options (`kafka.security.protocol`, `kafka.ssl.*`) turned into PEM for gRPC.

A job ported from format("kafka") names its trust store and key store the way Kafka's Java
client does: a file location, a type (PEM, PKCS12 or JKS) and passwords. gRPC takes PEM
bytes: the CA certificates, the client's certificate chain and its unencrypted private key
(ClientSettings.ca_cert, cert_chain, private_key). This module reads the stores on the
driver, at planning, and converts them; the bytes then travel to the tasks as the
`highwater.ssl.*` files' bytes do.

PEM and PKCS12 stores are read with the `cryptography` package; JKS, Java's proprietary
format (and Kafka's default type), with kafka_jks.py, as Java reads it: the store password
checks the file's integrity digest (skipped for a trust store given no password, as Java
skips it), the key password (kafka.ssl.key.password, else the store password) opens the key.
JCEKS is refused with the keytool command that converts it to PKCS12.

Pure apart from reading the named files: no Spark, no gRPC. Every error is an OptionError
naming the option that is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from spark_connector import kafka_jks
from spark_connector.options_error import OptionError

PROTOCOL_OPTION = "kafka.security.protocol"
SSL_PREFIX = "kafka.ssl."
# Kafka's security.protocol values this connector speaks: the cluster's TLS, or none.
PLAINTEXT = "PLAINTEXT"
SSL = "SSL"
_SASL_PROTOCOLS = ("SASL_SSL", "SASL_PLAINTEXT")
_STORE_TYPES = ("PEM", "PKCS12", "JKS")
# Kafka's store types are JKS by default; a store given without its type is recognised by its
# bytes instead, so a PEM, PKCS12 or JKS file works without naming its type.
_TLS_VERSIONS = ("TLS", "TLSv1.2", "TLSv1.3")

# kafka.ssl.<name> settings that name the trust store, the key store and their passwords.
STORE_SETTINGS = (
    "truststore.location",
    "truststore.type",
    "truststore.password",
    "truststore.certificates",
    "keystore.location",
    "keystore.type",
    "keystore.password",
    "keystore.key",
    "keystore.certificate.chain",
    "key.password",
)
# kafka.ssl.<name> settings of the JVM's TLS implementation, which gRPC has no counterpart for
# and which do not change what is trusted or presented: accepted with no effect.
NO_EFFECT_SETTINGS: dict[str, str] = {
    "keymanager.algorithm": "a JVM key manager factory; gRPC reads the key store's key directly",
    "trustmanager.algorithm": "a JVM trust manager factory; gRPC checks chains against the trust store",
    "secure.random.implementation": "a JVM random source; gRPC uses its TLS library's own",
    "provider": "a JVM security provider; gRPC uses its own TLS library",
}
# kafka.ssl.<name> settings checked for their value (the others above, or refused).
PROTOCOL_SETTINGS = ("protocol", "enabled.protocols", "endpoint.identification.algorithm")


@dataclass(frozen=True)
class KafkaTls:
    """What kafka.security.protocol and kafka.ssl.* ask for: the protocol and the PEM bytes read."""

    protocol: str | None = None  # None: kafka.security.protocol not given
    ca_cert: bytes | None = field(default=None, repr=False)
    cert_chain: bytes | None = field(default=None, repr=False)
    private_key: bytes | None = field(default=None, repr=False)
    given: tuple[str, ...] = ()  # the kafka.ssl.* options given, for messages


def _pem_certificates(certificates: list[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


def _unencrypted_pem(key: object) -> bytes:
    """A private key as unencrypted PKCS#8 PEM, the form gRPC takes."""
    return key.private_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _read(option: str, path: str) -> bytes:
    try:
        return Path(path.strip()).read_bytes()
    except OSError as exc:
        raise OptionError(f"option {option!r}: cannot read {path!r} on the driver: {exc.strerror}") from None


def _store_type(options: Mapping[str, str], store: str, data: bytes) -> str:
    """The store's type: as given by kafka.ssl.<store>.type, else recognised from the file's bytes."""
    type_option = f"{SSL_PREFIX}{store}.type"
    given = options.get(type_option)
    if data.startswith(kafka_jks.JCEKS_MAGIC):
        raise _refuse_jceks(options, store)
    found = "JKS" if data.startswith(kafka_jks.JKS_MAGIC) else "PEM" if b"-----BEGIN" in data else "PKCS12"
    if given is None:
        return found
    wanted = given.strip().upper()
    if wanted not in _STORE_TYPES:
        raise OptionError(f"option {type_option!r} must be PEM, PKCS12 or JKS, got {given!r}")
    # Java opens a PKCS12 file named as JKS, and a JKS file named as PKCS12, too
    # (keystore.type.compat), so a job that mixes them up works in Spark and works here.
    if wanted == found or {wanted, found} == {"JKS", "PKCS12"}:
        return found
    raise OptionError(
        f"option {type_option!r} says {wanted}, but {options[SSL_PREFIX + store + '.location']!r} "
        f"is a {found} file; give its type or leave the option out"
    )


def _refuse_jceks(options: Mapping[str, str], store: str) -> OptionError:
    location = options[f"{SSL_PREFIX}{store}.location"]
    return OptionError(
        f"option '{SSL_PREFIX}{store}.location': {location!r} is a JCEKS {store}, which this connector "
        "does not read; convert it to PKCS12 with `keytool -importkeystore -srckeystore "
        f"{location} -srcstoretype JCEKS -destkeystore {store}.p12 -deststoretype PKCS12` and set "
        f"{SSL_PREFIX}{store}.location to the new file and {SSL_PREFIX}{store}.type=PKCS12 "
        "(JKS and PEM files work too)"
    )


def _load_jks(options: Mapping[str, str], store: str, data: bytes) -> kafka_jks.JksStore:
    """The JKS store's entries, its integrity digest checked when kafka.ssl.<store>.password is set."""
    location = options[f"{SSL_PREFIX}{store}.location"]
    try:
        return kafka_jks.parse_jks(data, options.get(f"{SSL_PREFIX}{store}.password") or None)
    except kafka_jks.JksStorePasswordError:
        raise OptionError(
            f"option '{SSL_PREFIX}{store}.password': the JKS {store} {location!r} fails its integrity "
            "check with this password: the password is wrong, or the file was altered since it was "
            "written (make it again with keytool)"
        ) from None
    except kafka_jks.JksError as exc:
        raise OptionError(
            f"option '{SSL_PREFIX}{store}.location': {location!r} is not a JKS file this connector "
            f"reads: {exc}"
        ) from None


def _jks_certificates(option: str, der: list[bytes]) -> list[x509.Certificate]:
    try:
        return [x509.load_der_x509_certificate(d) for d in der]
    except ValueError:
        raise OptionError(
            f"option {option!r}: the JKS file holds a certificate that is not X.509 DER"
        ) from None


def _password(options: Mapping[str, str], name: str) -> bytes | None:
    text = options.get(SSL_PREFIX + name)
    return text.encode() if text else None


def _load_pkcs12(option: str, data: bytes, passwords: list[bytes | None]) -> pkcs12.PKCS12KeyAndCertificates:
    """The first password (of those given, then none) that opens the PKCS12 store."""
    for password in dict.fromkeys(passwords):
        try:
            return pkcs12.load_pkcs12(data, password)
        except ValueError:
            continue
    raise OptionError(
        f"option {option!r}: the PKCS12 file could not be opened with the password given "
        "(wrong password, or not a PKCS12 file)"
    )


def _trust_store(options: Mapping[str, str]) -> bytes | None:
    """The CA certificates as PEM: kafka.ssl.truststore.location (PEM, PKCS12, JKS) or .certificates."""
    location_option = SSL_PREFIX + "truststore.location"
    inline = options.get(SSL_PREFIX + "truststore.certificates")
    location = options.get(location_option)
    if inline is not None and location is not None:
        raise OptionError(
            f"options {location_option!r} and '{SSL_PREFIX}truststore.certificates' both give the trust "
            "store; give one"
        )
    if inline is not None:
        if b"-----BEGIN CERTIFICATE" not in inline.encode():
            raise OptionError(f"option '{SSL_PREFIX}truststore.certificates' holds no PEM certificate")
        return inline.encode()
    if location is None:
        for name in ("truststore.type", "truststore.password"):
            if SSL_PREFIX + name in options:
                raise OptionError(
                    f"option '{SSL_PREFIX}{name}' needs {location_option} (the trust store file)"
                )
        return None
    data = _read(location_option, location)
    kind = _store_type(options, "truststore", data)
    if kind == "JKS":
        jks = _load_jks(options, "truststore", data)
        # Java's trust managers trust the trusted certificate entries and the leaf of each key
        # entry's chain (TrustStoreUtil.getTrustedCerts).
        der = [*jks.trusted_certificates, *(e.chain[0] for e in jks.private_keys if e.chain)]
        if not der:
            raise OptionError(
                f"option {location_option!r}: the JKS trust store {location!r} holds no certificate"
            )
        return _pem_certificates(_jks_certificates(location_option, der))
    if kind == "PEM":
        try:
            certificates = x509.load_pem_x509_certificates(data)
        except ValueError:
            raise OptionError(f"option {location_option!r}: {location!r} holds no PEM certificate") from None
        return _pem_certificates(certificates)
    store = _load_pkcs12(location_option, data, [_password(options, "truststore.password"), None])
    certificates = [c.certificate for c in store.additional_certs]
    if store.cert is not None:
        certificates.insert(0, store.cert.certificate)
    if not certificates:
        raise OptionError(
            f"option {location_option!r}: the PKCS12 trust store {location!r} holds no certificate"
        )
    return _pem_certificates(certificates)


def _pem_key(option: str, data: bytes, password: bytes | None) -> bytes:
    try:
        key = serialization.load_pem_private_key(data, password)
    except TypeError:
        raise OptionError(
            f"option {option!r}: the private key is encrypted; set kafka.ssl.key.password"
            if password is None
            else f"option {option!r}: the private key is not encrypted, yet kafka.ssl.key.password is set; "
            "remove it"
        ) from None
    except ValueError:
        raise OptionError(
            f"option {option!r}: no private key could be read (a wrong kafka.ssl.key.password?)"
        ) from None
    return _unencrypted_pem(key)


def _key_store(options: Mapping[str, str]) -> tuple[bytes, bytes] | None:
    """(certificate chain PEM, unencrypted key PEM) from the key store options, or None."""
    location_option = SSL_PREFIX + "keystore.location"
    location = options.get(location_option)
    chain_inline = options.get(SSL_PREFIX + "keystore.certificate.chain")
    key_inline = options.get(SSL_PREFIX + "keystore.key")
    key_password = _password(options, "key.password")
    if location is not None and (chain_inline is not None or key_inline is not None):
        raise OptionError(
            f"options {location_option!r} and '{SSL_PREFIX}keystore.certificate.chain' / "
            f"'{SSL_PREFIX}keystore.key' both give the key store; give one"
        )
    if chain_inline is not None or key_inline is not None:
        if chain_inline is None or key_inline is None:
            raise OptionError(
                f"options '{SSL_PREFIX}keystore.certificate.chain' and '{SSL_PREFIX}keystore.key' go together"
            )
        chain = chain_inline.encode()
        if b"-----BEGIN CERTIFICATE" not in chain:
            raise OptionError(f"option '{SSL_PREFIX}keystore.certificate.chain' holds no PEM certificate")
        return chain, _pem_key(SSL_PREFIX + "keystore.key", key_inline.encode(), key_password)
    if location is None:
        for name in ("keystore.type", "keystore.password", "key.password"):
            if SSL_PREFIX + name in options:
                raise OptionError(f"option '{SSL_PREFIX}{name}' needs {location_option} (the key store file)")
        return None
    data = _read(location_option, location)
    kind = _store_type(options, "keystore", data)
    if kind == "JKS":
        return _jks_key(options, data)
    if kind == "PEM":
        try:
            certificates = x509.load_pem_x509_certificates(data)
        except ValueError:
            raise OptionError(f"option {location_option!r}: {location!r} holds no PEM certificate") from None
        return _pem_certificates(certificates), _pem_key(location_option, data, key_password)
    # Java's PKCS12 key stores protect the key with the store's password, or with
    # ssl.key.password when it differs (keytool -keypass): try both.
    store = _load_pkcs12(location_option, data, [_password(options, "keystore.password"), key_password, None])
    if store.key is None or store.cert is None:
        raise OptionError(
            f"option {location_option!r}: the PKCS12 key store {location!r} holds no private key with its "
            "certificate"
        )
    certificates = [store.cert.certificate, *(c.certificate for c in store.additional_certs)]
    return _pem_certificates(certificates), _unencrypted_pem(store.key)


def _jks_key(options: Mapping[str, str], data: bytes) -> tuple[bytes, bytes]:
    """(certificate chain PEM, unencrypted key PEM) of a JKS key store's one private key entry."""
    location_option = SSL_PREFIX + "keystore.location"
    location = options[location_option]
    jks = _load_jks(options, "keystore", data)
    if len(jks.private_keys) != 1:
        raise OptionError(
            f"option {location_option!r}: the JKS key store {location!r} holds {len(jks.private_keys)} "
            "private keys; gRPC presents one: keep the client's (keytool -delete -alias <other>)"
            if jks.private_keys
            else f"option {location_option!r}: the JKS key store {location!r} holds no private key"
        )
    entry = jks.private_keys[0]
    if not entry.chain:
        raise OptionError(f"option {location_option!r}: the key {entry.alias!r} has no certificate chain")
    # As Java's key managers do: ssl.key.password, else the store's password, opens the key.
    password_option = next(
        (SSL_PREFIX + n for n in ("key.password", "keystore.password") if options.get(SSL_PREFIX + n)), None
    )
    if password_option is None:
        raise OptionError(
            f"option {location_option!r}: a JKS key store's private key is protected by a password; set "
            f"{SSL_PREFIX}key.password (or {SSL_PREFIX}keystore.password when they are the same)"
        )
    try:
        pkcs8 = kafka_jks.recover_private_key(entry, options[password_option])
    except kafka_jks.JksKeyPasswordError:
        raise OptionError(
            f"option {password_option!r}: the password does not open the private key {entry.alias!r} of "
            f"the JKS key store {location!r}"
            + (
                f"; set {SSL_PREFIX}key.password to the key's own password"
                if "keystore" in password_option
                else ""
            )
        ) from None
    except kafka_jks.JksError as exc:
        raise OptionError(f"option {location_option!r}: {location!r}: {exc}") from None
    try:
        key = serialization.load_der_private_key(pkcs8, None)
    except ValueError:
        raise OptionError(
            f"option {location_option!r}: the private key {entry.alias!r} of {location!r} is not a PKCS#8 "
            "key this connector reads"
        ) from None
    certificates = _jks_certificates(location_option, list(entry.chain))
    return _pem_certificates(certificates), _unencrypted_pem(key)


def _check_protocol_settings(options: Mapping[str, str]) -> None:
    for name in ("protocol", "enabled.protocols"):
        text = options.get(SSL_PREFIX + name)
        if text is None:
            continue
        versions = [v.strip() for v in text.split(",") if v.strip()]
        if not versions or any(v not in _TLS_VERSIONS for v in versions):
            raise OptionError(
                f"option '{SSL_PREFIX}{name}': {text!r} asks for a TLS version gRPC does not speak; gRPC "
                f"negotiates TLSv1.2 or TLSv1.3 (accepted values: {', '.join(_TLS_VERSIONS)})"
            )
    algorithm = options.get(SSL_PREFIX + "endpoint.identification.algorithm")
    if algorithm is not None and algorithm.strip().lower() != "https":
        raise OptionError(
            f"option '{SSL_PREFIX}endpoint.identification.algorithm': {algorithm!r} would turn off the check "
            "of the servers' names, which gRPC always makes; remove it and give the gateways and brokers "
            "certificates naming their addresses (services/security/certs.py's do)"
        )


def parse_kafka_tls(options: Mapping[str, str]) -> KafkaTls:
    """kafka.security.protocol and kafka.ssl.* (lower-cased option names) read into PEM bytes.

    PLAINTEXT and SSL are Kafka's protocols this connector speaks; SASL ones are refused (a
    bearer token, highwater.auth.token, authenticates instead). Store settings without
    kafka.security.protocol=SSL are refused rather than ignored, as they would be by Kafka.
    """
    protocol_text = options.get(PROTOCOL_OPTION)
    protocol = protocol_text.strip().upper() if protocol_text is not None else None
    given = tuple(sorted(k for k in options if k.startswith(SSL_PREFIX)))
    if protocol in _SASL_PROTOCOLS:
        raise OptionError(
            f"option {PROTOCOL_OPTION!r}={protocol_text!r}: Highwater authenticates with a client "
            "certificate (kafka.ssl.keystore.* or highwater.ssl.certfile / highwater.ssl.keyfile) or a "
            "bearer token from `highwater token create` (highwater.auth.token) over TLS "
            "(kafka.security.protocol=SSL), not SASL"
        )
    if protocol not in (None, PLAINTEXT, SSL):
        raise OptionError(f"option {PROTOCOL_OPTION!r} must be PLAINTEXT or SSL, got {protocol_text!r}")
    for key in given:
        name = key[len(SSL_PREFIX) :]
        if name not in (*STORE_SETTINGS, *NO_EFFECT_SETTINGS, *PROTOCOL_SETTINGS):
            raise OptionError(
                f"option {key!r} has no Highwater meaning: gRPC's TLS takes only the trust store, the key "
                f"store and their passwords ({', '.join(SSL_PREFIX + s for s in STORE_SETTINGS)}); remove it"
            )
    if given and protocol != SSL:
        raise OptionError(
            f"options {', '.join(map(repr, given))} are TLS settings, but {PROTOCOL_OPTION} is "
            f"{protocol_text or 'not set (PLAINTEXT)'}: set {PROTOCOL_OPTION}=SSL, or remove them"
        )
    _check_protocol_settings(options)
    key_store = _key_store(options)
    return KafkaTls(
        protocol=protocol,
        ca_cert=_trust_store(options),
        cert_chain=key_store[0] if key_store else None,
        private_key=key_store[1] if key_store else None,
        given=given,
    )
