"""Java's JKS key store format (sun.security.provider.JavaKeyStore), read with the standard library.

Spark jobs ported from format("kafka") mostly name JKS trust stores and key stores (JKS is
Kafka's default ssl.*.type). The format is small and documented by Java's source:

    magic 0xFEEDFEED, version (1 or 2), entry count            (big-endian u32s)
    per entry: tag (1 private key, 2 trusted certificate), alias (u16 length + modified UTF-8),
               timestamp (u64 ms), then
      trusted certificate: [v2: type as UTF] u32 length, DER certificate
      private key:         u32 length, protected key (EncryptedPrivateKeyInfo DER),
                           u32 chain length, per certificate: [v2: type as UTF] u32 length, DER
    SHA-1(password as UTF-16BE || b"Mighty Aphrodite" || every byte before it)   (20 bytes)

A protected key is Sun's JKS key protector (OID 1.3.6.1.4.1.42.2.17.1.1): salt (20 bytes)
|| encrypted key || check (20 bytes). The keystream is SHA-1 digests chained from the salt,
d_i = SHA-1(password as UTF-16BE || d_{i-1}), XORed with the encrypted key; the check is
SHA-1(password as UTF-16BE || plaintext), and the plaintext is a PKCS#8 PrivateKeyInfo.

Pure: bytes in, certificates and keys out. Errors are JksError subclasses that say which
password or what was wrong; kafka_tls.py turns them into OptionErrors naming the option.
JCEKS (0xCECECECE) is another format and is not read here.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass, field

JKS_MAGIC = b"\xfe\xed\xfe\xed"
JCEKS_MAGIC = b"\xce\xce\xce\xce"
_VERSIONS = (1, 2)
_PRIVATE_KEY_TAG = 1
_TRUSTED_CERT_TAG = 2
_DIGEST_BYTES = 20  # SHA-1: the file's integrity digest, the key protector's salt and check
_INTEGRITY_WHITENER = b"Mighty Aphrodite"  # Java's JavaKeyStore mixes these bytes into the digest
# DER of OID 1.3.6.1.4.1.42.2.17.1.1, Sun's proprietary JKS key protector.
_KEY_PROTECTOR_OID = bytes.fromhex("2b060104012a02110101")
_DER_SEQUENCE = 0x30
_DER_OID = 0x06
_DER_OCTET_STRING = 0x04


class JksError(ValueError):
    """A JKS file could not be read; the subclass says whose fault."""


class JksFormatError(JksError):
    """The bytes are not a well-formed JKS store (truncated, another format, an unknown entry)."""


class JksStorePasswordError(JksError):
    """The file's integrity digest does not match: a wrong store password, or altered bytes."""


class JksKeyPasswordError(JksError):
    """A private key's check does not match: a wrong key password."""


@dataclass(frozen=True)
class JksPrivateKeyEntry:
    """A private key entry as stored: the key still protected, the chain (leaf first) as DER."""

    alias: str
    protected_key: bytes = field(repr=False)
    chain: tuple[bytes, ...]


@dataclass(frozen=True)
class JksStore:
    """A JKS file's entries: trusted certificates (DER) and private key entries."""

    trusted_certificates: tuple[bytes, ...]
    private_keys: tuple[JksPrivateKeyEntry, ...]


def _password_bytes(password: str) -> bytes:
    """Java's char[] password as bytes: each UTF-16 code unit, high byte first."""
    return password.encode("utf-16-be", "surrogatepass")


class _Reader:
    """A cursor over the file's bytes; running past the end is a JksFormatError."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.offset = 0

    def take(self, count: int) -> bytes:
        if count < 0 or self.offset + count > len(self._data):
            raise JksFormatError(f"the file ends inside an entry (at byte {self.offset}, wanting {count})")
        chunk = self._data[self.offset : self.offset + count]
        self.offset += count
        return chunk

    def u16(self) -> int:
        value: int = struct.unpack(">H", self.take(2))[0]
        return value

    def u32(self) -> int:
        value: int = struct.unpack(">I", self.take(4))[0]
        return value

    def utf(self) -> str:
        """Java's DataInput.readUTF: modified UTF-8, which decodes as UTF-8 for what stores hold."""
        raw = self.take(self.u16())
        # Modified UTF-8 writes U+0000 as C0 80 and non-BMP characters as two 3-byte surrogates.
        return raw.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass")

    def certificate(self, version: int) -> bytes:
        if version == 2:
            kind = self.utf()
            if kind != "X.509":
                raise JksFormatError(f"a certificate of type {kind!r}; only X.509 certificates are read")
        return self.take(self.u32())


def parse_jks(data: bytes, store_password: str | None) -> JksStore:
    """The entries of a JKS file; the integrity digest is checked when store_password is given.

    Without a password Java skips the check (a trust store is usually opened so), and so does this.
    """
    if len(data) < len(JKS_MAGIC) + 8 + _DIGEST_BYTES or not data.startswith(JKS_MAGIC):
        raise JksFormatError("not a JKS file (no 0xFEEDFEED header)")
    body, digest = data[:-_DIGEST_BYTES], data[-_DIGEST_BYTES:]
    if store_password is not None:
        expected = hashlib.sha1(_password_bytes(store_password) + _INTEGRITY_WHITENER + body).digest()
        if not hmac.compare_digest(expected, digest):
            raise JksStorePasswordError(
                "the store's integrity digest does not match: the password is wrong, or the file was altered"
            )
    reader = _Reader(body)
    reader.take(len(JKS_MAGIC))
    version = reader.u32()
    if version not in _VERSIONS:
        raise JksFormatError(f"JKS version {version}; versions 1 and 2 are read")
    trusted: list[bytes] = []
    keys: list[JksPrivateKeyEntry] = []
    for _ in range(reader.u32()):
        tag = reader.u32()
        alias = reader.utf()
        reader.take(8)  # the entry's creation time (ms since the epoch): not needed
        if tag == _TRUSTED_CERT_TAG:
            trusted.append(reader.certificate(version))
        elif tag == _PRIVATE_KEY_TAG:
            protected = reader.take(reader.u32())
            chain = tuple(reader.certificate(version) for _ in range(reader.u32()))
            keys.append(JksPrivateKeyEntry(alias, protected, chain))
        else:
            # Tag 3 (a secret key) exists only in JCEKS; anything else is corruption.
            raise JksFormatError(f"entry {alias!r} has tag {tag}; a JKS entry is 1 (key) or 2 (certificate)")
    if reader.offset != len(body):
        raise JksFormatError(f"{len(body) - reader.offset} bytes follow the last entry")
    return JksStore(tuple(trusted), tuple(keys))


def _der(data: bytes, offset: int, tag: int) -> tuple[int, int]:
    """(start, end) of the contents of the DER element of `tag` at offset."""
    if offset + 2 > len(data) or data[offset] != tag:
        raise JksFormatError(f"the protected key is not the DER expected (tag 0x{tag:02x} at byte {offset})")
    length = data[offset + 1]
    start = offset + 2
    if length & 0x80:
        size = length & 0x7F
        if size == 0 or size > 4 or start + size > len(data):
            raise JksFormatError("the protected key has a malformed DER length")
        length = int.from_bytes(data[start : start + size], "big")
        start += size
    if start + length > len(data):
        raise JksFormatError("the protected key's DER runs past its end")
    return start, start + length


def _protected_key_bytes(encrypted_private_key_info: bytes) -> bytes:
    """The EncryptedPrivateKeyInfo's encryptedData, checking it is Sun's JKS key protector."""
    outer_start, outer_end = _der(encrypted_private_key_info, 0, _DER_SEQUENCE)
    algorithm_start, algorithm_end = _der(encrypted_private_key_info, outer_start, _DER_SEQUENCE)
    oid_start, oid_end = _der(encrypted_private_key_info, algorithm_start, _DER_OID)
    if encrypted_private_key_info[oid_start:oid_end] != _KEY_PROTECTOR_OID:
        raise JksFormatError(
            "the private key is protected by an algorithm other than Sun's JKS key protector "
            "(1.3.6.1.4.1.42.2.17.1.1)"
        )
    data_start, data_end = _der(encrypted_private_key_info, algorithm_end, _DER_OCTET_STRING)
    if data_end != outer_end:
        raise JksFormatError("the protected key has bytes after its encrypted data")
    return encrypted_private_key_info[data_start:data_end]


def recover_private_key(entry: JksPrivateKeyEntry, key_password: str) -> bytes:
    """The entry's private key as PKCS#8 PrivateKeyInfo DER, unprotected with key_password."""
    protected = _protected_key_bytes(entry.protected_key)
    if len(protected) < 2 * _DIGEST_BYTES:
        raise JksFormatError(f"the protected key of {entry.alias!r} is shorter than its salt and check")
    salt, encrypted, check = (
        protected[:_DIGEST_BYTES],
        protected[_DIGEST_BYTES:-_DIGEST_BYTES],
        protected[-_DIGEST_BYTES:],
    )
    password = _password_bytes(key_password)
    keystream = bytearray()
    digest = salt
    while len(keystream) < len(encrypted):
        digest = hashlib.sha1(password + digest).digest()
        keystream += digest
    plaintext = bytes(a ^ b for a, b in zip(encrypted, keystream, strict=False))
    if not hmac.compare_digest(hashlib.sha1(password + plaintext).digest(), check):
        raise JksKeyPasswordError(f"the key password does not open the private key of {entry.alias!r}")
    return plaintext
