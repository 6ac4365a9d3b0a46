"""SASL/SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka clients speak them on the
Kafka port: the server side of the exchange, and the credentials a principal's token leaves
with the cluster.

A principal's token NAME:SECRET is the SCRAM user NAME with password SECRET. The client that
adds the principal derives, per mechanism, a random salt, PBKDF2 of the secret
(SCRAM_ITERATIONS rounds), and from it StoredKey and ServerKey; only those go to the cluster, as
Kafka keeps its SCRAM credentials. The secret itself never leaves the client.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidelog.errors import AuthenticationFailed, InvalidRequest
from tidelog.invariant import InvariantBroken

MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
SCRAM_ITERATIONS = 8192  # Kafka's least is 4096
ITERATIONS_RANGE = (4096, 1_000_000)  # what a stored credential may ask of a client
SALT_BYTES = 32


def _hmac(name: str, key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, name).digest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def credentials(secret: str, iterations: int = SCRAM_ITERATIONS) -> dict[str, dict[str, Any]]:
    """The stored SCRAM credentials of a secret, for every mechanism (a fresh salt each)."""
    found = {}
    for mechanism, name in MECHANISMS.items():
        salt = os.urandom(SALT_BYTES)
        salted = hashlib.pbkdf2_hmac(name, secret.encode(), salt, iterations)
        client_key = _hmac(name, salted, b"Client Key")
        found[mechanism] = {
            "iterations": iterations,
            "salt": _b64(salt),
            "stored_key": _b64(hashlib.new(name, client_key).digest()),
            "server_key": _b64(_hmac(name, salted, b"Server Key")),
        }
    return found


def check_credentials(scram: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Stored credentials as a client sent them, checked: known mechanisms, bounded
    iterations, keys of the hash's length (InvalidRequest otherwise)."""
    checked: dict[str, dict[str, Any]] = {}
    for mechanism, entry in dict(scram).items():
        name = MECHANISMS.get(mechanism)
        if name is None:
            raise InvalidRequest(f"unknown SCRAM mechanism {mechanism!r}")
        try:
            iterations = int(entry["iterations"])
            salt = base64.b64decode(entry["salt"], validate=True)
            keys = [base64.b64decode(entry[k], validate=True) for k in ("stored_key", "server_key")]
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidRequest(f"malformed {mechanism} credentials: {exc}") from None
        size = hashlib.new(name).digest_size
        low, high = ITERATIONS_RANGE
        if not low <= iterations <= high or not 16 <= len(salt) <= 128:
            raise InvalidRequest(f"{mechanism}: iterations must be in [{low}, {high}], salt 16+")
        if any(len(k) != size for k in keys):
            raise InvalidRequest(f"{mechanism}: keys must be {size} bytes")
        checked[mechanism] = {
            "iterations": iterations,
            "salt": entry["salt"],
            "stored_key": entry["stored_key"],
            "server_key": entry["server_key"],
        }
    return checked


_DECOY_KEY: list[bytes] = []  # set once per process: the cluster's, else a random one


def seed_decoys(cluster_secret: bytes) -> None:
    """Derive the decoy key from the cluster secret, so that every node answers an unknown
    user with the same salt (a random key per node gave each its own, and two nodes told which
    users exist). Without a secret (one node) a random key stands in."""
    _DECOY_KEY[:] = [_hmac("sha256", cluster_secret, b"tidelog scram decoy")]


def _decoy_key() -> bytes:
    if not _DECOY_KEY:
        _DECOY_KEY.append(os.urandom(32))
    return _DECOY_KEY[0]


def decoy(mechanism: str, user: str) -> dict[str, Any]:
    """Credentials for a user that does not exist: the same salt at every attempt, a key that
    matches no proof, so the exchange does not tell who exists."""
    name = MECHANISMS[mechanism]
    salt = _hmac("sha256", _decoy_key(), user.encode())
    wrong = _b64(_hmac(name, _decoy_key(), b"decoy:" + user.encode()))
    return {
        "iterations": SCRAM_ITERATIONS,
        "salt": _b64(salt),
        "stored_key": wrong,
        "server_key": wrong,
    }


_ATTRIBUTE = re.compile(r"([a-zA-Z])=(.*)")


def _attributes(message: str) -> dict[str, str]:
    found = {}
    for part in message.split(","):
        match = _ATTRIBUTE.fullmatch(part)
        if match is None:
            raise AuthenticationFailed("malformed SCRAM message")
        found[match.group(1)] = match.group(2)
    return found


def _unescape(saslname: str) -> str:
    if re.search(r"=(?!2C|3D)", saslname):
        raise AuthenticationFailed("malformed SCRAM user name")
    return saslname.replace("=2C", ",").replace("=3D", "=")


@dataclass
class ScramExchange:
    """One server side of a SCRAM exchange: client-first → server-first, client-final →
    server-final. Any misstep raises AuthenticationFailed."""

    mechanism: str
    user: str = ""
    stored: dict[str, Any] | None = None
    client_first_bare: str = ""
    gs2_header: str = ""  # "n,," (or with an authorization id): client-final's c= repeats it
    server_first: str = ""
    nonce: str = ""

    def first(
        self, client_first: bytes, stored_of: Callable[[str], dict[str, Any] | None]
    ) -> bytes:
        """stored_of(user) -> stored credentials of this mechanism, or None."""
        try:
            text = client_first.decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("malformed SCRAM message") from None
        gs2, sep, bare = text.partition(",")
        authzid, sep2, bare = bare.partition(",")
        if (
            not sep
            or not sep2
            or gs2 not in ("n", "y")
            or (authzid and not authzid.startswith("a="))
        ):
            raise AuthenticationFailed("malformed SCRAM client-first message (channel binding?)")
        fields = _attributes(bare)
        if "n" not in fields or "r" not in fields or not fields["r"]:
            raise AuthenticationFailed("SCRAM client-first message needs n= and r=")
        self.user = _unescape(fields["n"])
        if authzid and _unescape(authzid[2:]) != self.user:
            raise AuthenticationFailed("a SCRAM authorization id must be the user itself")
        self.stored = stored_of(self.user) or decoy(self.mechanism, self.user)
        self.client_first_bare = bare
        self.gs2_header = f"{gs2},{authzid},"
        self.nonce = fields["r"] + base64.b64encode(os.urandom(18)).decode()
        if self.stored is None:
            raise InvariantBroken("self.stored is not None")
        self.server_first = (
            f"r={self.nonce},s={self.stored['salt']},i={int(self.stored['iterations'])}"
        )
        return self.server_first.encode()

    def final(self, client_final: bytes) -> tuple[str, bytes]:
        """The user proved, and the server-final message that proves us to it."""
        name = MECHANISMS[self.mechanism]
        if self.stored is None:
            raise InvariantBroken("self.stored is not None")
        try:
            text = client_final.decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("malformed SCRAM message") from None
        without_proof, sep, proof_part = text.rpartition(",")
        fields = _attributes(text)
        if not sep or not proof_part.startswith("p=") or fields.get("r") != self.nonce:
            raise AuthenticationFailed("SCRAM client-final message does not match the exchange")
        if fields.get("c") != _b64(self.gs2_header.encode()):  # no channel binding
            raise AuthenticationFailed("SCRAM channel binding is not supported")
        auth_message = f"{self.client_first_bare},{self.server_first},{without_proof}".encode()
        try:
            proof = base64.b64decode(fields["p"], validate=True)
            stored_key = base64.b64decode(self.stored["stored_key"])
            server_key = base64.b64decode(self.stored["server_key"])
        except ValueError:
            raise AuthenticationFailed("malformed SCRAM proof") from None
        signature = _hmac(name, stored_key, auth_message)
        if len(proof) != len(signature):
            raise AuthenticationFailed(
                f"the {self.mechanism} credentials of {self.user!r} are not valid"
            )
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(name, client_key).digest(), stored_key):
            raise AuthenticationFailed(
                f"the {self.mechanism} credentials of {self.user!r} are not valid",
                principal=self.user,
            )
        verifier = _b64(_hmac(name, server_key, auth_message))
        return self.user, f"v={verifier}".encode()
