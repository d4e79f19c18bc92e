"""Resource accounting of a decode, checked against :class:`gcodec.Limits` before anything is allocated.

Besides its outputs (``max_output_bytes``), decoding one tensor allocates temporaries whose size
comes from the header: k-sized index and value arrays of the sparse codecs, PowerSGD's factor copies,
and a float32 staging buffer when the output is 16-bit. Their bound,
:meth:`Codec.decode_scratch_bytes` plus the staging buffer, is checked against
``max_scratch_bytes``, and the work :meth:`Codec.decode_work` against ``max_decode_work`` (all
tensors of a payload together). The same checks run on encode, so a sender cannot produce a payload
its peers with the same limits refuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .arrays import DTYPES
from .codecs.registry import codec_class
from .format.container import PendingTensor, TensorEntry
from .limits import Limits

__all__ = ["check_pending_resources", "check_resources", "scratch_bytes", "staging_bytes"]


def staging_bytes(numel: int, out_dtype: Any) -> int:
    """The float32 staging buffer of a 16-bit output (none for float32/float64 outputs)."""
    return 4 * numel if np.dtype(out_dtype).itemsize == 2 else 0


def scratch_bytes(cls: Any, params: dict[str, Any], entry: TensorEntry) -> int:
    """Temporaries of decoding ``entry`` into an array of its own dtype."""
    return cls.decode_scratch_bytes(params, entry) + staging_bytes(entry.numel, DTYPES[entry.dtype])


def check_resources(cls: Any, params: dict[str, Any], entry: TensorEntry, lim: Limits, where: str) -> None:
    lim.check("decode scratch bytes", scratch_bytes(cls, params, entry), "max_scratch_bytes", where)


def check_pending_resources(pending: Sequence[PendingTensor], lim: Limits) -> None:
    """On encode: what a receiver with the same limits will check (scratch per tensor, total work)."""
    work = 0
    for i, t in enumerate(pending):
        cls = codec_class(t.codec)
        e = TensorEntry(t.codec, t.version, t.dtype, tuple(t.shape), dict(t.params), (), t.name)
        where = f"tensors[{i}]"
        check_resources(cls, e.params, e, lim, where)
        work += cls.decode_work(e.params, e)
        lim.check("decode work (multiply-adds)", work, "max_decode_work", where)
