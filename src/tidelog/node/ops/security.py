"""Who is who, and who may do what, through the metadata log: principals (tokens, SCRAM
credentials), ACLs and quotas as an admin changes them, and a token checked at login (by the
node's own admin token file, the metadata log, or its leader when this node's copy lags)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from tidelog.acls import PRINCIPAL_NAME, Acl
from tidelog.errors import (
    AuthenticationFailed,
    InvalidRequest,
    NotLeader,
    TidelogError,
    Timeout,
)
from tidelog.node.access import Access
from tidelog.node.asking import NodeAsker
from tidelog.node.cleaner import wall_ms
from tidelog.node.config import NodeConfig
from tidelog.node.login_guard import LoginGuard
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.ops.base import ConfiguredOps
from tidelog.node.quotas import (
    check_limits,
)
from tidelog.principals import check, check_hash, check_name, hash_secret, token_name
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.replication.metadata import (
    acl_key,
)
from tidelog.replication.metadata_commands import (
    MetadataCommand,
    PutAcl,
    PutPrincipal,
    PutQuota,
    RemoveAcl,
    RemovePrincipal,
    RemoveQuota,
)
from tidelog.scram import check_credentials

log = logging.getLogger(__name__)

AUTHENTICATE_WAIT_S = 5.0  # how long a token check waits for a metadata leader to decide


class Security(ConfiguredOps):
    def __init__(
        self,
        node_id: int,
        metadata_log: MetadataLog,
        access: Access,
        login_guard: LoginGuard,
        asker: NodeAsker,
        config: Callable[[], NodeConfig],
    ) -> None:
        self.node_id = node_id
        self.metadata_log = metadata_log
        self.access = access
        self.login_guard = login_guard
        self.asker = asker
        self._config = config
        self._acls_seen: tuple[object, int] | None = None
        self._acl_list: list[Acl] = []
        self._admin_hash: str | None = None  # of the admin token's secret, made at first use

    async def principals(
        self, req: api.PrincipalsRequest, payload: bytes
    ) -> api.PrincipalsResponse:
        if req.op == "list":
            known = self.metadata.principals
            return api.PrincipalsResponse(
                [{"name": n, "created_ms": known[n]["created_ms"]} for n in sorted(known)]
            )
        name = check_name(req.name)
        if req.op == "add":
            encoded = check_hash(req.hash)
            scram = check_credentials(req.scram)
            command: MetadataCommand = PutPrincipal(name, encoded, scram, wall_ms())
        elif req.op == "remove":
            if name not in self.metadata.principals:
                raise InvalidRequest(f"no principal {name!r}")
            command = RemovePrincipal(name, wall_ms())
            acls = sum(1 for a in self.metadata.acls.values() if a.get("principal") == name)
        else:
            raise InvalidRequest(f"unknown principals op {req.op!r}")
        await self.propose_metadata(command, 30.0)
        found = self.metadata.principals.get(name)
        return api.PrincipalsResponse(
            [] if found is None else [{"name": name, "created_ms": found["created_ms"]}],
            acls_removed=acls if req.op == "remove" else 0,
        )

    def parsed_acls(self) -> list[Acl]:
        """The metadata's ACLs as Access reads them: parsed again only after they change."""
        state = self.metadata
        seen = self._acls_seen
        if seen is None or seen[0] is not state or seen[1] != state.acls_changed:
            self._acl_list = [Acl.from_wire(a) for a in state.acls.values()]
            self._acls_seen = (state, state.acls_changed)
        return self._acl_list

    async def acls(self, req: api.AclsRequest, payload: bytes) -> api.AclsResponse:
        if req.op == "list":
            found = [a for a in self.parsed_acls() if req.principal in ("", a.principal)]
            listed = sorted((a.to_wire() for a in found), key=acl_key)
            return api.AclsResponse(listed)
        if req.op not in ("add", "remove"):
            raise InvalidRequest(f"unknown acl op {req.op!r}")
        acl = Acl.from_wire(req.acl)
        if req.op == "remove" and acl_key(acl.to_wire()) not in self.metadata.acls:
            raise InvalidRequest(f"no such ACL: {acl}")
        change = PutAcl if req.op == "add" else RemoveAcl
        await self.propose_metadata(change(acl.to_wire(), wall_ms()), 30.0)
        return api.AclsResponse([acl.to_wire()])

    async def quotas(self, req: api.QuotasRequest, payload: bytes) -> api.QuotasResponse:
        known = self.metadata.quotas
        if req.op == "list":
            return api.QuotasResponse([{"principal": p, "limits": known[p]} for p in sorted(known)])
        if not PRINCIPAL_NAME.fullmatch(req.principal):
            raise InvalidRequest(f"invalid principal {req.principal!r} for a quota")
        if req.op == "set":
            limits = check_limits(req.limits)
            command: MetadataCommand = PutQuota(req.principal, limits, wall_ms())
        elif req.op == "remove":
            if req.principal not in known:
                raise InvalidRequest(f"no quota for {req.principal!r}")
            command = RemoveQuota(req.principal, wall_ms())
        else:
            raise InvalidRequest(f"unknown quotas op {req.op!r}")
        await self.propose_metadata(command, 30.0)
        limits = self.metadata.quotas.get(req.principal, {})
        return api.QuotasResponse([{"principal": req.principal, "limits": limits}])

    async def authenticate(
        self, req: api.AuthenticateRequest, payload: bytes
    ) -> api.AuthenticateResponse:
        """Checks a token; the listener makes the connection that principal on success."""
        name, secret = token_name(req.token)
        admin = self.config.admin_token
        if admin is not None and name == admin[0]:
            # The bootstrap super user (--admin-token-file): decided by the node's own file,
            # through the same Argon2id check as any token, so that the time an answer takes
            # does not say which name is the super user (0.3 ms against 125 ms, before).
            if self._admin_hash is None:
                self._admin_hash = await hash_secret(admin[1])
            if await check(self._admin_hash, secret):
                return api.AuthenticateResponse(name)
            self.access.denied += 1
            raise AuthenticationFailed(f"the token of {name!r} is not valid", principal=name)
        deadline = time.monotonic() + AUTHENTICATE_WAIT_S
        while True:
            host = self.metadata_host
            if host.replica.is_leader:
                # A new leader's state may miss what it has not yet committed in its term.
                with contextlib.suppress(TidelogError, TimeoutError):
                    await host.wait_for_ack(host.log.log_end_offset - 1, api.ACKS_ALL, 2.0)
                if await self.token_holds(name, secret):
                    return api.AuthenticateResponse(name)
                break
            if await self.token_holds(name, secret):
                return api.AuthenticateResponse(name)
            if req.forwarded:
                # Asked by a node that took us for the metadata leader: we are not (anymore).
                raise NotLeader("not the metadata leader", leader_hint=host.leader_hint)
            # A follower's metadata may lag (a principal just added, a node just restarted):
            # what it cannot confirm, the metadata leader decides.
            decided = await self.authenticate_at_metadata_leader(req)
            if decided is not None:
                return decided
            if time.monotonic() > deadline:
                raise Timeout(f"cannot check the token of {name!r} now: no metadata leader answers")
            await asyncio.sleep(0.1)
        self.access.denied += 1
        raise AuthenticationFailed(f"the token of {name!r} is not valid", principal=name)

    async def guarded_authenticate(
        self, address: str, req: api.AuthenticateRequest, payload: bytes
    ) -> api.AuthenticateResponse:
        """A token check as the login guard allows it (node/login_guard.py): a failure is answered
        late, later for each one from its address, and suspects take turns for the hash."""
        name = req.token.partition(":")[0][:200]
        host = address.rsplit(":", 1)[0]  # (the connection's "HOST:PORT": every port alike)
        async with self.login_guard.attempt(host, name):
            return await self.authenticate(req, payload)

    async def token_holds(self, name: str, secret: str) -> bool:
        entry = self.metadata.principals.get(name)
        return await check(entry["hash"] if entry is not None else None, secret)

    async def authenticate_at_metadata_leader(
        self, req: api.AuthenticateRequest
    ) -> api.AuthenticateResponse | None:
        host = self.metadata_host
        leader = host.leader_hint
        if host.replica.is_leader or leader is None or leader == self.node_id:
            return None
        forwarded = api.AuthenticateRequest(req.token, forwarded=True)
        try:
            header = await self.asker.ask(leader, ApiKey.AUTHENTICATE, forwarded, 10.0)
        except AuthenticationFailed:
            raise
        except TidelogError:
            return None  # unreachable, or it could not decide either: ask again
        return api.decode(api.AuthenticateResponse, header)
