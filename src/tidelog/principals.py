"""Principals and their tokens. A token is "NAME:SECRET"; the cluster keeps only an Argon2id hash
of the secret (argon2-cffi's PasswordHasher: salted and slow, ~0.1 s a check here), made where
the token is made, so the secret never travels to a node except to prove itself on a
connection (over TLS, where it matters)."""

from __future__ import annotations

import asyncio
import functools
import re
import secrets
from concurrent.futures import ThreadPoolExecutor

from argon2 import PasswordHasher, Type, extract_parameters
from argon2.exceptions import InvalidHashError, VerificationError

from tidelog.acls import ANONYMOUS
from tidelog.errors import AuthenticationFailed, InvalidRequest

PRINCIPAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")  # fullmatch; no ":" (token)
SECRET_BYTES = 32

_hasher = PasswordHasher()
# Checks run here, two at a time, never on the event loop nor in the loop's default executor
# (which name lookups and other work share): a flood of bad tokens queues, it does not starve.
_checks = ThreadPoolExecutor(max_workers=2, thread_name_prefix="token-check")
# What a stored hash may ask of a check (argon2-cffi's defaults are t=3, m=64 MiB, p=4).
TIME_COST_MAX = 10
MEMORY_KIB_MAX = 256 * 1024
PARALLELISM_MAX = 8


def check_name(name: str) -> str:
    if not PRINCIPAL_NAME.fullmatch(name) or name == ANONYMOUS:
        raise InvalidRequest(
            f"invalid principal name {name!r}: letters, digits and . _ @ - (at most 128), "
            "starting with a letter or digit; not anonymous"
        )
    return name


def new_token(name: str) -> tuple[str, str]:
    """A fresh token for name, and the hash the cluster keeps of its secret."""
    secret = secrets.token_urlsafe(SECRET_BYTES)
    return f"{check_name(name)}:{secret}", _hasher.hash(secret)


def check_hash(encoded: str) -> str:
    """A hash a client sends for a new token: Argon2id with bounded cost, so that checking a
    token can never hold a node's thread (or memory) for long."""
    try:
        p = extract_parameters(encoded)
    except InvalidHashError:
        raise InvalidRequest("a principal is added with the Argon2id hash of its secret") from None
    if (
        p.type is not Type.ID
        or p.time_cost > TIME_COST_MAX
        or p.memory_cost > MEMORY_KIB_MAX
        or p.parallelism > PARALLELISM_MAX
    ):
        raise InvalidRequest(
            f"the token hash must be Argon2id with t <= {TIME_COST_MAX}, m <= {MEMORY_KIB_MAX} "
            f"KiB and p <= {PARALLELISM_MAX}"
        )
    return encoded


def token_name(token: str) -> tuple[str, str]:
    name, sep, secret = token.partition(":")
    if not sep or not secret or not PRINCIPAL_NAME.fullmatch(name):
        raise AuthenticationFailed("a token is NAME:SECRET, as `tidelog principals add` prints it")
    try:
        secret.encode()
    except UnicodeEncodeError:
        raise AuthenticationFailed("a token's secret is text that encodes as UTF-8") from None
    return name, secret


def verify(encoded_hash: str, secret: str) -> bool:
    """Slow on purpose (Argon2id): call it through check(), off the event loop."""
    try:
        return _hasher.verify(encoded_hash, secret)
    except (VerificationError, InvalidHashError):
        return False


async def check(encoded_hash: str | None, secret: str) -> bool:
    """Does secret match? For an unknown principal (None) a decoy is checked, so that the
    answer takes as long either way."""
    loop = asyncio.get_running_loop()
    if encoded_hash is None:
        encoded = await loop.run_in_executor(_checks, _decoy)
    else:
        encoded = encoded_hash
    held = await loop.run_in_executor(_checks, verify, encoded, secret)
    return held and encoded_hash is not None


async def hash_secret(secret: str) -> str:
    """The Argon2id hash of secret, off the event loop (slow on purpose)."""
    return await asyncio.get_running_loop().run_in_executor(_checks, _hasher.hash, secret)


@functools.cache
def _decoy() -> str:
    return new_token("decoy")[1]
