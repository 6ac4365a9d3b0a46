"""Reading table topics (`--kind table`): a key's committed value, or every key and value, as
the partitions' leaders hold them. A key lives in the partition its CRC-32 names."""

from __future__ import annotations

import base64
import zlib

from tidelog.client.routing import Router
from tidelog.errors import InvalidRequest
from tidelog.protocol import api
from tidelog.protocol.api import CONSISTENCIES, ApiKey

SCAN_PAGE_ENTRIES = 5000


class TableReader:
    def __init__(self, router: Router) -> None:
        self._router = router

    async def get(self, topic: str, key: bytes, consistency: str) -> bytes | None:
        check_consistency(consistency)
        info = await self._router.topic(topic)
        partition = zlib.crc32(key) % info.partitions
        request = api.TableRequest(
            "get", topic, partition, base64.b64encode(key).decode(), consistency=consistency
        )
        header, _ = await self._router.to_leader(topic, partition, ApiKey.TABLE, request)
        resp = api.decode(api.TableResponse, header)
        return base64.b64decode(resp.entries[0][1]) if resp.found else None

    async def scan(
        self, topic: str, partitions: list[int] | None, consistency: str
    ) -> list[tuple[bytes, bytes]]:
        check_consistency(consistency)
        info = await self._router.topic(topic)
        out: list[tuple[bytes, bytes]] = []
        for partition in range(info.partitions) if partitions is None else partitions:
            after = ""
            while True:
                request = api.TableRequest(
                    "scan",
                    topic,
                    partition,
                    after=after,
                    limit=SCAN_PAGE_ENTRIES,
                    consistency=consistency,
                )
                header, _ = await self._router.to_leader(topic, partition, ApiKey.TABLE, request)
                entries = api.decode(api.TableResponse, header).entries
                out.extend((base64.b64decode(k), base64.b64decode(v)) for k, v in entries)
                if len(entries) < SCAN_PAGE_ENTRIES:
                    break
                after = entries[-1][0]
        return sorted(out)


def check_consistency(consistency: str) -> None:
    if consistency not in CONSISTENCIES:
        raise InvalidRequest(
            f"consistency must be one of {', '.join(CONSISTENCIES)}, not {consistency!r}"
        )
