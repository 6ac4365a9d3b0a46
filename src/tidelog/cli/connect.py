"""How CLI commands reach a cluster: the bootstrap address, TLS files and a token."""

from __future__ import annotations

import argparse
import os
from typing import Any

from tidelog.client.async_client import AsyncClient
from tidelog.tls import TlsFiles


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    add_tls_options(parser)
    parser.add_argument(
        "--token",
        default=os.environ.get("TIDELOG_TOKEN"),
        help="NAME:SECRET of a principal (`tidelog principals add`), proved on every "
        "connection (env TIDELOG_TOKEN)",
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


def client_of(args: argparse.Namespace, **options: Any) -> AsyncClient:
    return AsyncClient(
        args.bootstrap, tls=tls_of(args), token=getattr(args, "token", None), **options
    )
