"""How many threads gcodec's kernels use: the public face of the CPU backend's pool.

``gcodec.set_num_threads(n)`` sets it for the process, ``with gcodec.num_threads(n):`` for a block on
the calling thread, and ``gcodec.get_num_threads()`` reads it; the default is ``NUMBA_NUM_THREADS``
(the machine's cores unless the variable is set). Ranks that share a machine should share its cores;
the transports set this from the job. gcodec never starts Numba's own threading layer, so it stays
safe after ``fork`` and under concurrent Python threads (docs/architecture.md).
"""

from __future__ import annotations

from .kernels.cpu.threads import get_num_threads, num_threads, set_num_threads

__all__ = ["get_num_threads", "num_threads", "set_num_threads"]
