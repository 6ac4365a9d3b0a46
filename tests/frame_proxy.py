"""A proxy in front of a node that sees whole frames of tidelog's protocol both ways, so a test
can stand in for a network or a node that misbehaves: drop an answer (and the connection, as a
broken network would), or answer a request itself (as a node that lags would)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from tidelog.cli.cluster import free_ports
from tidelog.node.config import NodeConfig
from tidelog.node.server import Node
from tidelog.protocol.framing import Frame, FrameDecoder, encode_frame

Reply = Callable[[Frame], None]


class FrameProxy:
    """Subclasses decide per frame: from_client may answer a request itself (reply) instead of
    passing it on; from_node may refuse an answer, which cuts the client's connection."""

    def __init__(self, upstream: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.upstream = upstream  # may be set after start(), before the first connection
        self._server: asyncio.Server | None = None

    async def start(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return "127.0.0.1", int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    def from_client(self, frame: Frame, reply: Reply) -> bool:
        """True: pass the request on to the node."""
        return True

    def from_node(self, frame: Frame) -> bool:
        """True: pass the answer on to the client; False: close both connections."""
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)

        def reply(frame: Frame) -> None:
            writer.write(encode_frame(frame))

        async def client_to_node() -> None:
            decoder = FrameDecoder(1 << 30)
            while data := await reader.read(65536):
                decoder.receive_data(data)
                while (frame := decoder.next_frame()) is not None:
                    if self.from_client(frame, reply):
                        up_writer.write(encode_frame(frame))
            up_writer.close()

        async def node_to_client() -> None:
            decoder = FrameDecoder(1 << 30)
            while data := await up_reader.read(65536):
                decoder.receive_data(data)
                while (frame := decoder.next_frame()) is not None:
                    if not self.from_node(frame):
                        writer.close()
                        up_writer.close()
                        return
                    writer.write(encode_frame(frame))
            writer.close()

        await asyncio.gather(client_to_node(), node_to_client(), return_exceptions=True)


@contextlib.asynccontextmanager
async def node_behind(proxy: FrameProxy, data_dir: Path) -> AsyncIterator[tuple[Node, str]]:
    """A one-node cluster that advertises the proxy as its address, so that its clients go
    through the proxy; the node, and that address as host:port."""
    advertised = await proxy.start()
    port = free_ports(1)[0]
    config = NodeConfig(
        data_dir=data_dir, listen=("127.0.0.1", port), peers={1: advertised}, node_id=1
    )
    node = Node(config)
    await node.start()
    proxy.upstream = node.address
    try:
        yield node, "{}:{}".format(*advertised)
    finally:
        await proxy.stop()
        await node.stop()
