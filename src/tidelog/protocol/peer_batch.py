"""PEER_BATCH: the one-way messages a node has for one peer in one turn of its loop, in one frame
(as a Kafka follower fetches every partition of a leader in one request).

    header   {"messages": [[api, header, size], ...]}
    payload  each message's payload, in order, back to back (`size` bytes each)

A batch never holds a batch. A message whose payload is large enough for sendfile travels in a
frame of its own instead (node/listeners/peer.py), so a batch's payload is always in memory.
"""

from __future__ import annotations

from typing import Any

from tidelog.errors import InvalidRequest
from tidelog.protocol.api import ApiKey

# One peer message: (api key, header, payload).
PeerMessage = tuple[int, dict[str, Any], bytes]


def encode_peer_batch(messages: list[PeerMessage]) -> tuple[dict[str, Any], bytes]:
    """The PEER_BATCH frame's header and payload."""
    index = [[key, header, len(data)] for key, header, data in messages]
    return {"messages": index}, b"".join(data for _, _, data in messages)


def decode_peer_batch(header: dict[str, Any], payload: bytes) -> list[PeerMessage]:
    """The messages of a PEER_BATCH frame, each with its slice of the payload. A malformed
    index is the peer's fault: InvalidRequest."""
    index = header.get("messages")
    if not isinstance(index, list):
        raise InvalidRequest("a peer batch needs a list of messages")
    out = []
    position = 0
    view = memoryview(payload)
    for entry in index:
        if not (
            isinstance(entry, list)
            and len(entry) == 3
            and isinstance(entry[0], int)
            and entry[0] != ApiKey.PEER_BATCH
            and isinstance(entry[1], dict)
            and isinstance(entry[2], int)
            and 0 <= entry[2] <= len(payload) - position
        ):
            raise InvalidRequest(
                "a peer batch entry must be [api, header, size] within the payload"
            )
        key, inner, size = entry
        out.append((key, inner, bytes(view[position : position + size])))
        position += size
    if position != len(payload):
        raise InvalidRequest("a peer batch's payload is longer than its messages")
    return out
