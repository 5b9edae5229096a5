"""Tests for pipeline.wikidata.bz2blocks: blocks found at any bit offset, decoded alone."""

from __future__ import annotations

import bz2
import io
import random

import pytest

from pipeline.wikidata import bz2blocks


def multi_block_bytes(seed: int = 0, lines: int = 12000) -> bytes:
    """About 0.5 MB of varied text: six blocks at compresslevel 1 (100 kB blocks)."""
    rng = random.Random(seed)
    return b"".join(
        b'{"id":"Q%d","claims":{"P%d":[%d]}}\n' % (i, rng.randrange(999), rng.randrange(10**9))
        for i in range(lines)
    )


@pytest.fixture(scope="module")
def multistream() -> tuple[bytes, bytes]:
    """Two bzip2 streams of several blocks each (as pbzip2 writes), and their text."""
    text = multi_block_bytes()
    half = len(text) // 2
    return bz2.compress(text[:half], 1) + bz2.compress(text[half:], 1), text


def test_blocks_from_the_start_are_the_whole_text(multistream):
    data, text = multistream
    blocks = list(bz2blocks.iter_blocks(io.BytesIO(data), 0))
    assert len(blocks) >= 5
    assert b"".join(piece for _, piece in blocks) == text
    # bzip2 packs blocks bit by bit: most do not start on a byte boundary.
    assert {bit % 8 for bit, _ in blocks} != {0}
    assert blocks[0][0] == 32  # right after the "BZh1" header


def test_a_reader_from_any_offset_sees_exactly_the_blocks_that_start_there(multistream):
    data, _ = multistream
    everything = list(bz2blocks.iter_blocks(io.BytesIO(data), 0))
    for offset in [1, 4, 5000, *range(0, len(data), len(data) // 7), len(data) - 1]:
        later = list(bz2blocks.iter_blocks(io.BytesIO(data), offset))
        assert later == [block for block in everything if block[0] >= 8 * offset]


def test_find_magics_at_all_bit_alignments():
    for shift in range(8):
        for prefix in (b"", b"\xff" * 3):
            value = bz2blocks.END_MAGIC << (64 - 48 - shift)
            buf = prefix + value.to_bytes(8, "big") + b"\x00" * 8
            found = bz2blocks.find_magics(buf, 0, len(buf))
            assert found == [(8 * len(prefix) + shift, bz2blocks.END_MAGIC)]


def test_truncated_and_corrupt_blocks_raise(multistream):
    data, text = multistream
    with pytest.raises(bz2blocks.DamagedBlock, match="file ends inside the block"):
        list(bz2blocks.iter_blocks(io.BytesIO(data[: len(data) // 2]), 0))
    corrupt = bytearray(data)
    corrupt[len(data) // 3] ^= 0x55
    kept = []
    with pytest.raises(bz2blocks.DamagedBlock) as info:
        for _bit, piece in bz2blocks.iter_blocks(io.BytesIO(bytes(corrupt)), 0):
            kept.append(piece)
    assert info.value.bit is not None and info.value.bit < 8 * (len(data) // 3)
    # Whole blocks before the damage come back intact, as the standard library's reader's.
    assert text.startswith(b"".join(kept)) and kept
