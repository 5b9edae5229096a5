"""Random access into a bzip2 file: find its blocks from any byte offset and decode each alone.

A bzip2 file is one or more streams (``BZh`` + level digit, blocks, an end-of-stream
marker); each block starts with the 48-bit magic ``0x314159265359`` and the stream end with
``0x177245385090``. Blocks are packed bit by bit, so a block starts at any bit offset: the
scan below looks for both magics at all eight bit alignments, and a block is re-wrapped into
a standalone one-block stream (header, the block's bits, end marker, CRC) that the standard
library decodes. A block's own CRC is checked by the decoder, so a corrupt block raises.

This works for single-stream files (``bzip2``, ``lbzip2``) and for multistream ones
(``pbzip2``, Wikimedia's page dumps) alike, with no index and no pass over the whole file:
a reader that starts at byte offset ``o`` sees exactly the blocks whose first bit is at or
after ``8 * o``. A magic can also occur by chance inside compressed data (once in 2**48 bit
positions); candidates must also have a plausible block header (randomised bit 0, origin
pointer below 900,000), which leaves about one false match per 10**16 bytes of input. A
false match shows up as a damaged block, never as wrong triples.
"""

from __future__ import annotations

import bz2
from collections.abc import Iterator
from typing import BinaryIO

BLOCK_MAGIC = 0x314159265359
END_MAGIC = 0x177245385090
#: Compressed bytes read at a time while scanning.
SCAN_CHUNK = 1 << 20
#: A header that makes one re-wrapped block a complete stream; level 9 allows any block size.
_HEADER = int.from_bytes(b"BZh9", "big")
#: Bits of a block header checked for plausibility: magic, CRC, randomised bit, origin pointer.
_HEADER_BITS = 48 + 32 + 1 + 24
_MAX_ORIGIN = 900_000


class DamagedBlock(Exception):
    """A compressed block could not be decoded (truncated file, corrupt bytes).

    Attributes:
        bit: File offset in bits of the damaged block's start, when known.
    """

    def __init__(self, message: str, bit: int | None = None):
        super().__init__(message)
        self.bit = bit


def _patterns(magic: int) -> list[tuple[bytes, int, int, int, int, int]]:
    """For each bit alignment ``s``: the five whole bytes the magic fixes, and the masks and
    values of the partial first and last bytes of its 7-byte window."""
    patterns = []
    for shift in range(8):
        window = (magic << (8 - shift)).to_bytes(7, "big")
        first_mask, last_mask = 0xFF >> shift, (0xFF << (8 - shift)) & 0xFF
        patterns.append(
            (window[1:6], shift, first_mask, window[0] & first_mask, last_mask, window[6])
        )
    return patterns


_PATTERNS = [(pattern, BLOCK_MAGIC) for pattern in _patterns(BLOCK_MAGIC)] + [
    (pattern, END_MAGIC) for pattern in _patterns(END_MAGIC)
]


def find_magics(buf: bytes, first: int, stop: int) -> list[tuple[int, int]]:
    """``(bit offset in buf, magic)`` of every magic whose 7-byte window starts in
    ``[first, stop)`` and fits in ``buf``, ascending; block magics need a plausible header."""
    stop = min(stop, len(buf) - 6)
    found = []
    for (core, shift, first_mask, first_value, last_mask, last_value), magic in _PATTERNS:
        at = buf.find(core, first + 1, stop + 1 + 5)
        while 0 <= at and at - 1 < stop:
            start = at - 1
            if (
                start >= first
                and buf[start] & first_mask == first_value
                and buf[start + 6] & last_mask == last_value & last_mask
            ):
                bit = 8 * start + shift
                if magic == END_MAGIC or _plausible_header(buf, bit):
                    found.append((bit, magic))
            at = buf.find(core, at + 1, stop + 1 + 5)
    found.sort()
    return found


def _plausible_header(buf: bytes, bit: int) -> bool:
    """Randomised bit 0 and origin pointer < 900,000; True when the header runs past buf
    (the decoder then decides)."""
    end = (bit + _HEADER_BITS + 7) // 8
    if end > len(buf):
        return True
    value = int.from_bytes(buf[bit // 8 : end], "big") >> (8 * end - bit - _HEADER_BITS)
    randomised = (value >> 24) & 1
    origin = value & 0xFFFFFF
    return not randomised and origin < _MAX_ORIGIN


def decode_block(buf: bytes, start: int, stop: int) -> bytes:
    """Decode the block at bits ``[start, stop)`` of ``buf`` as a standalone stream.

    Raises:
        DamagedBlock: The bits are not one whole, intact block.
    """
    bits = stop - start
    if bits < _HEADER_BITS:
        raise DamagedBlock(f"block of {bits} bits is shorter than a block header")
    first, last = start // 8, (stop + 7) // 8
    value = int.from_bytes(buf[first:last], "big")
    value = (value >> (8 * last - stop)) & ((1 << bits) - 1)
    crc = (value >> (bits - 80)) & 0xFFFFFFFF
    # A one-block stream's combined CRC is the block's CRC.
    total = 32 + bits + 48 + 32
    pad = -total % 8
    stream = ((((_HEADER << bits) | value) << 48 | END_MAGIC) << 32 | crc) << pad
    try:
        return bz2.decompress(stream.to_bytes((total + pad) // 8, "big"))
    except (OSError, ValueError, EOFError) as exc:
        raise DamagedBlock(f"{type(exc).__name__}: {exc}") from exc


def iter_blocks(fh: BinaryIO, start_byte: int) -> Iterator[tuple[int, bytes]]:
    """``(first bit, decompressed bytes)`` of each block whose first bit is ``>= 8 *
    start_byte``, in file order, to the end of the file or the caller's ``break``.

    Only the bytes from ``start_byte`` to the end of the last block yielded are read.

    Raises:
        DamagedBlock: A block does not decode, or the file ends inside one (truncation).
    """
    fh.seek(start_byte)
    base = start_byte  # file offset of buf[0]
    buf = b""
    scanned = 0  # window starts below this (relative to buf) are scanned
    current: int | None = None  # absolute first bit of the block being read
    eof = False
    while not eof:
        data = fh.read(SCAN_CHUNK)
        eof = not data
        buf += data
        # At the end a window may be shorter than 7 bytes; pad so it is still scanned.
        limit = len(buf) if eof else len(buf) - 6
        padded = buf + b"\0" * 7 if eof else buf
        found = [(8 * base + bit, magic) for bit, magic in find_magics(padded, scanned, limit)]
        for absolute, magic in found:
            if current is not None:
                try:
                    data = decode_block(buf, current - 8 * base, absolute - 8 * base)
                except DamagedBlock as exc:
                    raise DamagedBlock(f"block at byte {current // 8}: {exc}", current) from exc
                yield current, data
            current = absolute if magic == BLOCK_MAGIC else None
        # Keep only what the block being read and the unscanned windows still need.
        limit = max(limit, 0)
        keep = min(current // 8 - base, limit) if current is not None else limit
        buf, base, scanned = buf[keep:], base + keep, limit - keep
    if current is not None:
        raise DamagedBlock(
            f"file ends inside the block at byte {current // 8} (truncated download?)",
            current,
        )
