"""The record section's codecs, as Kafka producers write them: gzip, snappy, lz4, zstd.

Batches are stored as the producer sent them; tidelog decompresses only where it must read
records (validation, compaction, table topics, readers) and always within a bound, so that a
small batch cannot make a node allocate gigabytes (a compression bomb is RecordTooLarge).

    gzip    zlib's gzip framing, inflated incrementally up to the bound
    snappy  Kafka's Java client frames it as snappy-java does (xerial: a 16-byte header, then
            [4-byte length][raw block] chunks); librdkafka may send one raw block. Both are
            read; a raw block states its length up front, checked before it is inflated.
    lz4     the LZ4 frame format (Kafka's since message format 1)
    zstd    a zstd frame

snappy, lz4 and zstd come from `cramjam` (maintained bindings to the reference libraries). Their
one-shot decompressors write into a buffer we size: we start near the compressed size times a
typical ratio and grow it (never past the bound) only when it is too small.
"""

from __future__ import annotations

import struct
import zlib

import cramjam

from tidelog.errors import CorruptRecord, RecordTooLarge, UnsupportedCompression

NONE = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4
CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = struct.Struct(">8sii")  # magic, version, compatible version
XERIAL_CHUNK = struct.Struct(">i")
XERIAL_BLOCK_BYTES = 32 * 1024  # snappy-java's default block size
_FIRST_GUESS_RATIO = 8
_GUESS_MIN_BYTES = 64 * 1024


class TooLarge(RecordTooLarge):
    """Inflating went past the bound (the caller names the batch and the bound)."""


def compress(codec: int, data: bytes) -> bytes:
    if codec == NONE:
        return data
    if codec == GZIP:
        compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # no mtime
        return compressor.compress(data) + compressor.flush()
    if codec == SNAPPY:
        chunks = [XERIAL_HEADER.pack(XERIAL_MAGIC, 1, 1)]
        for at in range(0, len(data), XERIAL_BLOCK_BYTES):
            block = bytes(cramjam.snappy.compress_raw(data[at : at + XERIAL_BLOCK_BYTES]))
            chunks += (XERIAL_CHUNK.pack(len(block)), block)
        return b"".join(chunks)
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise UnsupportedCompression(f"compression codec {codec} does not exist", codec=codec)


def decompress(codec: int, raw: bytes | bytearray | memoryview, limit: int) -> bytes:
    """The decompressed bytes, never more than limit of them (TooLarge past it); CorruptRecord
    (rule "compression") for data that is not what its codec writes."""
    if codec == NONE:
        return bytes(raw)
    if codec == GZIP:
        return _gunzip(raw, limit)
    if codec == SNAPPY:
        return _unsnappy(bytes(raw), limit)
    if codec in (LZ4, ZSTD):
        return _one_shot(codec, bytes(raw), limit)
    raise UnsupportedCompression(f"compression codec {codec} does not exist", codec=codec)


def _corrupt(codec: int, why: str) -> CorruptRecord:
    return CorruptRecord(f"{CODEC_NAMES[codec]} data {why}", rule="compression")


def _too_large(limit: int) -> TooLarge:
    return TooLarge(f"inflates past {limit} bytes", rule="inflated_size")


def _gunzip(raw: bytes | bytearray | memoryview, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise _corrupt(GZIP, f"is corrupt: {exc}") from None
    if len(data) > limit or inflater.unconsumed_tail:
        raise _too_large(limit)
    if not inflater.eof:
        raise _corrupt(GZIP, "is cut short")
    if inflater.unused_data:
        raise _corrupt(GZIP, "is followed by other bytes")
    return data


def _unsnappy(raw: bytes, limit: int) -> bytes:
    if not raw.startswith(XERIAL_MAGIC):
        return _snappy_block(raw, limit)
    if len(raw) < XERIAL_HEADER.size:
        raise _corrupt(SNAPPY, "is cut short in its header")
    out: list[bytes] = []
    size = 0
    at = XERIAL_HEADER.size
    while at < len(raw):
        if at + XERIAL_CHUNK.size > len(raw):
            raise _corrupt(SNAPPY, "is cut short in a chunk length")
        (n,) = XERIAL_CHUNK.unpack_from(raw, at)
        at += XERIAL_CHUNK.size
        if n < 0 or at + n > len(raw):
            raise _corrupt(SNAPPY, "has a chunk longer than what follows it")
        block = _snappy_block(raw[at : at + n], limit - size)
        out.append(block)
        size += len(block)
        at += n
    return b"".join(out)


def _snappy_block(raw: bytes, limit: int) -> bytes:
    try:
        length = int(cramjam.snappy.decompress_raw_len(raw))
    except cramjam.DecompressionError as exc:
        raise _corrupt(SNAPPY, f"is corrupt: {exc}") from None
    if length > limit:
        raise _too_large(limit)
    out = bytearray(length)
    try:
        n = int(cramjam.snappy.decompress_raw_into(raw, out))
    except cramjam.DecompressionError as exc:
        raise _corrupt(SNAPPY, f"is corrupt: {exc}") from None
    if n != length:
        raise _corrupt(SNAPPY, f"inflates to {n} bytes, not the {length} it states")
    return bytes(out)


def _one_shot(codec: int, raw: bytes, limit: int) -> bytes:
    module = cramjam.lz4 if codec == LZ4 else cramjam.zstd
    size = min(limit + 1, max(_GUESS_MIN_BYTES, len(raw) * _FIRST_GUESS_RATIO))
    while True:
        out = bytearray(size)
        try:
            n = int(module.decompress_into(raw, out))
        except cramjam.DecompressionError as exc:
            if "whole buffer" not in str(exc):
                raise _corrupt(codec, f"is corrupt: {exc}") from None
            if size > limit:
                raise _too_large(limit) from None
            size = min(limit + 1, size * _FIRST_GUESS_RATIO)
            continue
        if n > limit:
            raise _too_large(limit)
        return bytes(memoryview(out)[:n])
