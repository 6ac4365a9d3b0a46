"""TLS for every listener and every dialer, from PEM files: Python's `ssl`, nothing else.

A node serves its listeners with its certificate (`--tls-cert`, `--tls-key`) and verifies the
other side against `--tls-ca`. Between nodes TLS is mutual: each node dials with its own
certificate and the peer listener requires one signed by the CA (the peer handshake's HMAC still
binds the connection to a node id). Client listeners ask for a client certificate as
`tls.client.auth` says (Kafka's ssl.client.auth): none, requested or required; a verified
client certificate's subject is the connection's principal.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

from tidelog.errors import AuthenticationFailed, InvalidConfig

CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}
HANDSHAKE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class TlsFiles:
    ca: Path | None = None  # PEM bundle of the CAs that sign the other side's certificates
    cert: Path | None = None  # our certificate (chain), PEM
    key: Path | None = None  # its private key, PEM

    @staticmethod
    def of(
        ca: str | Path | None = None, cert: str | Path | None = None, key: str | Path | None = None
    ) -> TlsFiles | None:
        """None when no file is given (plain TCP); refuses a certificate without its key."""
        if not (ca or cert or key):
            return None
        if bool(cert) != bool(key):
            raise InvalidConfig(
                "tls.cert and tls.key go together: a certificate needs its private key",
                key="tls.key" if cert else "tls.cert",
            )
        files = TlsFiles(
            Path(ca) if ca else None, Path(cert) if cert else None, Path(key) if key else None
        )
        for name, path in (("tls.ca", files.ca), ("tls.cert", files.cert), ("tls.key", files.key)):
            if path is not None and not path.is_file():
                raise InvalidConfig(f"{name}: {path} is not a readable file", key=name)
        return files

    def server_context(self, client_auth: str = "none") -> ssl.SSLContext:
        if self.cert is None or self.key is None:
            raise InvalidConfig(
                "a TLS listener needs its certificate and key (--tls-cert, --tls-key)",
                key="tls.cert",
            )
        mode = self.key.stat().st_mode & 0o777
        if mode & 0o077:
            logging.getLogger(__name__).warning(
                "the TLS key %s can be read by others (mode %o): chmod 600 %s",
                self.key,
                mode,
                self.key,
            )
        if client_auth not in CLIENT_AUTH:
            raise InvalidConfig(
                f"tls.client.auth must be one of {', '.join(CLIENT_AUTH)}, got {client_auth!r}",
                key="tls.client.auth",
            )
        if client_auth != "none" and self.ca is None:
            raise InvalidConfig(
                f"tls.client.auth={client_auth} verifies client certificates: give --tls-ca",
                key="tls.ca",
            )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if client_auth != "none":
            # Under TLS 1.3 a client certificate is checked after the client's side of the
            # handshake is done: a refused one resets the connection after the client has sent
            # its first request, which it cannot tell from a crash. Under TLS 1.2 the refusal
            # ends the handshake itself, before anything is sent (handshake_error).
            context.maximum_version = ssl.TLSVersion.TLSv1_2
        self._load(context)
        context.verify_mode = CLIENT_AUTH[client_auth]
        return context

    def client_context(self) -> ssl.SSLContext:
        """Verifies the node's certificate and host name against tls.ca (or the system's CAs);
        presents our certificate when we have one (mutual TLS)."""
        # Not create_default_context(): it reads the system's whole CA store (23 ms here) even
        # when tls.ca is given, for every client (and the Spark source makes one per task).
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies certificate and host name
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.ca is None:
            context.load_default_certs(ssl.Purpose.SERVER_AUTH)
        self._load(context)
        return context

    def _load(self, context: ssl.SSLContext) -> None:
        try:
            if self.ca is not None:
                context.load_verify_locations(cafile=str(self.ca))
            if self.cert is not None and self.key is not None:
                context.load_cert_chain(str(self.cert), str(self.key))
        except (ssl.SSLError, OSError) as exc:
            raise InvalidConfig(
                f"cannot load TLS files (ca={self.ca}, cert={self.cert}, key={self.key}): {exc}",
                key="tls.cert",
            ) from None


def handshake_error(exc: BaseException, address: str) -> AuthenticationFailed | None:
    """The named error for a TLS handshake that failed, or None when exc is not one (a refused
    connection, or a reset outside the handshake, stays a NetworkError)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return AuthenticationFailed(
            f"the certificate of {address} does not verify: {exc.verify_message}",
            address=address,
        )
    if isinstance(exc, ssl.SSLError):
        return AuthenticationFailed(
            f"TLS handshake with {address} failed: {exc.reason or exc}", address=address
        )
    return None


def handshake_reset_hint(exc: BaseException, in_handshake: bool) -> str:
    """Why a node may have ended a connection within the TLS handshake, for the (retriable)
    NetworkError that says so: it admits a connection before its handshake, so one it turns
    away for want of room ends there too -- not only a certificate it does not accept."""
    if not in_handshake or not isinstance(exc, ConnectionResetError):
        return ""
    return (
        " (ended within the TLS handshake: the node may be turning connections away -- "
        "max.connections, max.connections.per.ip, its descriptor reserve -- or not accept "
        "this client's certificate)"
    )


def peer_subject(transport_info: object) -> str:
    """The principal name of a verified client certificate: its subject as "CN=...,O=..." in
    the order the certificate gives, each value escaped as RFC 4514 says (a `,` `+` `"` `\\`
    `<` `>` `;` in a value, a leading `#` or space, a trailing space), attributes of one
    multi-valued RDN joined by `+`; "" without one. Unescaped, an organization named
    'tidelog dev,CN=carol' made the principal of another subject."""
    if not isinstance(transport_info, dict):
        return ""
    short = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU"}
    rdns = []
    for rdn in transport_info.get("subject", ()):
        rdns.append("+".join(f"{short.get(n, n)}={rfc4514_escape(str(v))}" for n, v in rdn))
    return ",".join(rdns)


def rfc4514_escape(value: str) -> str:
    out = "".join("\\" + c if c in ',+"\\<>;' else ("\\00" if c == "\0" else c) for c in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out
