"""How CLI commands reach a cluster: the bootstrap address, TLS files and a token."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from tidelog.client.async_client import AsyncClient
from tidelog.errors import InvalidConfig, TidelogError
from tidelog.tls import TlsFiles


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    add_tls_options(parser)
    parser.add_argument(
        "--admin-timeout-ms",
        type=int,
        default=int(os.environ.get("TIDELOG_ADMIN_TIMEOUT_MS", "60000")),
        help="how long admin commands retry errors that pass (no leader elected yet, a node "
        "still starting), as Kafka's default.api.timeout.ms (default 60000; env "
        "TIDELOG_ADMIN_TIMEOUT_MS)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("TIDELOG_TOKEN"),
        help="NAME:SECRET of a principal (`tidelog principals add`), proved on every "
        "connection (env TIDELOG_TOKEN; on the command line every user can read it: prefer "
        "--token-file)",
    )
    parser.add_argument(
        "--token-file",
        default=os.environ.get("TIDELOG_TOKEN_FILE"),
        help="a file holding NAME:SECRET (env TIDELOG_TOKEN_FILE)",
    )


def add_tls_options(parser: argparse.ArgumentParser, env: bool = True) -> None:
    def default(name: str) -> str | None:
        return os.environ.get(name) if env else None

    parser.add_argument(
        "--tls-ca",
        default=default("TIDELOG_TLS_CA"),
        help="PEM file of the CA that signs the nodes' certificates: connect with TLS and "
        "verify them" + (" (env TIDELOG_TLS_CA)" if env else ""),
    )
    parser.add_argument(
        "--tls-cert",
        default=default("TIDELOG_TLS_CERT"),
        help="PEM certificate to present" + (" (env TIDELOG_TLS_CERT)" if env else ""),
    )
    parser.add_argument(
        "--tls-key",
        default=default("TIDELOG_TLS_KEY"),
        help="PEM private key of --tls-cert" + (" (env TIDELOG_TLS_KEY)" if env else ""),
    )


def tls_of(args: argparse.Namespace) -> TlsFiles | None:
    return TlsFiles.of(
        getattr(args, "tls_ca", None),
        getattr(args, "tls_cert", None),
        getattr(args, "tls_key", None),
    )


def token_of(args: argparse.Namespace) -> str | None:
    """--token, else the first line of --token-file."""
    token: str | None = getattr(args, "token", None)
    path = getattr(args, "token_file", None)
    if token or not path:
        return token
    try:
        with open(path) as f:
            return f.readline().strip() or None
    except OSError as exc:
        raise InvalidConfig(f"cannot read --token-file {path}: {exc}", key="token_file") from None


def client_of(args: argparse.Namespace, **options: Any) -> AsyncClient:
    timeout_ms = getattr(args, "admin_timeout_ms", None)
    if timeout_ms is not None:
        options.setdefault("admin_timeout_ms", timeout_ms)
    client = AsyncClient(args.bootstrap, tls=tls_of(args), token=token_of(args), **options)
    if sys.stderr.isatty():
        client.on_admin_retry = _AdminProgress(client.admin_timeout_s)
    return client


class _AdminProgress:
    """On a terminal: what an admin command is waiting for, once a second (a new cluster's
    first election, a node still starting), instead of silence or a failure."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.shown = 0.0

    def __call__(self, exc: TidelogError, waited: float) -> None:
        if waited - self.shown < 1.0:
            return
        self.shown = waited
        print(
            f"\rwaiting for the cluster ({exc.name}: {exc.message[:80]}), "
            f"{waited:.0f} of {self.timeout_s:.0f} s ",
            end="",
            file=sys.stderr,
            flush=True,
        )
