"""SASL on the Kafka port (SaslHandshake v1, SaslAuthenticate v0-2): how a Kafka client
configured with security.protocol=SASL_SSL (or SASL_PLAINTEXT) proves a tidelog principal.

- PLAIN: username and password are a token's NAME and SECRET, checked as tidelog's own
  AUTHENTICATE checks them (the metadata log's Argon2id hash, or the node's admin token file).
  Offered only over TLS or from loopback: PLAIN sends the secret as it is.
- SCRAM-SHA-256 and SCRAM-SHA-512: against the credentials `tidelog principals add` left with
  the cluster (tidelog/scram.py); the secret never crosses the wire.

A client that does not start SASL stays who TLS says it is (its certificate's subject) or
anonymous, and ACLs decide what that may do.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from tidelog.errors import AuthenticationFailed, TidelogError
from tidelog.node.access import Principal
from tidelog.protocol import api
from tidelog.scram import MECHANISMS, ScramExchange, credentials

if TYPE_CHECKING:
    from tidelog.kafka.broker import KafkaBroker

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58


@functools.cache
def _admin_credentials(secret: str) -> dict[str, dict[str, Any]]:
    return credentials(secret)


class SaslSession:
    """One connection's SASL state."""

    def __init__(self, broker: KafkaBroker, plain_allowed: bool, connection: Principal) -> None:
        self.broker = broker
        self.connection = connection  # who the connection was before SASL (TLS, or anonymous)
        self.mechanisms = (["PLAIN"] if plain_allowed else []) + list(MECHANISMS)
        self.mechanism = ""
        self.scram: ScramExchange | None = None
        self.done = False

    @property
    def mid_exchange(self) -> bool:
        """A handshake chose a mechanism and authentication has not finished."""
        return bool(self.mechanism) and not self.done

    def handshake(self, mechanism: str) -> dict[str, Any]:
        if self.mechanism or self.done:
            return {"error_code": ILLEGAL_SASL_STATE, "mechanisms": self.mechanisms}
        if mechanism not in self.mechanisms:
            return {"error_code": UNSUPPORTED_SASL_MECHANISM, "mechanisms": self.mechanisms}
        self.mechanism = mechanism
        return {"error_code": 0, "mechanisms": self.mechanisms}

    async def authenticate(self, auth_bytes: bytes) -> tuple[dict[str, Any], str | None]:
        """The answer, and the principal once proved. AuthenticationFailed ends the connection
        (after the answer says why), as in Kafka."""
        if not self.mechanism or self.done:
            raise AuthenticationFailed("SaslAuthenticate before SaslHandshake")
        proved: str | None = None
        if self.mechanism == "PLAIN":
            parts = auth_bytes.split(b"\0")
            if len(parts) != 3:
                raise AuthenticationFailed("malformed SASL/PLAIN message")
            authzid, user, password = (p.decode(errors="replace") for p in parts)
            if authzid and authzid != user:
                raise AuthenticationFailed("a SASL/PLAIN authorization id must be the user")
            # Checked as tidelog's AUTHENTICATE checks a token, through the core's one entry.
            request = api.AuthenticateRequest(f"{user}:{password}")
            answer = await self.broker._call(self.connection, request)
            proved, out = answer.principal, b""
        elif self.scram is None:
            self.scram = ScramExchange(self.mechanism)
            out = self.scram.first(auth_bytes, self._stored)
        else:
            guard = self.broker.core.login_guard
            host = self.connection.address.rsplit(":", 1)[0]
            async with guard.attempt(host, self.scram.user):
                proved, out = self.scram.final(auth_bytes)
        self.done = proved is not None
        return {"error_code": 0, "auth_bytes": out, "session_lifetime": 0}, proved

    def _stored(self, user: str) -> dict[str, Any] | None:
        admin = self.broker.core.config.admin_token
        if admin is not None and user == admin[0]:
            return _admin_credentials(admin[1])[self.mechanism]
        entry = self.broker.view.principals.get(user)
        found = None if entry is None else entry.get("scram", {}).get(self.mechanism)
        return dict(found) if found else None


def failed_answer(exc: TidelogError) -> dict[str, Any]:
    return {
        "error_code": SASL_AUTHENTICATION_FAILED,
        "error_message": exc.message,
        "auth_bytes": b"",
        "session_lifetime": 0,
    }
