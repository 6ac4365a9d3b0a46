"""Principals and their tokens. A token is "NAME:SECRET"; the cluster keeps only an Argon2id hash
of the secret (argon2-cffi's PasswordHasher: salted and slow, ~0.1 s a check here), made where
the token is made, so the secret never travels to a node except to prove itself on a
connection (over TLS, where it matters)."""

from __future__ import annotations

import re
import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from tidelog.errors import AuthenticationFailed, InvalidRequest

PRINCIPAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")  # fullmatch; no ":" (token)
SECRET_BYTES = 32

_hasher = PasswordHasher()


def check_name(name: str) -> str:
    if not PRINCIPAL_NAME.fullmatch(name):
        raise InvalidRequest(
            f"invalid principal name {name!r}: letters, digits and . _ @ - (at most 128), "
            "starting with a letter or digit"
        )
    return name


def new_token(name: str) -> tuple[str, str]:
    """A fresh token for name, and the hash the cluster keeps of its secret."""
    secret = secrets.token_urlsafe(SECRET_BYTES)
    return f"{check_name(name)}:{secret}", _hasher.hash(secret)


def token_name(token: str) -> tuple[str, str]:
    name, sep, secret = token.partition(":")
    if not sep or not secret or not PRINCIPAL_NAME.fullmatch(name):
        raise AuthenticationFailed("a token is NAME:SECRET, as `tidelog principals add` prints it")
    return name, secret


def verify(encoded_hash: str, secret: str) -> bool:
    """Slow on purpose (Argon2id): call it off the event loop."""
    try:
        return _hasher.verify(encoded_hash, secret)
    except (VerificationError, InvalidHashError):
        return False
