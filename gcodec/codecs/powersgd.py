"""``powersgd``: rank-r approximation M ~ P Q^T by power iteration (specs/codecs/powersgd.md).

PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019) views a gradient as a matrix M (m x n: the
first dimension by the product of the rest, as torch's ``powerSGD_hook`` does) and sends two thin
factors, P (m x r, orthonormal columns) and Q (n x r), instead of its m*n entries. A 4096 x 4096
layer at rank 4 shrinks 512-fold. The approximation is biased, so train with error feedback
(:class:`gcodec.ErrorFeedback` for single payloads; the distributed protocol below keeps its own).

One step, as in torch (``iterations`` repeats the three middle lines):

1. Q <- the warm-start Q of this key (or the spec's random initial Q), orthogonalised;
2. P <- M Q;                     ............  (allreduce P: round 1)
3. P <- orthogonalise(P);
4. Q <- M^T P;                   ............  (allreduce Q: round 2)
5. M_hat = P Q^T.

Orthogonalisation is Gram-Schmidt for rank <= 2 (with ``epsilon`` keeping zero columns at zero)
and Householder QR (LAPACK) above, as torch chooses. The products stream M once each
(:mod:`gcodec.kernels.cpu.lowrank`).

**Single payloads** (``codec.encode``) carry P and Q of one worker: decode gives P Q^T. They are
gather-only: P1 Q1^T + P2 Q2^T is not (P1 + P2)(Q1 + Q2)^T.

**Distributed** (the two-round protocol, sums of factors): :meth:`PowerSGD.begin` returns a
:class:`LowRankRound`; a transport allreduces ``round.p`` (sum), calls ``round.compute_q()``,
allreduces the returned Q (sum) and calls ``round.decompress(out, scale=1/world)``. Every rank gets
the same P and summed Q, hence the same result, and the warm-start Q (the summed Q, as in torch) is
kept per key.

**Small tensors**: vectors, scalars, empty tensors and matrices where ``m*n / ((m+n)*r)`` does not
exceed ``min_compression_rate`` are sent as plain fp32 or fp16 (``passthrough``); the header's
``mode`` says which.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import alloc, kernels
from ..arrays import backend_of as kernels_backend
from ..arrays import intake
from ..errors import ConfigError, HeaderError, PayloadValueError
from ..sections import SectionSpec, TensorEntry
from . import compose
from .base import Aggregation, Codec, EncodeContext, EncodePlan, Param
from .registry import register_codec
from .seeds import SHARED_SEED
from .sparse import check_nested, key_bits
from .state import CodecState

__all__ = [
    "LowRankRound",
    "PowerSGD",
    "compute_p",
    "compute_q",
    "decompress",
    "initial_q",
    "matrix_shape",
    "orthogonalize",
    "should_compress",
]

_NONE = type(None)
_MODES = ("lowrank", "fp32", "fp16")


# --------------------------------------------------------------------------------------------
# the steps (public: transports call them for the two-round protocol)


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int] | None:
    """(m, n) = (shape[0], product of the rest) for tensors of 2+ dims, else None (torch's rule)."""
    if len(shape) < 2:
        return None
    m = int(shape[0])
    n = 1
    for d in shape[1:]:
        n *= int(d)
    return m, n


def should_compress(m: int, n: int, rank: int, min_compression_rate: float) -> bool:
    """torch's ``_should_compress``: (m + n) * r * min_compression_rate < m * n, and m, n, r >= 1."""
    r = min(rank, m, n)
    return m > 0 and n > 0 and r > 0 and (m + n) * r * min_compression_rate < m * n


def _refuse_overflow(data: np.ndarray, dtype_name: str) -> None:
    """Pass-through data must be finite (rule P3): a finite input that overflows binary16 (|x| >= 65520)
    or binary32 (float64 input) is refused rather than sent as infinity."""
    bad = kernels.of(data).sparse.count_nonfinite(*key_bits(data.reshape(-1), dtype_name))
    if bad:
        raise PayloadValueError(
            f"powersgd: {bad} value(s) overflow {dtype_name} in the pass-through (finite input, infinite result)"
        )


#: Rule P4's bound on rank * max|P| * max|Q| for tensors decoded in float32 (all but float64): half of
#: FLT_MAX, so that no float32 sum of rank products can round up to infinity.
FACTOR_PRODUCT_BOUND = 2.0**127


def factor_product_ok(p: np.ndarray, q: np.ndarray, dtype_name: str) -> bool:
    """Rule P4: every entry of P Q^T is finite in the decoder's arithmetic (always, for float64)."""
    if dtype_name == "float64" or p.size == 0 or q.size == 0:
        return True
    r = p.shape[1] if p.ndim == 2 else 1
    return _product_ok(r, _max_abs(p), _max_abs(q), dtype_name)


def _product_ok(r: int, max_p: float, max_q: float, dtype_name: str) -> bool:
    """Rule P4 from (bounds on) the factors' largest magnitudes."""
    return dtype_name == "float64" or float(r) * max_p * max_q <= FACTOR_PRODUCT_BOUND


def _max_abs(a: Any) -> float:
    # device factors are reduced on the device, one number back; host ones without a temporary
    return float(kernels.of(a).lowrank.max_abs(a))


def _device(a: Any) -> bool:
    """Whether ``a`` lives on a device backend: the steps below then run that backend's lowrank
    kernels (gcodec/kernels/cuda/lowrank.py) and keep every matrix in device memory."""
    return kernels_backend(a) != "cpu"


def initial_q(
    n: int, rank: int, seed: int, stream: int, dtype: Any = np.float32, *, backend: str = "cpu"
) -> np.ndarray:
    """The spec's initial Q (n x rank): ``Q[j, c] = 2 * u - 1`` with u the uniform01 of word ``j*rank + c``.

    Word w of the Philox stream (specs/rng.md) gives ``u = (w >> 8) * 2**-24``; every rank with the
    same seed and stream builds the same Q, bit for bit (on every backend).
    """
    if backend != "cpu":
        return kernels.get(backend).lowrank.initial_q(n, rank, seed, stream, dtype)  # type: ignore[no-any-return]
    w = kernels.get(backend).philox.random_u32(seed, stream, n * rank)
    u = (w >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)
    q = (np.float32(2.0) * u - np.float32(1.0)).reshape(n, rank)
    return q.astype(dtype, copy=False)


def orthogonalize(a: np.ndarray, epsilon: float = 1e-8) -> np.ndarray:
    """Orthonormalise the columns of ``a`` (m x r) in place and return it.

    Gram-Schmidt for r <= 2 (a zero column stays zero: it is divided by ``norm + epsilon``),
    Householder QR above (LAPACK's reduced Q). This is torch's choice in ``_orthogonalize``.
    """
    r = a.shape[1]
    if r == 0 or a.shape[0] == 0:
        return a
    if _device(a):
        return kernels.of(a).lowrank.orthogonalize(a, float(epsilon))  # type: ignore[no-any-return]
    if r <= 2:
        kernels.of(a).lowrank.gram_schmidt(a, float(epsilon))
    else:
        q, _ = np.linalg.qr(a)
        a[...] = q
    return a


def _padded_t(a: np.ndarray, dtype: Any) -> np.ndarray:
    """a (k x r) transposed into a (rp x k) C-contiguous array, rp = r rounded up to 4, zero rows added."""
    k, r = a.shape
    rp = (r + 3) // 4 * 4
    t = np.zeros((rp, k), dtype)
    t[:r] = a.T
    return t


def compute_p(m: np.ndarray, q: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """P = M Q (M: m x n, Q: n x r) in one streaming pass over M (BLAS above rank 8)."""
    rows, r = m.shape[0], q.shape[1]
    K = kernels.of(m)
    if _device(m):
        return K.lowrank.compute_p(m, q, out)  # type: ignore[no-any-return]
    if r > K.lowrank.MAX_KERNEL_RANK:
        return np.matmul(m, q.astype(m.dtype, copy=False), out=out)
    qt = _padded_t(q, m.dtype)
    p = np.empty((rows, qt.shape[0]), m.dtype)
    K.lowrank.mat_q(m, qt, p)
    if out is None:
        return np.ascontiguousarray(p[:, :r])
    out[...] = p[:, :r]
    return out


def compute_q(m: np.ndarray, p: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Q = M^T P (M: m x n, P: m x r) in one streaming pass over M (BLAS above rank 8)."""
    n, r = m.shape[1], p.shape[1]
    K = kernels.of(m)
    if _device(m):
        return K.lowrank.compute_q(m, p, out)  # type: ignore[no-any-return]
    if r > K.lowrank.MAX_KERNEL_RANK:
        return np.matmul(m.T, p.astype(m.dtype, copy=False), out=out)
    rp = (r + 3) // 4 * 4
    pp = np.zeros((m.shape[0], rp), m.dtype)
    pp[:, :r] = p
    qt = np.empty((rp, n), m.dtype)
    K.lowrank.mat_tp(m, pp, qt)
    if out is None:
        return np.ascontiguousarray(qt[:r].T)
    out[...] = qt[:r].T
    return out


def decompress(p: np.ndarray, q: np.ndarray, out: np.ndarray, *, accumulate: bool = False, scale: float = 1.0) -> None:
    """out (+)= scale * P Q^T, written row by row into ``out`` (m*n elements, float32/float64).

    No temporary of the output's size. Every rank runs the reconstruct kernel, whose sums follow
    specs/codecs/powersgd.md §6 exactly (no BLAS: its order and fused operations are its own).
    """
    flat = out.reshape(-1)
    m = p.shape[0]
    n = q.shape[0]
    if flat.shape[0] != m * n:
        raise ConfigError(f"out has {flat.shape[0]} elements; P Q^T has {m} x {n}")
    dt = flat.dtype
    K = kernels.of(flat)
    if not (isinstance(p, np.ndarray) and isinstance(q, np.ndarray)):  # device factors
        # Device kernels only: a copy of P in the output's dtype, scaled once; Q^T is a strided view
        # (the reconstruct kernel indexes it), so nothing leaves the device.
        ps = K.lowrank.copy_of(p, dt) if (scale != 1.0 or p.dtype != dt) else p
        if scale != 1.0:
            fp = ps.reshape(int(ps.size))
            K.memory.scale(fp, fp, scale)
        qt = q.T if q.dtype == dt else K.lowrank.copy_of(q, dt).T
        K.lowrank.reconstruct(ps, qt, flat, accumulate)
        return
    # Host factors, a payload's when decoding: their copies (P in the output's dtype and scaled, Q
    # transposed) are sized by its header, so they come from the one allocator (gcodec/alloc.py).
    ps = p
    if scale != 1.0 or p.dtype != dt or not p.flags.c_contiguous:
        ps = alloc.empty("PowerSGD's factor P in the output's dtype", p.shape, dt)
        ps[...] = p
        if scale != 1.0:
            ps *= dt.type(scale)
    qt = alloc.empty("PowerSGD's factor Q, transposed", (q.shape[1], n), dt)
    qt[...] = q.T
    K.lowrank.reconstruct(ps, qt, flat, accumulate)


#: The slot of a :class:`~gcodec.codecs.state.CodecState` that holds each key's warm-start Q.
Q_SLOT = "q"


def _store_q(state: CodecState, key: str | None, q: np.ndarray) -> None:
    # a device Q stays on the device (the next encode of the key starts from it without a transfer)
    state.put_array(Q_SLOT, key, kernels.of(q).lowrank.copy_of(q) if _device(q) else np.array(q, copy=True))


class LowRankRound:
    """One tensor's pass through the two-round distributed protocol (see the module docstring).

    Attributes:
        p: the local P = M Q (m x r), to be summed across ranks in place (round 1).
        q: after :meth:`compute_q`, the local Q = M^T P_hat (n x r), to be summed in place (round 2).
    """

    def __init__(self, codec: PowerSGD, key: str | None, m: np.ndarray, q: np.ndarray, state: CodecState) -> None:
        self._codec = codec
        self._key = key
        self._state = state
        self._m = m
        self.p = compute_p(m, q)
        self.q: np.ndarray | None = None

    def compute_q(self) -> np.ndarray:
        """Orthogonalise the (summed) P in place, then compute and return the local Q = M^T P."""
        orthogonalize(self.p, self._codec.params["epsilon"])
        self.q = compute_q(self._m, self.p)
        return self.q

    def decompress(self, out: np.ndarray | None = None, *, scale: float = 1.0, accumulate: bool = False) -> np.ndarray:
        """Write ``scale * P Q^T`` (Q summed) into ``out`` (shape of M) and keep Q as this key's warm start."""
        if self.q is None:
            raise ConfigError("call compute_q() (and allreduce its result) before decompress()")
        if out is None:
            out = np.empty(self._m.shape, self._m.dtype)
        decompress(self.p, self.q, out, accumulate=accumulate, scale=scale)
        if self._codec.params["warm_start"]:
            _store_q(self._state, self._key, self.q)
        return out


# --------------------------------------------------------------------------------------------
# the codec


@register_codec
class PowerSGD(Codec):
    """Rank-r power iteration with warm start.

    Parameters:
        rank: r, the number of columns of P and Q. 1-4 is typical with error feedback (torch's
            default is 1; 4 is a good balance for CNNs and transformers); the payload grows
            linearly with r.
        iterations: power iterations per encode (default 1, as in torch; with warm start one
            iteration per step tracks the dominant subspace over time). More iterations get closer
            to the best rank-r error of this one matrix at one more pass over M each.
        warm_start: reuse the previous Q of the same key (torch's default). False draws a fresh
            random Q every call.
        min_compression_rate: compress only when m*n / ((m+n)*r) exceeds this (torch's default 2).
        passthrough: ``"fp32"`` or ``"fp16"``: how tensors that are not compressed travel.
        epsilon: added to column norms in Gram-Schmidt so zero columns stay zero (default 1e-8).
        seed: Philox key of the initial Q; every rank must use the same seed.
        factors: ``None`` sends P and Q as float32; a codec config such as ``{"id": "fp16"}`` or
            ``{"id": "uniform", "bits": 8}`` encodes both factors with that codec (a hybrid). In the
            two-allreduce protocol (the DDP hook, ``all_reduce``, ``gcodec.mpi``) ``"fp16"`` and
            ``"bf16"`` sum the factors in 16 bits, half the bytes (specs/codecs/powersgd.md §8; MPI
            sums fp16 only); other factor codecs do not sum and are refused there.

    State (warm-start Q per key in slot :data:`Q_SLOT`, initial-Q stream counters) lives in the
    caller's :class:`~gcodec.codecs.state.CodecState`, which saves and restores it like torch's
    ``PowerSGDState``; ``codec.encode(x)`` without ``state=`` uses the codec object's default state.
    """

    codec_id = "powersgd"
    aggregation = Aggregation.GATHER
    low_rank = True  # two allreduces of factors (begin/LowRankRound): whole matrices only
    NESTED_ROLES = ("p", "q")
    PARAMS = {
        "rank": Param(int, 4, "rank of the approximation", min=1, max=1 << 16),
        "iterations": Param(int, 1, "power iterations per encode", min=1, max=64),
        "warm_start": Param(bool, True, "reuse Q of the previous call of the same key"),
        "min_compression_rate": Param(float, 2.0, "compress only above this rate", min=0.0),
        "passthrough": Param(str, "fp32", "how uncompressed tensors travel", choices=("fp32", "fp16")),
        "epsilon": Param(float, 1e-8, "Gram-Schmidt norm epsilon", min=0.0),
        "seed": SHARED_SEED,
        "factors": Param((dict, str, _NONE), None, "codec config for P and Q, or None for float32"),
    }
    WIRE = {
        "mode": Param(str, "lowrank", "lowrank, or the passthrough form", choices=_MODES),
        "rank": Param(int, 0, "rank r of P and Q (0 when passed through)", min=0),
        "p": Param((dict, _NONE), None, "nested codec of P, or nil"),
        "q": Param((dict, _NONE), None, "nested codec of Q, or nil"),
    }

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        nested = compose.nested_codec_from_config("factors", self._params["factors"], self.codec_id)
        self._nested = nested
        self._params["factors"] = None if nested is None else nested.get_config()

    @classmethod
    def wire_schema(cls) -> dict[str, Param]:
        return cls.WIRE

    # ---- state ---------------------------------------------------------------------------
    def _take_q(self, ctx: EncodeContext, n: int, r: int, dtype: Any, backend: str) -> np.ndarray:
        """The Q to start from: the warm one of this key in the caller's state when it fits, else a
        fresh initial Q (whose stream comes from ``ctx``)."""
        q = ctx.state.get_array(Q_SLOT, ctx.key) if self._params["warm_start"] else None
        if q is not None and tuple(q.shape) == (n, r):
            if backend != "cpu":  # a device copy (of a device Q, or of a host one kept by a CPU encode)
                return kernels.get(backend).lowrank.copy_of(q, dtype)  # type: ignore[no-any-return]
            if _device(q):
                q = q.copy_to_host()  # type: ignore[attr-defined]
            return q.astype(dtype, copy=True)
        return initial_q(n, r, self._params["seed"], ctx.take_stream(), dtype, backend=backend)

    # ---- the distributed protocol --------------------------------------------------------
    def compresses(self, shape: tuple[int, ...]) -> bool:
        """Whether a tensor of this shape is compressed (else it passes through)."""
        mn = matrix_shape(tuple(shape))
        return mn is not None and should_compress(
            mn[0], mn[1], self._params["rank"], self._params["min_compression_rate"]
        )

    def compression_rate(self, shape: tuple[int, ...]) -> float:
        """m·n / ((m+n)·r) of the matrix view of ``shape`` (0 when it is no matrix)."""
        mn = matrix_shape(tuple(shape))
        if mn is None:
            return 0.0
        m, n = mn
        return m * n / ((m + n) * min(self._params["rank"], m, n))

    def factor_sizes(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """The elements of P (m x r) and of Q (n x r) for a compressed tensor of ``shape``: what the
        protocol's two allreduces carry for it, fixed by the configuration and the shape."""
        mn = matrix_shape(tuple(shape))
        if mn is None:
            raise ConfigError(f"powersgd: shape {tuple(shape)} is not a matrix")
        m, n = mn
        r = min(self._params["rank"], m, n)
        return m * r, n * r

    def begin(
        self, x: Any, *, key: str | None = None, step: int | None = None, state: CodecState | None = None
    ) -> LowRankRound:
        """Start the two-round protocol for one tensor: returns a round whose ``p`` is to be allreduced.

        ``state`` holds each key's warm-start Q and the initial-Q stream counters (default: this codec
        object's :meth:`default_state`); every rank keeps its own, and they stay equal because every
        rank stores the same summed Q. Raises ConfigError for tensors that :meth:`compresses` rejects
        (send those uncompressed).
        """
        st = self.default_state() if state is None else state
        got = intake(x)  # host or device memory, not copied: the rounds run where the tensor lives
        arr = kernels.get(got.backend).view(got.array)
        if not self.compresses(tuple(arr.shape)):
            raise ConfigError(f"powersgd: shape {tuple(arr.shape)} is not compressed at rank {self._params['rank']}")
        if got.backend != "cpu" and arr.dtype not in (np.float32, np.float64):
            raise ConfigError(f"powersgd: device tensors of {arr.dtype} have no device path (float32, float64)")
        mat = self._matrix(arr)
        m, n = mat.shape
        r = min(self._params["rank"], m, n)
        q = self._take_q(EncodeContext(key, step, st), n, r, mat.dtype, got.backend)
        orthogonalize(q, self._params["epsilon"])
        return LowRankRound(self, key, mat, q, st)

    @staticmethod
    def _matrix(arr: np.ndarray) -> np.ndarray:
        mn = matrix_shape(arr.shape)
        assert mn is not None
        wd = np.float64 if arr.dtype == np.float64 else np.float32
        flat = arr.reshape(-1)
        if flat.dtype != wd:
            flat = flat.astype(wd)
        return flat.reshape(mn)

    # ---- encoding ------------------------------------------------------------------------
    def plan(self, x: np.ndarray, ctx: EncodeContext) -> EncodePlan:
        if not self.compresses(x.shape):
            return self._plan_passthrough(x)
        mat = self._matrix(x)
        m, n = mat.shape
        r = min(self._params["rank"], m, n)
        eps = self._params["epsilon"]
        q = self._take_q(ctx, n, r, mat.dtype, kernels_backend(mat))
        for _ in range(self._params["iterations"]):
            orthogonalize(q, eps)
            p = compute_p(mat, q)
            orthogonalize(p, eps)
            q = compute_q(mat, p)
        bad = kernels.of(p).lowrank.count_nonfinite(p) + kernels.of(q).lowrank.count_nonfinite(q)
        if bad:
            raise PayloadValueError(f"powersgd: input has NaN or infinite values ({bad} non-finite factor entries)")
        params: dict[str, Any] = {"mode": "lowrank", "rank": r, "p": None, "q": None}
        sections: list[SectionSpec] = []
        fills = []
        raw: dict[str, np.ndarray] = {}
        dname = "float64" if mat.dtype == np.float64 else "float32"
        max_p, max_q = _max_abs(p), _max_abs(q)
        if not _product_ok(r, max_p, max_q, dname):
            raise PayloadValueError(
                "powersgd: input too large: rank * max|P| * max|Q| exceeds 2**127, so P Q^T could overflow float32"
            )
        if self._nested is not None:
            self._refuse_nested_factors(r, max_p, max_q, m, n, dname, ctx.key)
        K = kernels.of(mat)
        for role, f in (("p", p), ("q", q)):
            if self._nested is None:
                if _device(f):  # rounded to binary32 on the device
                    raw[role] = K.memory.empty(int(f.size), np.float32)
                    K.memory.copy(raw[role], f.reshape(int(f.size)))
                else:
                    with np.errstate(over="ignore"):
                        raw[role] = np.ascontiguousarray(f, dtype=np.float32).reshape(-1)
                nover = kernels.of(raw[role]).lowrank.count_nonfinite(raw[role])
                if nover:  # float64 input: a finite factor beyond float32's range (rule P3)
                    raise PayloadValueError(f"powersgd: {nover} entries of factor {role.upper()} overflow float32")
                sections.append(SectionSpec(role, "f4", 4 * raw[role].size))
            else:
                wire, secs, fill = compose.plan_nested(role, self._nested, f.reshape(int(f.size)), ctx)
                params[role] = wire
                sections += secs
                fills.append(fill)

        def fill_all(views: Mapping[str, np.ndarray]) -> None:
            for role, f32 in raw.items():
                K.memory.copy(views[role], f32)
            for fn in fills:
                fn(views)  # a nested codec may still refuse its factor here
            # Q becomes the warm start only once the payload is written: an input refused anywhere
            # above leaves the key's state as it was (docs/nonfinite.md).
            if self._params["warm_start"]:
                _store_q(ctx.state, ctx.key, q)

        return EncodePlan(params, sections, fill_all)

    def _refuse_nested_factors(
        self, r: int, max_p: float, max_q: float, m: int, n: int, dname: str, key: str | None
    ) -> None:
        """Refuse factors whose values the nested codec could decode to ±infinity (rule P3) or to a
        product beyond P4's bound (specs/codecs/hybrid.md §3.1), from its bound on what it decodes."""
        assert self._nested is not None
        cid = self._nested.codec_id
        of = "" if key is None else f" of tensor {key!r}"
        bound_p = self._nested.magnitude_bound(max_p, m * r)
        bound_q = self._nested.magnitude_bound(max_q, n * r)
        for role, largest, bound in (("P", max_p, bound_p), ("Q", max_q, bound_q)):
            if math.isinf(bound):
                raise PayloadValueError(
                    f"powersgd: factor {role}{of} reaches {largest:.6g}, beyond the range of the nested {cid!r} "
                    "codec: it would decode to infinity, which rule P3 refuses; use a factor codec with a wider "
                    "range, or scale the tensor down"
                )
        if not _product_ok(r, bound_p, bound_q, dname):
            raise PayloadValueError(
                f"powersgd: input{of} too large for the nested {cid!r} factors: as decoded, rank * max|P| * max|Q| "
                "could exceed 2**127, which rule P4 refuses (P Q^T could overflow float32)"
            )

    def _plan_passthrough(self, x: np.ndarray) -> EncodePlan:
        from ..arrays import dtype_name

        flat = x.reshape(-1)
        bad = kernels.of(flat).sparse.count_nonfinite(*key_bits(flat, dtype_name(flat.dtype)))
        if bad:
            raise PayloadValueError(f"powersgd: input has NaN or infinite values ({bad} found)")
        mode = self._params["passthrough"]
        params = {"mode": mode, "rank": 0, "p": None, "q": None}
        n = flat.shape[0]
        if mode == "fp32":

            def fill(views: Mapping[str, np.ndarray]) -> None:
                with np.errstate(over="ignore"):  # overflow is refused just below
                    if _device(flat):
                        kernels.of(flat).memory.copy(views["data"], flat)
                    else:
                        views["data"][:] = flat.astype(np.float32, copy=False)
                _refuse_overflow(views["data"], "float32")

            return EncodePlan(params, [SectionSpec("data", "f4", 4 * n)], fill)

        def fill16(views: Mapping[str, np.ndarray]) -> None:
            dst = views["data"].view(np.uint16)
            if flat.dtype == np.float16:
                dst[:] = flat.view(np.uint16)
            else:
                src = flat if flat.dtype in (np.float32, np.float64) else flat.astype(np.float32)
                kernels.of(src).cast.encode_f16(src, dst)
            _refuse_overflow(views["data"], "float16")

        return EncodePlan(params, [SectionSpec("data", "f2", 2 * n)], fill16)

    # ---- header ----------------------------------------------------------------------------
    @classmethod
    def expected_sections(cls, params: dict[str, Any], shape: tuple[int, ...]) -> list[tuple[str, str, int]]:
        mode, r = params["mode"], params["rank"]
        numel = 1
        for d in shape:
            numel *= d
        if mode != "lowrank":
            if r != 0 or params["p"] is not None or params["q"] is not None:
                raise HeaderError(f"P2: mode {mode!r} needs rank 0 and nil p, q; got rank {r}")
            return [("data", "f4" if mode == "fp32" else "f2", (4 if mode == "fp32" else 2) * numel)]
        mn = matrix_shape(shape)
        if mn is None or numel == 0:
            raise HeaderError(
                f"P1: mode 'lowrank' needs a non-empty tensor of 2 or more dimensions; shape is {list(shape)}"
            )
        m, n = mn
        if not 1 <= r <= min(m, n):
            raise HeaderError(f"P1: rank {r} must lie in [1, min(m, n) = {min(m, n)}] for the {m} x {n} matrix")
        out: list[tuple[str, str, int]] = []
        for role, rows in (("p", m), ("q", n)):
            raw = params[role]
            if raw is None:
                out.append((role, "f4", 4 * rows * r))
            else:
                out += compose.nested_expected_sections(role, compose.parse_nested(raw, role, strict=False), rows * r)
        return out

    @classmethod
    def check_entry(cls, entry: TensorEntry, where: str, *, strict: bool = True) -> dict[str, Any]:
        for role in ("p", "q"):
            raw = entry.params.get(role)
            if raw is not None:
                compose.parse_nested(raw, f"{where}.params.{role}", strict=strict)
        params = super().check_entry(entry, where, strict=strict)
        if params["mode"] == "lowrank":
            mn = matrix_shape(entry.shape)
            assert mn is not None
            counts = {role: rows * params["rank"] for role, rows in (("p", mn[0]), ("q", mn[1]))}
            check_nested(entry, {k: v for k, v in counts.items() if params[k] is not None}, where, strict)
        return params

    # ---- decoding --------------------------------------------------------------------------
    @classmethod
    def _factors(
        cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        mn = matrix_shape(entry.shape)
        assert mn is not None
        r = params["rank"]
        wd = np.float64 if entry.dtype == "float64" else np.float32
        out = []
        for role, rows in (("p", mn[0]), ("q", mn[1])):
            raw = params[role]
            if raw is None:
                f = views[role]
                bad = kernels.of(f).lowrank.count_nonfinite(f)
                if bad:
                    raise PayloadValueError(f"P3: factor {role.upper()} holds {bad} NaN or infinite value(s)")
            else:
                spec = compose.parse_nested(raw, role, strict=False)
                f = compose.decode_nested(role, spec, entry, views, rows * r, wd)
                bad = kernels.of(f).lowrank.count_nonfinite(f)
                if bad:  # a nested fp16/bf16 factor may carry NaN or infinity
                    raise PayloadValueError(
                        f"P3: factor {role.upper()} decoded by the nested codec holds {bad} NaN or infinite value(s)"
                    )
            out.append(f.reshape(rows, r))
        if not factor_product_ok(out[0], out[1], entry.dtype):
            raise PayloadValueError(
                "P4: rank * max|P| * max|Q| exceeds 2**127: P Q^T could overflow float32 (decode to infinity)"
            )
        return out[0], out[1]

    @classmethod
    def _passthrough_data(cls, params: dict[str, Any], views: Mapping[str, np.ndarray]) -> np.ndarray:
        data = views["data"]
        bad = kernels.of(data).sparse.count_nonfinite(
            *key_bits(data, "float32" if params["mode"] == "fp32" else "float16")
        )
        if bad:
            raise PayloadValueError(f"P3: pass-through data holds {bad} NaN or infinite value(s)")
        return data

    @classmethod
    def decode_work(cls, params: dict[str, Any], entry: TensorEntry) -> int:
        """m * n * rank multiply-adds for P Q^T (numel for a pass-through)."""
        return entry.numel * max(1, params["rank"])

    @classmethod
    def decode_scratch_bytes(cls, params: dict[str, Any], entry: TensorEntry) -> int:
        """Decoded nested factors, the factor copies of :func:`decompress` (P widened for float64
        outputs, Q transposed, both at 8 bytes per element at most) and its row block."""
        if params["mode"] != "lowrank":
            return 0
        mn = matrix_shape(entry.shape)
        assert mn is not None
        m, n = mn
        r = params["rank"]
        total = 16 * (m + n) * r + 8 * max(n, 1 << 16)
        for role, rows in (("p", m), ("q", n)):
            if params[role] is not None:
                total += compose.nested_scratch_bytes(params[role], entry, rows * r)
        return total

    @classmethod
    def check_values(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> None:
        if params["mode"] != "lowrank":
            cls._passthrough_data(params, views)
            return
        mn = matrix_shape(entry.shape)
        assert mn is not None
        for role, rows in (("p", mn[0]), ("q", mn[1])):
            compose.check_role_values(params, role, entry, views, rows * params["rank"])
        cls._factors(params, entry, views)

    @classmethod
    def decode_into(
        cls,
        params: dict[str, Any],
        entry: TensorEntry,
        views: Mapping[str, np.ndarray],
        out: np.ndarray,
        accumulate: bool,
    ) -> None:
        mode = params["mode"]
        if mode != "lowrank":
            data = cls._passthrough_data(params, views)
            if mode == "fp32":
                kernels.of(out).memory.copy(out, data, accumulate)
            else:
                kernels.of(out).cast.decode_f16(data.view(np.uint16), out, accumulate)
            return
        p, q = cls._factors(params, entry, views)
        decompress(p, q, out, accumulate=accumulate)
