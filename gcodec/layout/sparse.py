"""Layout of the sparse codecs' index sections (``topk``, ``threshold``; specs/codecs/topk.md).

Sorted indices are delta-coded: gaps are bit-packed per block of :data:`GAP_BLOCK` gaps at the
width of the block's largest gap (one width byte per block), up to :data:`MAX_WIDTH` bits. The
``ERR_*`` numbers are what every backend's index decoder returns for each broken rule, so that a
codec turns any backend's answer into the same error.
"""

from __future__ import annotations

__all__ = [
    "ERR_BYTES",
    "ERR_NOT_MINIMAL",
    "ERR_ORDER",
    "ERR_PAD",
    "ERR_RANGE",
    "ERR_WIDTH",
    "GAP_BLOCK",
    "MAX_WIDTH",
    "OK",
]

GAP_BLOCK = 64  # gaps per index block (one width byte each)
MAX_WIDTH = 56  # widest gap field a reader accepts (gaps < 2**56)

# what the index decoders return
OK = 0
ERR_WIDTH = 1  # a block width exceeds the limit
ERR_NOT_MINIMAL = 2  # a block width is not the bit length of its largest gap
ERR_RANGE = 3  # an index >= numel
ERR_ORDER = 4  # raw indices not strictly increasing
ERR_PAD = 5  # unused bits of the last index byte are not zero
ERR_BYTES = 6  # index_bytes disagrees with the widths
