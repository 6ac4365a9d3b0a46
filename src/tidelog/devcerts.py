"""`tidelog dev-certs DIR`: a local CA and certificates to try TLS with, made with the
`cryptography` package. Not for production: the CA's key sits next to the certificates.

    DIR/ca.pem            the CA: every node and client trusts it (--tls-ca)
    DIR/ca.key            the CA's key (to sign more with `tidelog dev-certs DIR --client NAME`)
    DIR/node.pem, node.key  one certificate for every node: server and client use (nodes dial
                          each other with it), valid for the given host names and addresses
    DIR/client-NAME.pem, client-NAME.key  a client certificate whose subject is CN=NAME
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tidelog.errors import InvalidConfig

VALID_DAYS = 365
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")

Key = ec.EllipticCurvePrivateKey


def client_principal(name: str) -> str:
    """The principal a node sees for `dev-certs --client NAME`'s certificate (tls.peer_subject:
    the subject in the certificate's order), the name ACLs grant to."""
    return f"O=tidelog dev,CN={name}"


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tidelog dev"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write(directory: Path, stem: str, cert: x509.Certificate, key: Key) -> None:
    (directory / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path = directory / f"{stem}.key"
    # Created 0600: never readable by others, not even for a moment.
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # (a key that was there already kept its mode, 0644 say)
    with os.fdopen(fd, "wb") as out:
        out.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )


def _builder(subject: x509.Name, issuer: x509.Name, key: Key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )


def _load_ca(directory: Path) -> tuple[x509.Certificate, Key] | None:
    cert_path, key_path = directory / "ca.pem", directory / "ca.key"
    if not cert_path.exists():
        return None
    if not key_path.exists():
        raise InvalidConfig(
            f"{cert_path} is there but not its key {key_path}: cannot sign with that CA",
            key="dir",
        )
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise InvalidConfig(f"{key_path} is not a key dev-certs made", key="dir")
    return cert, key


def _new_ca(directory: Path) -> tuple[x509.Certificate, Key]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("tidelog dev CA")
    cert = (
        _builder(name, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
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
        .sign(key, hashes.SHA256())
    )
    _write(directory, "ca", cert, key)
    return cert, key


def _leaf(
    ca: tuple[x509.Certificate, Key],
    common_name: str,
    usages: list[x509.ObjectIdentifier],
    hosts: Sequence[str] = (),
) -> tuple[x509.Certificate, Key]:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(_name(common_name), ca_cert.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        # Python 3.13+ verifies strictly (VERIFY_X509_STRICT): key identifiers are required.
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if hosts:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_dev_certs(
    directory: Path, hosts: Sequence[str] = DEFAULT_HOSTS, clients: Sequence[str] = ("admin",)
) -> list[Path]:
    """Make (or reuse) the CA in directory, then a node certificate for hosts (unless one is
    there) and a certificate per client name. Returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    before = set(directory.iterdir())
    ca = _load_ca(directory) or _new_ca(directory)
    if not (directory / "node.pem").exists():
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        cert, key = _leaf(ca, "tidelog-node", usages, list(hosts))
        _write(directory, "node", cert, key)
    for name in clients:
        if not name or "/" in name or name.startswith("."):
            raise InvalidConfig(f"client name {name!r} cannot name a file", key="client")
        cert, key = _leaf(ca, name, [ExtendedKeyUsageOID.CLIENT_AUTH])
        _write(directory, f"client-{name}", cert, key)
    return sorted(
        set(directory.iterdir()) - before | {directory / f"client-{n}.pem" for n in clients}
    )
