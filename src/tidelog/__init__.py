"""tidelog: a replicated, segmented commit log with a high-water mark and a low-water mark."""

from __future__ import annotations

from typing import Any

from tidelog.errors import TidelogError
from tidelog.version import __version__

__all__ = ["AsyncClient", "Client", "TidelogError", "__version__"]


def __getattr__(name: str) -> Any:
    # Imported lazily so `import tidelog.storage` does not pull in asyncio clients.
    if name == "AsyncClient":
        from tidelog.client.async_client import AsyncClient

        return AsyncClient
    if name == "Client":
        from tidelog.client.sync_client import Client

        return Client
    raise AttributeError(name)
