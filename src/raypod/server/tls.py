"""TLS material for the server: the user's certificate, or one made on first start.

Made here: a local CA (``tls/ca.crt``, its key 0600) that signs a leaf server certificate (``CA:FALSE``,
``serverAuth``, SANs for localhost, the host name, 127.0.0.1 and the bind address). Clients trust ``ca.crt``;
the server's own certificate cannot sign anything.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from pathlib import Path
from typing import Any


def ca_path(home: Path) -> Path:
    return home / "tls" / "ca.crt"


def self_signed(home: Path, host: str = "127.0.0.1", origin_domain: str = "localhost") -> tuple[Path, Path]:
    """Return (cert, key) under ``home/tls``, creating them (and the local CA) once; keys are written 0600. The
    leaf also names ``*.<origin_domain>``, the proxied pages' own origins; a leaf made before without it is made
    again, by the same CA (clients keep trusting ``ca.crt``)."""
    directory = home / "tls"
    cert_path, key_path = directory / "server.crt", directory / "server.key"
    made = cert_path.exists() and key_path.exists() and ca_path(home).exists()
    if made and f"*.{origin_domain}".encode() in _san_names(cert_path):
        return cert_path, key_path
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = datetime.datetime.now(datetime.UTC)
    reused = _existing_ca(home)
    ca_key = reused[1] if reused else ec.generate_private_key(ec.SECP256R1())
    ca_name = (
        reused[0].subject
        if reused
        else x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"raypod local CA ({socket.gethostname()})")])
    )
    ca = (
        reused[0]
        if reused
        else (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName(socket.gethostname()),
        x509.DNSName(f"*.{origin_domain}"),
    ]
    addresses = {"127.0.0.1"}
    try:
        if not ipaddress.ip_address(host).is_unspecified:
            addresses.add(host)
    except ValueError:
        names.append(x509.DNSName(host))
    names += [x509.IPAddress(ipaddress.ip_address(address)) for address in sorted(addresses)]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "raypod")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=397))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_private(directory / "ca.key", _pem_key(ca_key))
    _write_private(key_path, _pem_key(key))
    from cryptography.hazmat.primitives import serialization

    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    ca_path(home).write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def _existing_ca(home: Path) -> tuple[Any, Any] | None:
    """(certificate, key) of the local CA made before, if both are readable."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        cert = x509.load_pem_x509_certificate(ca_path(home).read_bytes())
        key = serialization.load_pem_private_key((home / "tls" / "ca.key").read_bytes(), password=None)
    except (OSError, ValueError):
        return None
    return cert, key


def _san_names(cert_path: Path) -> bytes:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return b""
    return "\n".join(names.get_values_for_type(x509.DNSName)).encode()


def _pem_key(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    data: bytes = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return data


def _write_private(path: Path, data: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o600)
