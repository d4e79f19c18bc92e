"""Does compression pay on this job? The alpha-β cost model, this machine's measured codec speeds, and
the bandwidth above which each codec stops paying (``gcodec advise``; docs/advise.md). With error
feedback, each encode also decodes its payload (the residual), which ``error_feedback=True`` adds.

With p ranks, n bytes of float32 gradient per rank, a payload of S bytes, latency alpha and
bandwidth beta (bytes/s), one step's communication (Thakur, Rabenseifner and Gropp, 2005) is:

* dense ring allreduce: ``2(p-1) alpha + 2(p-1)/p * n / beta``;
* summable (fp16, bf16, Random-K): ``2(p-1) alpha + 2(p-1)/p * S / beta`` (an all-to-all and an
  all-gather of the values; at p = 2 one all-gather, ``alpha + S / beta``);
* gather: ``(p-1) (alpha + S / beta)``;
* two-phase: ``2(p-1) alpha + 2(p-1)/p * S / beta``;
* PowerSGD (two rounds, S = 4 (m+n) r): ``4(p-1) alpha + 2(p-1)/p * S / beta``;

and the compute each codec adds: summable and PowerSGD ``T_enc + T_dec``; gather ``T_enc + p T_dec``
(every payload is decoded); two-phase ``(1 + 1/p) T_enc + 2 T_dec`` (the owner re-encodes its 1/p
chunk and every rank decodes the gathered chunks once more). A codec saves
``t_dense - (t_comm + t_compute)`` per step, which falls as beta grows; the break-even bandwidth is
where it reaches zero: ``beta* = (V_dense - V_codec) / (t_compute + L_codec - L_dense)`` with V the
bytes and L the latency terms. Below beta* the codec pays; above it, it costs. None when it always
pays (no compute, less latency) or never does (no fewer bytes).

Encode and decode times are measured on this machine with a linear model ``t(n) = t0 + c·n`` fitted
on two sizes, so that a model's many tensors are priced without encoding each of them. The compute
a step really costs is more than the codec's: the transports scale, sum, keep residuals, decode
every peer's payload and copy buffers. :func:`measure_transport` times their real protocol on a
:class:`MirrorComm` (p ranks that all send the same, no network), fitted the same way, and
:func:`advise` prices compute with that line by default (``compute_source`` says which was used).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .api import decode, encode
from .codecs import Codec, get_codec
from .codecs.state import CodecState
from .errors import ConfigError
from .transports.comm import Communicator, DoneWork, Work
from .transports.state import resolve_mode
from .transports.threads import kernel_threads

__all__ = [
    "DEFAULT_CANDIDATES",
    "CacheEvictor",
    "CodecSpeed",
    "Link",
    "LinkFit",
    "MirrorComm",
    "TransportSpeed",
    "advise",
    "break_even_bps",
    "cache_bytes",
    "comm_seconds",
    "compute_seconds",
    "fit_link",
    "job_tensors",
    "measure_protocol_speed",
    "measure_speed",
    "measure_steps",
    "measure_transport",
    "parse_bandwidth",
    "predict",
    "probe_link",
    "probe_links",
    "transport_sizes",
]

#: What ``gcodec advise`` compares by default (None is the uncompressed fp32 ring allreduce).
DEFAULT_CANDIDATES: tuple[dict[str, Any] | None, ...] = (
    None,
    {"id": "fp16"},
    {"id": "bf16"},
    {"id": "uniform", "bits": 8},
    {"id": "uniform", "bits": 4},
    {"id": "qsgd", "levels": 15},
    {"id": "topk", "ratio": 0.01},
    {"id": "powersgd", "rank": 4},
)

_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_bandwidth(text: str | float) -> float:
    """Bits per second from ``"1Gbit"``, ``"100 Mbit/s"``, ``"10gbps"``, ``"125MB/s"`` (bytes) or a number."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text <= 0:
            raise ConfigError(f"bandwidth must be positive, not {text}")
        return float(text)
    m = re.fullmatch(r"\s*([0-9.]+(?:e[+-]?\d+)?)\s*([kmgt]?)(bit|bps|b)?(?:/s|ps)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ConfigError(f"cannot read bandwidth {text!r}: use e.g. 1Gbit, 100Mbit/s, 125MB/s or bits/s")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    unit = m.group(3) or "bit"
    if unit == "B":  # bytes
        value *= 8
    if value <= 0:
        raise ConfigError(f"bandwidth must be positive, not {text!r}")
    return value


#: The collectives whose bytes the transports move with the engine's all-gather / all-to-all of
#: payload bytes (summable too: its values are summed by gcodec, not by the engine's allreduce;
#: gcodec.transports.summable): what ``Link.gather`` prices when it is known. The rest are the
#: engine's float32 allreduces.
GATHER_COLLECTIVES = ("summable", "gather", "two_phase")


@dataclass(frozen=True)
class Link:
    """A network link: bandwidth in bits/s, latency alpha in seconds per message. ``gather``, when
    measured (``gcodec advise --probe``), is the link as the engine's all-gather of payload bytes
    sees it, which prices the summable, gather and two-phase collectives; an engine's all-gather need not
    move bytes as fast as its allreduce (gloo's does not)."""

    bandwidth_bps: float
    latency_s: float = 50e-6
    gather: Link | None = None

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_bps / 8

    def for_collective(self, collective: str) -> Link:
        """The link that prices ``collective``."""
        if self.gather is not None and collective in GATHER_COLLECTIVES:
            return self.gather
        return self


@dataclass(frozen=True)
class LinkFit:
    """A link measured by timing dense float32 allreduces of several sizes (:func:`probe_link`).

    ``samples`` are (bytes per rank, seconds): each the median of the timed runs of one size, the
    slowest rank's when the ranks agree on it. ``worst_residual`` is the largest relative gap
    between the fitted line and a sample: how well the alpha-beta model describes this link."""

    link: Link
    workers: int
    samples: tuple[tuple[int, float], ...]
    worst_residual: float
    transport: str = ""
    collective: str = "allreduce"

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": "probe",
            "transport": self.transport,
            "collective": self.collective,
            "bandwidth_bps": self.link.bandwidth_bps,
            "latency_s": self.link.latency_s,
            "workers": self.workers,
            "samples": [{"bytes": b, "seconds": t} for b, t in self.samples],
            "worst_residual": self.worst_residual,
        }


def fit_link(
    samples: Sequence[tuple[int, float]], workers: int, transport: str = "", collective: str = "allreduce"
) -> LinkFit:
    """alpha and beta from dense ring-allreduce times: ``t = 2(p-1) alpha + 2(p-1)/p * bytes / beta``
    (``collective="gather"``: all-gather times, ``t = (p-1) alpha + (p-1) * bytes / beta``).

    The line through the smallest and the largest size: beta from the time the bytes between them
    add, alpha from what is left of the smallest size's time (0 where nothing is: latency below
    what the timer resolves). The largest size is the one a job's large tensors and buckets pay
    for; the smallest carries the latency. A least-squares line through every size (weighted by
    1/t, as this fit was first) follows the small sizes instead, and links are not straight lines
    there: a token bucket lets its burst through at the loopback's speed (the 1 Gbit/s link of
    bench/link.py: 64 KiB in 0.56 ms, 1 MiB in 17.1 ms, a fit of 1.15 Gbit/s where 17 MB buckets
    moved at 0.48), and gloo on the unlimited loopback moves 1 MiB at about a quarter of the rate
    of 16 MiB. One noisy middle size (64 KiB taking 3.9 ms where 1 MiB took 1.8) moves the
    least-squares slope and not this line. ``worst_residual`` says how far the middle sizes lie
    from it.

    A smaller message is never taken to cost more than a larger one: each size counts at the least
    time of that size or any larger. On the 10 Gbit/s link of bench/link.py, 4 KiB allreduces took
    3.7 ms (the median of 5) where 64 KiB ones took 0.35: read as the latency, every message of a
    job would pay 1.8 ms, where the job's PowerSGD step, a dozen small allreduces, ran as fast as
    on the unlimited loopback.

    Raises :class:`ConfigError` when the largest size is not slower than the smallest: the link
    is then too fast, or the machine too noisy, to be measured this way."""
    p = int(workers)
    if p < 2:
        raise ConfigError(f"measuring a link needs at least 2 ranks, not {workers}")
    pts = [(int(b), float(t)) for b, t in samples]
    if len({b for b, _ in pts}) < 2 or any(not (t > 0 and math.isfinite(t)) or b <= 0 for b, t in pts):
        raise ConfigError(f"a link fit needs positive times at 2 or more sizes, not {pts}")
    if collective not in ("allreduce", "gather"):
        raise ConfigError(f"collective must be 'allreduce' or 'gather', not {collective!r}")
    k, messages = (2 * (p - 1) / p, 2 * (p - 1)) if collective == "allreduce" else (p - 1, p - 1)
    x = np.array([k * b for b, _ in pts])
    t = np.array([tt for _, tt in pts])
    lo, hi = int(np.argmin(x)), int(np.argmax(x))
    t_lo = float(t.min())  # the smallest size at the least time of any size (docstring)
    b = (t[hi] - t_lo) / (x[hi] - x[lo])
    if not b > 0:
        raise ConfigError(
            "the probe's allreduce times do not grow with the size "
            f"({', '.join(f'{bb} B: {tt * 1e3:.3g} ms' for bb, tt in pts)}): give --bandwidth instead"
        )
    a = max(0.0, t_lo - float(b * x[lo]))
    worst = float(np.max(np.abs(a + b * x - t) / t))
    link = Link(8.0 / float(b), a / messages)
    return LinkFit(link, p, tuple(pts), worst, transport, collective)


#: Elements of the dense float32 allreduces :func:`probe_link` times: 4 KB to 16 MB per rank.
PROBE_SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 22)


def probe_link(
    allreduce: Any,
    workers: int,
    *,
    barrier: Any = None,
    slowest: Any = None,
    sizes: Sequence[int] = PROBE_SIZES,
    repeats: int = 5,
    transport: str = "",
    array: Any = None,
    clock: Any = time.perf_counter,
    collective: str = "allreduce",
    evict: Any = None,
) -> LinkFit:
    """Measure the link the job runs on: time ``allreduce(a)`` (a dense in-place sum over the job's
    ranks: ``torch.distributed.all_reduce``, ``MPI.Comm.Allreduce``) on float32 arrays of ``sizes``
    elements and fit alpha and beta (:func:`fit_link`). Every rank calls it.

    Each size runs once untimed (connections, buffers), then ``repeats`` times, each after
    ``barrier()`` when given; the median is kept and ``slowest(seconds)`` (the maximum over the
    ranks), when given, makes every rank fit the same samples. ``array(n)`` makes the buffers (a
    device tensor for NCCL, say; NumPy by default). The transports know no link: this takes plain
    callables, so any engine can probe with its own collective. ``collective="gather"``:
    ``allreduce`` is an all-gather of the buffer instead (fitted as one, see :func:`fit_link`), and
    a sample's bytes are the buffer's ``nbytes``. ``evict()`` (a :class:`CacheEvictor`), when
    given, runs before each timed run's barrier at every size but the smallest: on a link fast
    enough that the copies through the engine's buffers and sockets cost as much as the wire, a
    bucket's allreduce finds the caches as the backward pass left them, not as another allreduce
    of the same buffer did, and the larger sizes give the bandwidth a bucket pays; the smallest
    gives the latency, which most of a step's messages pay right after another message (timed
    after an eviction, it read PowerSGD's dozen small allreduces at 2.3 times their cost in the job
    at 0.2 M parameters)."""
    make = array or (lambda n: np.ones(n, np.float32))
    samples = []
    smallest = min(int(n) for n in sizes)
    for n in sizes:
        buf = make(int(n))
        allreduce(buf)
        ts = []
        for _ in range(max(1, int(repeats))):
            if evict is not None and int(n) > smallest:
                evict()
            if barrier is not None:
                barrier()
            t0 = clock()
            allreduce(buf)
            ts.append(clock() - t0)
        med = float(np.median(ts))
        nbytes = int(getattr(buf, "nbytes", 4 * int(n)))
        samples.append((nbytes, float(slowest(med)) if slowest is not None else med))
    return fit_link(samples, workers, transport, collective)


@dataclass(frozen=True)
class CodecSpeed:
    """``t(n) = t0 + per_element · n`` for encode and decode, and the payload size per element."""

    encode_t0: float
    encode_per_element: float
    decode_t0: float
    decode_per_element: float
    payload_t0: float
    payload_per_element: float

    def encode_seconds(self, n: int) -> float:
        return max(0.0, self.encode_t0 + self.encode_per_element * n)

    def decode_seconds(self, n: int) -> float:
        return max(0.0, self.decode_t0 + self.decode_per_element * n)

    def payload_bytes(self, n: int) -> float:
        return max(0.0, self.payload_t0 + self.payload_per_element * n)


_ZERO = CodecSpeed(0.0, 0.0, 0.0, 0.0, 0.0, 4.0)


#: The most an eviction pass reads (:class:`CacheEvictor`): 1 GiB.
EVICT_MAX_BYTES = 1 << 30
#: What :func:`cache_bytes` assumes where the machine does not say.
CACHE_BYTES_DEFAULT = 32 << 20


def cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """The size of the largest CPU cache of this machine (Linux's sysfs, ``index*/size``), or
    :data:`CACHE_BYTES_DEFAULT` where it cannot be read."""
    import glob

    best = 0
    for path in glob.glob(f"{root}/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        m = re.fullmatch(r"(\d+)\s*([KMG]?)B?", text)
        if m:
            best = max(best, int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)])
    return best or CACHE_BYTES_DEFAULT


class CacheEvictor:
    """Reads a buffer of twice the largest cache (:func:`cache_bytes`, at most
    :data:`EVICT_MAX_BYTES`) when called, so that the next timed step finds the caches holding
    other data, as a training step finds them: its forward and backward passes run between two
    exchanges and leave the caches holding the model and its activations.

    Timed with warm caches (the same buffers step after step, nothing between), the transports'
    protocol under-priced a training job's exchange: uniform 8-bit at 4.19 M elements on the 2-core
    VM (a 480 MiB last-level cache) took 13.8 ms a step warm and 20.7 after reading 1 GiB between
    steps, where the job's hook spent 11-13 ms decoding alone (decode 8.6 -> 12.8 ms); reading 64
    MiB between steps changed nothing, 512 MiB nearly all of it. Reading suffices: the lines it
    brings in replace the step's. The buffer is allocated on the first call and dropped with the
    evictor. ``nbytes`` sets its size; where it is not given, the environment variable
    ``GCODEC_EVICT_BYTES`` does (a machine short of memory, a test suite), else twice the cache."""

    def __init__(self, nbytes: int | None = None) -> None:
        if nbytes is None:
            env = os.environ.get("GCODEC_EVICT_BYTES", "").strip()
            try:
                nbytes = int(env) if env else 2 * cache_bytes()
            except ValueError:
                raise ConfigError(f"GCODEC_EVICT_BYTES must be a whole number of bytes, not {env!r}") from None
        if int(nbytes) < 8:
            raise ConfigError(f"an evictor reads at least 8 bytes, not {nbytes}")
        self.nbytes = min(int(nbytes), EVICT_MAX_BYTES)
        self._buf: np.ndarray | None = None

    def __call__(self) -> None:
        if self._buf is None:
            self._buf = np.ones(self.nbytes // 8, np.float64)  # real pages, not the zero page
        self._buf.sum()


def _best(f: Any, repeats: int, before: Any = None) -> float:
    """The least time of ``repeats`` calls of ``f``, each after ``before()`` (untimed) when given."""
    best = math.inf
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


def _time_codec(codec: Codec, x: np.ndarray, repeats: int, evict: Any = None) -> tuple[float, float, int]:
    state = CodecState()
    buf = encode(x, codec, key="advise", state=state)  # warm-up: compile, page in
    out = np.empty_like(x)
    decode(buf, out=out)
    enc = _best(lambda: encode(x, codec, key="advise", state=state), repeats, evict)
    dec = _best(lambda: decode(buf, out=out), repeats, evict)
    return enc, dec, len(memoryview(buf).cast("B"))


def _sample(codec: Codec, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if codec.low_rank:  # a matrix, the shape a low-rank codec compresses
        side = max(2, int(math.sqrt(n)))
        return rng.standard_normal((side, max(2, n // side)), dtype=np.float32)
    return rng.standard_normal(n, dtype=np.float32)


def _line(n0: int, t0: float, n1: int, t1: float) -> tuple[float, float]:
    """(intercept, slope) of the line through two timings; a noisy pair (a busy machine: a falling
    line, or one below zero at n = 0) gives the line through zero and the larger size."""
    slope = (t1 - t0) / (n1 - n0)
    if slope <= 0 or t0 - slope * n0 < 0:
        return 0.0, t1 / n1
    return t0 - slope * n0, slope


def _speed_line(pts: Sequence[tuple[int, float, float, float]]) -> CodecSpeed:
    """The :class:`CodecSpeed` through two timings ``(elements, encode s, decode s, payload bytes)``."""
    (n0, e0, d0, b0), (n1, e1, d1, b1) = pts
    (et, es), (dt, ds) = _line(n0, e0, n1, e1), _line(n0, d0, n1, d1)
    db = (b1 - b0) / (n1 - n0)
    return CodecSpeed(et, es, dt, ds, b0 - db * n0, db)


def measure_speed(
    codec: Codec | str | Mapping[str, Any] | None,
    *,
    sizes: tuple[int, int] = (1 << 14, 1 << 22),
    repeats: int = 3,
    threads: int | None = None,
    evict: Any = None,
) -> CodecSpeed:
    """Fit ``t(n) = t0 + c·n`` for encode and decode on Gaussian float32 data of two sizes (best of
    ``repeats``; each timed call after ``evict()`` when given, a :class:`CacheEvictor`). ``None``
    (dense) costs nothing and sends 4 bytes per element."""
    if codec is None:
        return _ZERO
    c = get_codec(codec)  # type: ignore[arg-type]
    pts = []
    with kernel_threads(threads):
        for n in sizes:
            x = _sample(c, n)
            pts.append((x.size, *_time_codec(c, x, repeats, evict)))
    return _speed_line(pts)


def probe_links(
    allreduce: Any,
    allgather: Any,
    workers: int,
    *,
    array: Any = None,
    byte_array: Any = None,
    **common: Any,
) -> tuple[LinkFit, LinkFit]:
    """The two links a job's collectives run on, with the same barrier, agreement, sizes and
    repeats (``common``, as :func:`probe_link` takes them): the dense allreduce's (``array(n)``
    makes its float32 buffers) and the all-gather's of payload bytes (``allgather(b)`` on a uint8
    buffer of 4n bytes, ``byte_array(nbytes)`` to make it elsewhere than in host memory), which
    prices the summable, gather and two-phase collectives (:attr:`Link.gather`)."""
    fit = probe_link(allreduce, workers, array=array, **common)
    make = byte_array or (lambda nbytes: np.ones(nbytes, np.uint8))
    gather = probe_link(allgather, workers, array=lambda n: make(4 * n), collective="gather", **common)
    return fit, gather


class MirrorComm(Communicator):
    """Rank 0 of ``size`` ranks whose peers all send what it sends (host arrays): the transports' real protocol
        runs every pass it makes on a rank (encode, the residual, decoding ``size`` payloads, scaling,
        buffers, copies) with no network at all. Collectives complete at once; a sum is ``size`` times
        the input. What :func:`measure_transport` times. The two-phase mode's chunks must be of equal
        size: rank 0 is handed its own owner chunk as every owner's, so the work is a real rank's but
        the result is right on chunk 0 only; an all-gather of parts of unequal length (summable chunks)
    hands peer j rank 0's bytes cycled to its length. ``calls`` counts the collectives by kind (control words
        included): the rounds whose latency a step pays."""

    rank = 0

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self.calls: dict[str, int] = {}

    def _count(self, kind: str) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + 1

    def allreduce(self, arr: Any, op: str = "sum") -> Work:
        self._count("allreduce")
        if op == "sum":
            arr *= self.size
        return DoneWork(arr)

    def allgather(self, arr: np.ndarray) -> Work:
        self._count("allgather")
        return DoneWork(np.stack([np.array(arr, copy=True) for _ in range(self.size)]))

    def allgatherv(self, buf: Any, counts: Sequence[int]) -> Work:
        self._count("allgatherv")  # peer j's part has the length it announced: rank 0's bytes, cycled
        return DoneWork([np.resize(np.asarray(buf), int(c)) for c in counts])

    def alltoallv(self, bufs: Sequence[Any], recv_counts: Sequence[int]) -> Work:
        self._count("alltoallv")
        return DoneWork([np.array(bufs[0], copy=True) for _ in range(self.size)])  # each peer's part for rank 0


@dataclass(frozen=True)
class TransportSpeed:
    """``t(n) = t0 + per_element · n``: one rank's compute in the transport's real protocol for one
    tensor of n elements (:func:`measure_transport`). ``rounds``, when known, is the protocol's
    collectives per steady step: (allreduces, all-gathers and all-to-alls), control words
    included, whose latencies the step pays (:func:`comm_seconds`)."""

    t0: float
    per_element: float
    rounds: tuple[int, int] | None = None
    #: a low-rank codec's (shape, seconds) per matrix it was timed on: its cost depends on the
    #: matrix's sides and rank, not on the element count alone
    per_shape: tuple[tuple[tuple[int, ...], float], ...] | None = None
    #: timed as one exchange of all the job's matrices (as the DDP hook sends a bucket's): ``rounds``
    #: are the whole step's, and ``per_shape`` each matrix's share of that step's time
    joined: bool = False

    def seconds(self, n: int) -> float:
        return max(0.0, self.t0 + self.per_element * n)

    def seconds_of(self, shape: Sequence[int]) -> float:
        """One tensor's compute: the time measured for that shape where it was timed, else the line
        at its element count."""
        key = tuple(int(d) for d in shape)
        for s, t in self.per_shape or ():
            if s == key:
                return t
        return self.seconds(int(np.prod(key)) if key else 1)


#: The default sizes :func:`measure_transport` fits its line through; :func:`advise` reaches up to
#: the job's largest tensor instead (:func:`transport_sizes`).
TRANSPORT_SIZES = (1 << 14, 1 << 20)


def transport_sizes(numels: Iterable[int]) -> tuple[int, int]:
    """The two sizes to time the transports' protocol at for tensors of ``numels`` elements: 16 Ki
    and the largest tensor (at least 64 Ki, at most 16 Mi elements). A line through 16 Ki and 1 Mi
    extrapolated to 4 Mi under-predicted top-k and uniform by 1.5 to 2 times on this machine: past
    the caches the cost per element grows, so the line must reach the sizes the job sends."""
    top = max((int(n) for n in numels), default=TRANSPORT_SIZES[1])
    return TRANSPORT_SIZES[0], min(max(top, 1 << 16), 1 << 24)


def measure_transport(
    codec: Codec | str | Mapping[str, Any],
    workers: int,
    *,
    mode: str = "auto",
    error_feedback: bool = False,
    sizes: tuple[int, int] = TRANSPORT_SIZES,
    repeats: int = 3,
    threads: int | None = None,
    shapes: Sequence[Sequence[int]] | None = None,
    evict: Any = None,
    joined: bool = False,
) -> TransportSpeed:
    """Time the transports' own protocol (``gcodec.mpi.allreduce``'s and ``gcodec.torch``'s, the
    hook's per group) for ``codec`` on ``workers`` ranks over a :class:`MirrorComm`, at two sizes,
    best of ``repeats`` after an untimed step (the handshake, first buffers): the compute a rank
    spends per step, which the codec's own encode and decode times leave out (the summable mode's
    scaling and float32 sum buffer, the residual's passes, gather's p decodes, copies). A line
    ``t0 + c·n`` through the two sizes, as :func:`measure_speed`, and the collectives of one
    steady step (``rounds``).

    A low-rank codec (PowerSGD), whose cost depends on each matrix's sides and its rank, is timed
    on each of ``shapes`` (the job's matrices, 2-D or more) instead: ``per_shape`` holds them, and
    the line is their total time over their total elements. ``joined``: all of ``shapes`` timed
    together as one exchange, as the DDP hook sends a bucket's matrices (one agreement, one
    allreduce of every P, one of every Q); ``per_shape`` then splits that step's time between
    the matrices by their element counts, and ``rounds`` are the whole step's.

    ``evict`` (a :class:`CacheEvictor`), when given, runs before each timed step: the caches as a
    training step leaves them to its exchange, not as the previous timed step left them."""
    c = get_codec(codec)  # type: ignore[arg-type]
    comm = MirrorComm(max(2, int(workers)))

    def steady(once: Any) -> tuple[float, tuple[int, int]]:
        """The best steady step of ``once`` after an untimed one, and its collectives."""
        once()
        comm.calls.clear()
        t = _best(once, repeats, evict)
        k, calls = max(1, repeats), comm.calls  # _best ran ``repeats`` steady steps, each alike
        return t, (calls.get("allreduce", 0) // k, sum(v for q, v in calls.items() if q != "allreduce") // k)

    def timed(x: np.ndarray) -> tuple[float, tuple[int, int]]:
        return steady(_mirror_step(c, comm, x, error_feedback, mode, threads)[0])

    if c.low_rank:
        mats = sorted({tuple(int(d) for d in s) for s in shapes or ()})
        if not mats or any(len(s) < 2 for s in mats):
            raise ConfigError(f"a low-rank codec is timed on the job's matrices (2-D or more), not {shapes!r}")
        rng = np.random.default_rng(0)
        if joined:
            every = [tuple(int(d) for d in s) for s in shapes or ()]
            xs = [rng.standard_normal(s, dtype=np.float32) for s in every]
            t, step_rounds = steady(_mirror_lowrank_step(c, comm, xs, error_feedback, threads))
            total = sum(int(np.prod(s)) for s in every)
            share = tuple((s, t * int(np.prod(s)) / total) for s in mats)
            return TransportSpeed(0.0, t / total, rounds=step_rounds, per_shape=share, joined=True)
        got = [(s, *timed(rng.standard_normal(s, dtype=np.float32))) for s in mats]
        total = sum(int(np.prod(s)) for s in mats)
        return TransportSpeed(
            0.0, sum(t for _, t, _ in got) / total, rounds=got[0][2], per_shape=tuple((s, t) for s, t, _ in got)
        )
    from .transports.two_phase import owner_bounds

    pts = []
    rounds: tuple[int, int] | None = None
    for want in sizes:
        n = int(want)  # two-phase's chunks must be equal for the mirror: a size that splits evenly
        while len(set(np.diff(owner_bounds(n, comm.size)))) > 1:
            n += 1
        x = _sample(c, n)
        t, r = timed(x)
        pts.append((x.size, t))
        rounds = rounds or r
    (n0, t0), (n1, t1) = pts
    return TransportSpeed(*_line(n0, t0, n1, t1), rounds=rounds)


def _mirror_step(
    codec: Codec,
    comm: MirrorComm,
    x: np.ndarray,
    error_feedback: bool,
    mode: str,
    threads: int | None,
) -> tuple[Any, Any]:
    """A function that runs one step of the transports' protocol for ``codec`` on ``x`` over
    ``comm`` (one state: the residual carries from step to step; key ``"t"``), and that state,
    whose ``stats()`` holds each step's figures."""
    from .transports import TransportState, allreduce_protocol, run_blocking

    state = TransportState(codec, error_feedback=error_feedback, mode=mode, num_threads=threads)
    out = np.empty_like(x)

    def once() -> None:
        run_blocking(allreduce_protocol(comm, state, x, out, "t", "mean", mode))

    return once, state


def _mirror_lowrank_step(
    codec: Codec, comm: MirrorComm, xs: list[np.ndarray], error_feedback: bool, threads: int | None
) -> Any:
    """A function that runs one step of the low-rank protocol on all of ``xs`` as one exchange over
    ``comm`` (what the DDP hook does with a bucket's matrices), each matrix decoded in place."""
    from .transports import LowRankItem, TransportState, lowrank_protocol, run_blocking
    from .transports.allreduce import exchange_for
    from .transports.stats import StepStats

    state = TransportState(codec, error_feedback=error_feedback, num_threads=threads)
    items = [LowRankItem(f"t{i}", x, np.empty_like(x)) for i, x in enumerate(xs)]
    shapes = [list(x.shape) for x in xs]

    def once() -> None:
        ex = exchange_for(comm, state, "t", "advise's timing", shapes=shapes, size=comm.size)
        step = state.next_step("t")
        st = StepStats("t", step, "lowrank", sum(x.nbytes for x in xs))
        run_blocking(lowrank_protocol(ex, state, items, "mean", step, st))

    return once


def measure_protocol_speed(
    codec: Codec | str | Mapping[str, Any] | None,
    workers: int = 2,
    *,
    mode: str = "auto",
    error_feedback: bool = False,
    sizes: tuple[int, int] = (1 << 16, 1 << 22),
    repeats: int = 2,
) -> CodecSpeed:
    """Encode and decode seconds and payload bytes as the transports' protocol records them in a
    job (the ``encode_s``, ``decode_s`` and ``payload_bytes`` of its step statistics: the encode
    with the residual's passes, the decode of the ``workers`` payloads and the mean's scaling), at
    two sizes over a :class:`MirrorComm`, best of ``repeats`` after an untimed step, a line through
    them as :func:`measure_speed`. The figures an adaptive controller sets against what the job's
    steps record: the codec's own encode and decode (:func:`measure_speed`) leave out the
    protocol's passes (top-k 1 % + EF at 4.35 M elements: 5 ms by the codec alone, 13 ms through
    the protocol). Loads every kernel the protocol calls, so that a job's first step with the codec
    does not. ``None``
    (dense) costs nothing and sends 4 bytes per element."""
    if codec is None:
        return _ZERO
    c = get_codec(codec)  # type: ignore[arg-type]
    comm = MirrorComm(max(2, int(workers)))
    pts = []
    for n in sizes:
        x = _sample(c, int(n))
        once, state = _mirror_step(c, comm, x, error_feedback, mode, None)
        once()  # untimed: buffers, the residual's first step
        enc = dec = math.inf
        for _ in range(max(1, repeats)):
            once()
            rec = state.stats()["t"]
            enc, dec = min(enc, float(rec["encode_s"])), min(dec, float(rec["decode_s"]))
        pts.append((x.size, enc, dec, float(rec["payload_bytes"])))
    return _speed_line(pts)


def collective_of(codec: Codec | Mapping[str, Any] | None, workers: int, mode: str = "auto") -> str:
    """``"allreduce"`` (dense), or the transport mode the codec runs under on ``workers`` ranks."""
    if codec is None:
        return "allreduce"
    return resolve_mode(get_codec(codec), mode, workers)  # type: ignore[arg-type]


def _volume_latency(
    collective: str, workers: int, nbytes: float, link: Link, rounds: tuple[int, int] | None = None
) -> tuple[float, float]:
    """(bytes received per rank, latency seconds) of one step. ``rounds`` (allreduces, all-gathers
    and all-to-alls), when the protocol's collectives were counted (:class:`TransportSpeed`),
    replaces the table's latency term: a ring allreduce pays 2(p-1) alpha, an all-gather or
    all-to-all (p-1) alpha of the all-gather's link, control words included."""
    p = workers
    if p <= 1:
        return 0.0, 0.0
    if collective == "gather" or (collective == "summable" and p == 2):  # p = 2: one all-gather of the values
        vol, lat = (p - 1) * nbytes, (p - 1) * link.latency_s
    else:
        n_rounds = 2 if collective == "lowrank" else 1
        vol, lat = 2 * (p - 1) / p * nbytes, n_rounds * 2 * (p - 1) * link.latency_s
    if rounds is not None:
        gather = link.for_collective("gather")
        lat = rounds[0] * 2 * (p - 1) * link.latency_s + rounds[1] * (p - 1) * gather.latency_s
    return vol, lat


def comm_seconds(
    collective: str, workers: int, nbytes: float, link: Link, rounds: tuple[int, int] | None = None
) -> float:
    """Predicted communication seconds of one step (the table of the module docstring; ``rounds``:
    the protocol's counted collectives, see :func:`_volume_latency`)."""
    sub = link.for_collective(collective)
    v, _ = _volume_latency(collective, workers, nbytes, sub)
    _, lat = _volume_latency(collective, workers, nbytes, link if rounds is not None else sub, rounds)
    return lat + v / sub.bytes_per_s


def compute_seconds(collective: str, workers: int, enc: float, dec: float) -> float:
    """Encode and decode seconds a collective adds per step (module docstring)."""
    if collective == "allreduce":
        return 0.0
    if collective == "gather":
        return enc + workers * dec
    if collective == "two_phase":
        return (1 + 1 / workers) * enc + 2 * dec
    return enc + dec


def break_even_bps(
    collective: str,
    workers: int,
    nbytes: float,
    compute: float,
    dense_bytes: float,
    link: Link,
    rounds: tuple[int, int] | None = None,
) -> float | None:
    """The bandwidth (bits/s) above which the codec costs more than a dense allreduce, or None when it
    always pays (no extra time at any bandwidth) or never does (no fewer bytes on the wire)."""
    sub = link.for_collective(collective)
    v, _ = _volume_latency(collective, workers, nbytes, sub)
    _, lat = _volume_latency(collective, workers, nbytes, link if rounds is not None else sub, rounds)
    v *= link.bytes_per_s / sub.bytes_per_s  # a slower gather link: the bytes count for more
    vd, latd = _volume_latency("allreduce", workers, dense_bytes, link)
    extra = compute + lat - latd
    if v >= vd:
        return None  # never pays (and never saves bytes)
    if extra <= 0:
        return None  # always pays
    return 8 * (vd - v) / extra


def predict(
    codec: Codec | Mapping[str, Any] | None,
    speed: CodecSpeed,
    tensors: Sequence[tuple[int, ...]],
    workers: int,
    link: Link,
    *,
    mode: str = "auto",
    dense_tensors: Sequence[tuple[int, ...]] = (),
    error_feedback: bool = False,
    transport: TransportSpeed | None = None,
) -> dict[str, Any]:
    """The cost of one step for ``tensors`` (shapes; each encoded on its own) under ``codec``.

    ``dense_tensors`` (biases, small tensors a policy keeps dense) travel in a dense allreduce in
    every case and are added to both the codec's and the baseline's time. With ``error_feedback``,
    each encode also decodes its payload to keep the residual (``T_enc + T_dec`` per encode).
    ``transport`` (:func:`measure_transport`), when given, is the compute of the transports' real
    protocol and replaces the formula built from the codec's encode and decode times; the row
    keeps both (``compute_seconds`` is the one used, ``codec_compute_seconds`` the formula's).
    """
    cfg = None if codec is None else get_codec(codec).get_config()  # type: ignore[arg-type]
    coll = collective_of(cfg, workers, mode)
    numels = [int(np.prod(s)) for s in tensors]
    raw = 4.0 * sum(numels)
    if cfg is None:
        payload = raw
        enc = dec = 0.0
    else:
        payload = sum(speed.payload_bytes(n) for n in numels)
        enc = sum(speed.encode_seconds(n) for n in numels)
        dec = sum(speed.decode_seconds(n) for n in numels)
        if coll == "lowrank":
            payload = 0.0
            r = int(cfg.get("rank", 4))
            for s in tensors:
                m = int(s[0])
                k = int(np.prod(s[1:])) if len(s) > 1 else 1
                payload += 4.0 * (m + k) * min(r, m, k)
    dense_extra = 4.0 * sum(int(np.prod(s)) for s in dense_tensors)
    measured = transport is not None and cfg is not None and (coll != "lowrank" or transport.per_shape is not None)
    rounds = None  # the protocol's counted collectives: one exchange per tensor, or one for all (joined)
    if measured and transport is not None and transport.rounds is not None:
        n_ex = 1 if transport.joined else len(numels)  # the exchanges of one step
        rounds = (transport.rounds[0] * n_ex, transport.rounds[1] * n_ex)
    base = comm_seconds("allreduce", workers, raw + dense_extra, link)
    if cfg is None:
        comm = base
    else:  # the dense tensors go in their own allreduce, next to the codec's collective
        comm = comm_seconds(coll, workers, payload, link, rounds)
        if dense_extra:
            comm += comm_seconds("allreduce", workers, dense_extra, link)
    if error_feedback and cfg is not None and coll != "lowrank":
        enc += dec  # the residual is (x + e) minus the decoded payload
    formula = compute_seconds(coll, workers, enc, dec)
    compute = sum(transport.seconds_of(s) for s in tensors) if transport is not None and measured else formula
    wire, _ = _volume_latency(coll, workers, payload, link)
    wire_dense, _ = _volume_latency("allreduce", workers, dense_extra, link)
    return {
        "codec": cfg,
        "name": "none (fp32 allreduce)" if cfg is None else _label(cfg),
        "collective": coll,
        "workers": workers,
        "numel": sum(numels),
        "payload_bytes": round(payload),
        "wire_bytes": round(wire + wire_dense),
        "ratio": payload / raw if raw else 1.0,
        "encode_seconds": enc,
        "decode_seconds": dec,
        "compute_seconds": compute,
        "codec_compute_seconds": formula,
        "compute_source": "transport" if measured else ("none" if cfg is None else "codec"),
        "comm_seconds": comm,
        "rounds": None if rounds is None else list(rounds),
        "step_seconds": comm + compute,
        "baseline_seconds": base,
        "saving_seconds": base - (comm + compute),
        "verdict": "-" if cfg is None else verdict(base - (comm + compute), base),
        "bandwidth_bps": link.for_collective(coll).bandwidth_bps,
        "latency_s": link.for_collective(coll).latency_s,
        "break_even_bps": None if cfg is None else break_even_bps(coll, workers, payload, compute, raw, link, rounds),
    }


#: A codec is said to pay only when its predicted saving is more than this fraction of the
#: uncompressed exchange it replaces. A smaller saving is "close": the model's error, measured in
#: bench/advise_check.py, can be as large (its DDP steps at 4 M and 25 M parameters miss by up to
#: a tenth of the step, where the exchange is two fifths of it: a quarter of the exchange), so the
#: saving's sign is not known and advise recommends no codec on it (docs/advise.md, "Close calls").
CLOSE_FRACTION = 0.25


def verdict(saving_s: float, baseline_s: float) -> str:
    """``"pays"`` (a saving beyond :data:`CLOSE_FRACTION` of ``baseline_s``, the uncompressed
    exchange), ``"close"`` (a smaller saving) or ``"costs"`` (none)."""
    if saving_s > CLOSE_FRACTION * baseline_s:
        return "pays"
    return "close" if saving_s > 0 else "costs"


def _label(cfg: Mapping[str, Any]) -> str:
    keep = {k: v for k, v in cfg.items() if k in ("bits", "levels", "ratio", "rank")}
    return cfg["id"] + ("" if not keep else " " + " ".join(f"{k}={v}" for k, v in keep.items()))


def model_shapes(params: Any) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) from a parameter list: ``{name: shape}``, ``[[name, shape], ...]`` or
    ``[{"name": ..., "shape": [...]}, ...]`` (what ``json.dump({n: list(p.shape) for n, p in
    model.named_parameters()})`` writes)."""
    items: Iterable[Any] = params.items() if isinstance(params, Mapping) else params
    out = []
    for i, it in enumerate(items):
        if isinstance(it, Mapping):
            name, shape = it.get("name", f"param{i}"), it.get("shape")
        else:
            name, shape = it
        if isinstance(shape, int):
            shape = [shape]
        if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ConfigError(f"parameter {name!r}: shape must be a list of non-negative ints, not {shape!r}")
        out.append((str(name), tuple(int(d) for d in shape)))
    if not out:
        raise ConfigError("the parameter list is empty")
    return out


def job_tensors(
    *, numel: int | None = None, model: Any = None, min_numel: int = 1024
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """(the shapes a job compresses, the shapes it sends dense) as :func:`advise` prices them: one
    flat tensor of ``numel`` elements, or a model's parameters (:func:`model_shapes`), tensors under
    ``min_numel`` elements and 1-D ones dense."""
    if (numel is None) == (model is None):
        raise ConfigError("give numel or model, not both or neither")
    if numel is not None:
        if int(numel) < 1:
            raise ConfigError(f"numel must be >= 1, not {numel}")
        return [(int(numel),)], []
    shapes = model_shapes(model)
    tensors = [s for _, s in shapes if len(s) >= 2 and int(np.prod(s)) >= min_numel]
    return tensors, [s for _, s in shapes if not (len(s) >= 2 and int(np.prod(s)) >= min_numel)]


def measure_steps(
    candidates: Sequence[Any],
    tensors: Sequence[tuple[int, ...]],
    dense: Sequence[tuple[int, ...]],
    *,
    exchange: Any,
    dense_allreduce: Any,
    make: Any,
    barrier: Any,
    slowest: Any,
    repeats: int = 3,
    mode: str = "auto",
    error_feedback: bool = False,
    threads: int | None = None,
    evict: Any = None,
) -> dict[str, float]:
    """Each candidate's exchange of the job's gradients, measured on the job's own ranks and link
    (what ``gcodec advise --probe`` reports beside the model): ``{codec config as canonical JSON
    ("null": dense): seconds}``, the slowest rank's median of ``repeats`` steps after an untimed
    one (the handshake, kernels compiled), each after a barrier.

    A step is what :func:`predict` prices: each of ``tensors`` exchanged under the codec with its
    own key (``exchange(array, codec, key, state)``: the engine's compressed allreduce in place,
    ``state`` a :class:`~gcodec.transports.TransportState`) and the ``dense`` ones in one float32
    allreduce (``dense_allreduce(array)``); for the baseline, every byte in one such allreduce.
    ``make(shape)`` makes an engine array of Gaussian float32 values. ``evict()`` (a
    :class:`CacheEvictor`), when given, runs before each step's barrier, as :func:`advise` times
    the protocol. Every rank must call it with the same arguments. The transport knows no engine:
    the caller's callables are the engine."""
    from statistics import median

    from .transports import TransportState

    arrays = [make(tuple(s)) for s in tensors]
    n_dense = sum(int(np.prod(s)) for s in dense)
    side = make((n_dense,)) if n_dense else None
    whole = make((sum(int(np.prod(s)) for s in tensors) + n_dense,))
    out: dict[str, float] = {}
    for cand in candidates:
        cfg = None if cand is None else get_codec(cand).get_config()
        if cfg is not None and get_codec(cfg).low_rank and not all(len(s) >= 2 for s in tensors):
            continue  # PowerSGD needs matrices (as advise, which prices it for a model only)
        state = (
            None if cfg is None else TransportState(cfg, error_feedback=error_feedback, mode=mode, num_threads=threads)
        )

        def step(cfg: Any = cfg, state: Any = state) -> None:
            if cfg is None:
                dense_allreduce(whole)
                return
            for i, a in enumerate(arrays):
                exchange(a, cfg, f"t{i}", state)
            if side is not None:
                dense_allreduce(side)

        ts = []
        for _ in range(max(1, repeats) + 1):
            if evict is not None:
                evict()
            barrier()
            t0 = time.perf_counter()
            step()
            ts.append(time.perf_counter() - t0)
        out[json.dumps(cfg, sort_keys=True)] = float(slowest(median(ts[1:])))
    return out


def advise(
    *,
    numel: int | None = None,
    model: Any = None,
    bandwidth: str | float = "1Gbit",
    workers: int = 2,
    latency_s: float = 50e-6,
    candidates: Sequence[Any] = DEFAULT_CANDIDATES,
    mode: str = "auto",
    min_numel: int = 1024,
    threads: int | None = None,
    repeats: int = 3,
    speeds: Mapping[str, CodecSpeed] | None = None,
    error_feedback: bool = False,
    transport: bool = True,
    gather_link: Link | None = None,
    cold: bool = True,
    evictor: CacheEvictor | None = None,
) -> list[dict[str, Any]]:
    """One prediction per candidate codec (see :func:`predict`), measuring each codec's speed here.

    Give ``numel`` (one flat tensor, as the DDP hook sends a bucket) or ``model`` (a parameter list,
    see :func:`model_shapes`: tensors under ``min_numel`` elements and 1-D tensors stay dense, as the
    default policy keeps them). PowerSGD needs matrices, so it is priced for ``model`` only.
    ``gather_link`` (measured by ``--probe``) prices the summable, gather and two-phase collectives
    (:attr:`Link.gather`). ``transport`` (default) times the transports' own protocol for each codec
    (:func:`measure_transport`) and prices compute with it; False uses the formula on the codec's
    encode and decode times alone, which leaves out the transports' passes.

    ``cold`` (default) times every step after reading more memory than the caches hold
    (:class:`CacheEvictor`), as a training step's forward and backward passes leave the caches to
    its exchange; False times the same buffers step after step, as a loop of allreduces with
    nothing between runs them. Each row's ``caches`` says which. ``evictor`` is the one to use
    (a caller that probed the link with one), else a new one is made.
    """
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be an int >= 1, not {workers!r}")
    link = Link(parse_bandwidth(bandwidth), latency_s, gather_link)
    tensors, dense = job_tensors(numel=numel, model=model, min_numel=min_numel)
    evict = (evictor or CacheEvictor()) if cold else None
    out = []
    for cand in candidates:
        cfg = None if cand is None else get_codec(cand).get_config()
        if cfg is not None and get_codec(cfg).low_rank and (model is None or not tensors):
            continue
        key = json.dumps(cfg, sort_keys=True)
        speed = (speeds or {}).get(key) or measure_speed(cfg, threads=threads, repeats=repeats, evict=evict)
        tspeed = None
        if transport and cfg is not None and workers > 1:
            tspeed = measure_transport(
                cfg,
                workers,
                mode=mode,
                error_feedback=error_feedback,
                threads=threads,
                repeats=repeats,
                sizes=transport_sizes(int(np.prod(s)) for s in tensors),
                shapes=tensors,  # a low-rank codec is timed on the job's own matrices
                evict=evict,
            )
        row = predict(
            cfg,
            speed,
            tensors,
            workers,
            link,
            mode=mode,
            dense_tensors=dense,
            error_feedback=error_feedback,
            transport=tspeed,
        )
        row["caches"] = "cold" if cold else "warm"
        out.append(row)
    return out


def format_table(
    rows: Sequence[Mapping[str, Any]], bandwidth_bps: float, workers: int, notes: Sequence[str] = ()
) -> str:
    """The human-readable table ``gcodec advise`` prints; ``notes`` (what was measured, what
    assumed) go under its first line. Rows that carry ``measured_step_seconds`` (``--probe``: the
    job's exchange timed on its link) get that figure and the verdict it gives beside the model's."""

    def bw(v: float | None, pays: bool) -> str:
        if v is None:
            return "always" if pays else "never"
        return f"{v / 1e9:.3g} Gbit/s" if v >= 1e9 else f"{v / 1e6:.3g} Mbit/s"

    measured = any(r.get("measured_step_seconds") is not None for r in rows)
    head = (
        f"{'codec':<27} {'mode':<10} {'wire MB':>9} {'comm ms':>9} {'compute ms':>11} {'saving ms':>10}  "
        f"{'verdict':<7}  break-even"
    )
    lines = [
        f"{workers} workers, {bandwidth_bps / 1e9:.3g} Gbit/s; baseline: fp32 ring allreduce "
        f"{rows[0]['baseline_seconds'] * 1e3:.1f} ms per step"
        if rows
        else "no candidates",
        *notes,
        head + ("    measured ms  here" if measured else ""),
    ]
    for r in rows:
        pays = r["saving_seconds"] > 0
        line = (
            f"{r['name']:<27} {r['collective']:<10} {r['wire_bytes'] / 1e6:>9.3f} {r['comm_seconds'] * 1e3:>9.2f} "
            f"{r['compute_seconds'] * 1e3:>11.2f} {r['saving_seconds'] * 1e3:>10.2f}  {r.get('verdict', '-'):<7}  "
            + ("-" if r["codec"] is None else bw(r["break_even_bps"], pays))
        )
        t, saved = r.get("measured_step_seconds"), r.get("measured_saving_seconds")
        if measured:
            # the uncompressed exchange as measured: this row's time plus what it saved
            here = "-" if r["codec"] is None or saved is None or t is None else verdict(saved, saved + t)
            line = f"{line:<{len(head)}}" + (f" {t * 1e3:>14.2f}  {here}" if t is not None else f" {'-':>14}")
        lines.append(line)
    return "\n".join(lines)
