"""The server side of SCRAM (RFC 5802/7677) against a client written from the RFC here: a right
password proves the user and gets the server's own proof back; anything else is
AuthenticationFailed."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from tidelog.errors import AuthenticationFailed
from tidelog.scram import MECHANISMS, ScramExchange, credentials


def client_final(
    hash_name: str, password: str, server_first: str, bare: str, gs2: str
) -> tuple[bytes, bytes]:
    fields = dict(part.split("=", 1) for part in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(
        hash_name, password.encode(), base64.b64decode(fields["s"]), int(fields["i"])
    )
    client_key = hmac.new(salted, b"Client Key", hash_name).digest()
    stored_key = hashlib.new(hash_name, client_key).digest()
    without_proof = f"c={base64.b64encode(gs2.encode()).decode()},r={fields['r']}"
    auth_message = f"{bare},{server_first},{without_proof}".encode()
    signature = hmac.new(stored_key, auth_message, hash_name).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    server_key = hmac.new(salted, b"Server Key", hash_name).digest()
    verifier = hmac.new(server_key, auth_message, hash_name).digest()
    final = f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
    return final, b"v=" + base64.b64encode(verifier)


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
@pytest.mark.parametrize("gs2", ["n,,", "n,a=alice,"])
def test_scram_proves_the_user_and_the_server(mechanism: str, gs2: str) -> None:
    stored = credentials("pencil")

    def stored_of(user: str) -> dict[str, object] | None:
        return stored[mechanism] if user == "alice" else None

    for password, user, proved in (
        ("pencil", "alice", True),
        ("pencil!", "alice", False),
        ("pencil", "mallory", False),
    ):
        bare = f"n={user},r=fyko+d2lbbFgONRv9qkxdawL"
        exchange = ScramExchange(mechanism)
        if user != "alice" and gs2 != "n,,":
            continue  # an authorization id names the user itself
        server_first = exchange.first(f"{gs2}{bare}".encode(), stored_of).decode()
        assert server_first.startswith("r=fyko+d2lbbFgONRv9qkxdawL")  # the client's nonce first
        final, verifier = client_final(MECHANISMS[mechanism], password, server_first, bare, gs2)
        if proved:
            assert exchange.final(final) == ("alice", verifier)
        else:
            with pytest.raises(AuthenticationFailed):
                exchange.final(final)


def test_malformed_scram_messages_are_refused_by_name() -> None:
    stored = credentials("pencil")["SCRAM-SHA-256"]
    for first in (b"", b"p=tls-unique,,n=alice,r=x", b"n,,n=alice", b"n,,r=x", b"\xff\xfe"):
        with pytest.raises(AuthenticationFailed):
            ScramExchange("SCRAM-SHA-256").first(first, lambda user: stored)
    exchange = ScramExchange("SCRAM-SHA-256")
    exchange.first(b"n,,n=alice,r=abc", lambda user: stored)
    for final in (b"c=biws,r=other,p=AAAA", b"c=biws", b"garbage", b"c=eSws,r=abc,p=AAAA"):
        with pytest.raises(AuthenticationFailed):
            exchange.final(final)


@pytest.mark.process
def test_an_unknown_user_gets_the_same_salt_from_every_node_of_a_cluster() -> None:
    """A random decoy key per node gave an unknown user a different salt on each: two nodes
    told which users exist. The key comes from the cluster secret, which every node holds."""
    import subprocess
    import sys

    script = (
        "from tidelog.scram import ScramExchange, seed_decoys\n"
        "seed_decoys(b'the cluster secret, 16+ bytes')\n"
        "print(ScramExchange('SCRAM-SHA-256').first(b'n,,n=nobody,r=abc', lambda u: None))\n"
    )
    salts = set()
    for _ in range(2):  # two processes: two nodes
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        salts.add(out.stdout.split(",s=")[1].split(",")[0])
    assert len(salts) == 1
