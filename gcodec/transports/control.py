"""Continuous agreement: every exchange starts with a control message that every rank sees.

An *exchange* is one agreed unit of collectives: one allreduce of a tensor, one DDP bucket, one
FSDP reduce-scatter or all-gather. Its configuration (codec, shape, dtype, mode, op, ...) is its
*fingerprint* (:func:`gcodec.transports.handshake.fingerprint`). The protocols' small messages
(sizes, error codes) are *control messages* of one fixed layout, all-gathered as ``5 + p`` int64
words, whatever the protocol:

====  =====================================================================================
word  meaning
====  =====================================================================================
0     ``TAG | kind``: a magic number that no size or error code takes, and the message kind
      (``BEGIN``, ``FINGERPRINT``, ``SIZES``, ``AGREE``)
1     the sequence number: how many control messages this communicator has carried
2     the exchange's digest: the first 8 bytes of BLAKE2b of its fingerprint's JSON
3     this rank's error code (0: none; see :mod:`gcodec.transports.collectives`)
4     flags: bit 0, "this rank has not agreed on this fingerprint yet"
5..   p sizes, whose meaning the protocol gives (payload bytes, bytes per destination)
====  =====================================================================================

The first control message of an exchange is its ``BEGIN``. Where a protocol starts with a size
exchange anyway (gather, two-phase, the reduce-scatter of payloads, the compressed all-gather), the
``BEGIN`` *is* that size exchange: agreement costs no extra round trip. Where it starts with data
of a size the configuration fixes (summable values, PowerSGD's factors, dense sums), the ``BEGIN``
is one small all-gather of its own before the data: a digest sent *beside* such data could not
catch a length change, because the data collective itself would then have a different size on
each rank, which MPI leaves undefined and gloo may hang on. Summable and PowerSGD start that
all-gather before their encode and wait for it after (:meth:`Exchange.start`), so its round trip
overlaps the encode; their data still waits for it.

Because every rank receives every rank's control words, every rank takes the same decision:

* a tag, kind or sequence number that differs between ranks: :class:`~gcodec.ProtocolOrderError`
  on every rank (some rank ran an exchange the others did not; nothing is read as data). All
  ranks then continue from the same sequence number, so later exchanges work again;
* an error code on any rank: every rank raises (the failing rank's error, or its class);
* digests that differ, or any rank that has not agreed on its fingerprint before (the first
  exchange of a key, or after a restore): the full fingerprints travel (a ``FINGERPRINT`` control
  message with their lengths, then the JSON), and every rank raises the same
  :class:`~gcodec.ConfigError` naming the fields and ranks, or records the agreement and goes on.

So a rank whose configuration changes at any step, after any number of agreed exchanges, makes
every rank raise at that step, never a hang or a wrong sum, and the communicator stays usable.
"""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Callable, Generator, MutableMapping, Sequence
from typing import Any, NoReturn

import numpy as np

from ..errors import GcodecError, LimitExceededError, ProtocolOrderError
from ..limits import get_limits
from .collectives import error_code, raise_agreed
from .comm import Communicator, Protocol, Work, with_riders
from .handshake import Agreement, compare_fingerprints

__all__ = [
    "AGREE",
    "BEGIN",
    "FINGERPRINT",
    "HEAD",
    "SIZES",
    "TAG",
    "Exchange",
    "control_bytes",
    "digest_of",
    "failed_exchange",
]

#: The magic of word 0 ("gcdc"), shifted past the kind byte.
TAG = 0x67636463 << 8
BEGIN, FINGERPRINT, SIZES, AGREE = 1, 2, 3, 4
_KIND_NAMES = {BEGIN: "BEGIN", FINGERPRINT: "FINGERPRINT", SIZES: "SIZES", AGREE: "AGREE"}
#: Words before the p sizes.
HEAD = 5
_WANT_HANDSHAKE = 1
#: Sequence numbers wrap here, so that a peer's huge number cannot overflow the int64 word.
_SEQ_MASK = (1 << 62) - 1
#: The largest fingerprint a peer may announce (a DDP bucket's plan names every tensor).
_FINGERPRINT_BYTES = 16 << 20


def digest_of(text: str) -> int:
    """The 64-bit digest of a fingerprint's JSON text, as a signed int64."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def _seq(comm: Communicator) -> int:
    return int(getattr(comm, "_control_seq", 0))


def control_bytes(comm: Communicator) -> int:
    """Bytes this rank has sent to its peers in control messages on ``comm`` so far: every
    control all-gather's words and every fingerprint exchange's JSON, to each of the p - 1 peers
    (what an all-gather puts on the wire from one rank), besides the data the protocols count."""
    return int(getattr(comm, "_control_bytes", 0))


def _count(comm: Communicator, nbytes: int) -> None:
    comm._control_bytes = control_bytes(comm) + (comm.size - 1) * int(nbytes)  # type: ignore[attr-defined]


def _kind_name(word: int) -> str:
    if word & ~0xFF != TAG:
        return "not a control message"
    return _KIND_NAMES.get(word & 0xFF, f"kind {word & 0xFF}")


class Exchange:
    """One agreed unit of collectives on ``comm`` (module docstring).

    Args:
        comm: the communicator; its sequence number is kept on it, shared by every exchange.
        fp: the fingerprint (a JSON-safe dict from :func:`fingerprint`).
        agreed: where agreements are remembered (``key -> fingerprint JSON``), owned by the
            caller's state; None for an exchange that always agrees in full.
        key: the key under which ``agreed`` remembers this exchange.
        what: names the exchange in errors.
        on_agree: called with the :class:`Agreement` after a full fingerprint exchange succeeds.
        text: ``fp``'s canonical JSON (``json.dumps(fp, sort_keys=True)``) when the caller kept it
            from an earlier exchange of the same plan, so that it is not written again each step.
    """

    def __init__(
        self,
        comm: Communicator,
        fp: dict[str, Any],
        agreed: MutableMapping[str, str] | None,
        key: str,
        what: str,
        on_agree: Callable[[Agreement], None] | None = None,
        text: str | None = None,
    ) -> None:
        self.comm = comm
        self.fp = fp
        self.text = json.dumps(fp, sort_keys=True) if text is None else text
        self.digest = digest_of(self.text)
        self.agreed = agreed
        self.key = key
        self.what = what
        self.on_agree = on_agree
        self.begun = False
        self._started: Work | None = None  # a BEGIN all-gather started early (start())
        #: This rank's fingerprint is the one the ranks last agreed on for ``key``.
        self.current = agreed is not None and agreed.get(key) == self.text

    # ---- control messages --------------------------------------------------------------------
    def _words(self, kind: int, sizes: Sequence[int], local: BaseException | None) -> np.ndarray:
        """This rank's control message."""
        p = self.comm.size
        if len(sizes) > p:
            raise GcodecError(f"{self.what}: {len(sizes)} sizes do not fit a control message of {p} ranks")
        msg = np.zeros(HEAD + p, np.int64)
        msg[0] = TAG | kind
        msg[1] = _seq(self.comm)
        msg[2] = self.digest
        msg[3] = error_code(local)
        if kind == BEGIN and not self.current:
            msg[4] = _WANT_HANDSHAKE
        msg[HEAD : HEAD + len(sizes)] = sizes
        return msg

    def _settle(self, table: np.ndarray, kind: int, local: BaseException | None, cap: int | None = None) -> Protocol:
        """Act on every rank's control words (the same table on every rank, so the same decision);
        ``cap``: the most bytes any size may announce (see :meth:`_check_sizes`)."""
        p = self.comm.size
        # Every rank saw the same table: all continue from the same sequence number, even after an
        # order error, so the exchanges after it line up again.
        self.comm._control_seq = (int(table[:, 1].max()) + 1) & _SEQ_MASK  # type: ignore[attr-defined]
        self._check_order(table, kind)
        raise_agreed(table[:, 3], local, self.what)
        self._check_sizes(table[:, HEAD:], kind, cap)
        if kind == BEGIN:
            self.begun = True
            if bool((table[:, 2] != table[0, 2]).any()) or bool(table[:, 4].any()):
                yield from self._handshake()
        elif kind != FINGERPRINT and bool((table[:, 2] != self.digest).any()):
            bad = [r for r in range(p) if table[r, 2] != self.digest]
            raise ProtocolOrderError(
                f"{self.what}: rank(s) {bad} are in another exchange at this {_KIND_NAMES[kind]} message"
            )

    def _control(
        self, kind: int, sizes: Sequence[int], local: BaseException | None, cap: int | None = None
    ) -> Protocol:
        """All-gather one control message; check order and codes; return the (p, p) sizes table."""
        words = self._words(kind, sizes, local)
        _count(self.comm, words.nbytes)
        w = self.comm.allgather(words)
        return (yield from self._finish(w, kind, local, cap))

    def _finish(self, w: Work, kind: int, local: BaseException | None, cap: int | None = None) -> Protocol:
        """Wait for a control message's all-gather ``w`` and act on it (:meth:`_settle`)."""
        p = self.comm.size
        yield w
        table = np.asarray(w.result()).reshape(p, HEAD + p)
        yield from self._settle(table, kind, local, cap)
        return table[:, HEAD:]

    def _check_order(self, table: np.ndarray, kind: int) -> None:
        expect = TAG | kind
        wrong = [r for r in range(table.shape[0]) if table[r, 0] != expect]
        seqs = table[:, 1]
        if wrong or bool((seqs != seqs[0]).any()):
            got = "; ".join(
                f"rank {r}: {_kind_name(int(table[r, 0]))} #{int(table[r, 1])}" for r in range(table.shape[0])
            )
            raise ProtocolOrderError(
                f"{self.what}: ranks are at different messages of the protocol (expected "
                f"{_KIND_NAMES[kind]}; {got}): the same collectives must run in the same order on every rank"
            )

    def _check_sizes(self, sizes: np.ndarray, kind: int, cap: int | None = None) -> None:
        """A peer's sizes are untrusted input: they become allocations, so they are bounded first
        (every rank checks the same table and raises alike). ``cap``: the most the agreed plan can
        produce (the codec's largest payload for the agreed shape, :meth:`Codec.max_payload_bytes`),
        under the ``max_payload_bytes`` limit in any case."""
        limit = _FINGERPRINT_BYTES if kind == FINGERPRINT else get_limits().max_payload_bytes
        bound = limit if cap is None else min(int(cap), limit)
        bad = np.argwhere((sizes < 0) | (sizes > bound))
        if bad.size:
            r, j = (int(v) for v in bad[0])
            why = "the max_payload_bytes limit" if bound == limit else "the largest payload the agreed plan can produce"
            raise LimitExceededError(
                f"{self.what}: rank {r} announced {int(sizes[r, j])} bytes in a {_KIND_NAMES[kind]} control "
                f"message, outside [0, {bound}] ({why})"
            )

    def _handshake(self) -> Protocol:
        """The full fingerprint exchange: lengths in a FINGERPRINT control message, then the JSON."""
        comm = self.comm
        mine = np.frombuffer(
            json.dumps({"fp": self.fp, "host": socket.gethostname()}, sort_keys=True).encode(), np.uint8
        )
        sizes = yield from self._control(FINGERPRINT, [mine.shape[0]], None)
        counts = [int(c) for c in sizes[:, 0]]
        _count(comm, max(counts))  # every buffer is sent padded to the largest
        w = comm.allgatherv(mine, counts)
        yield w
        parts = w.result()
        agreement = compare_fingerprints(parts, comm.rank, self.fp.get("key", self.key))
        if self.agreed is not None:
            self.agreed[self.key] = self.text
            self.current = True
        if self.on_agree is not None:
            self.on_agree(agreement)

    # ---- what protocols call -----------------------------------------------------------------
    def start(self) -> None:
        """Start the BEGIN's all-gather now, so that its round trip overlaps local work (an encode)
        that the BEGIN does not depend on; :meth:`begin` then waits for it and acts on it. Nothing
        else may travel on the communicator in between, and the exchange's data still waits for
        :meth:`begin`: the agreement is exactly as strong, only earlier on the wire. A no-op once
        begun or started."""
        if not self.begun and self._started is None:
            words = self._words(BEGIN, [], None)
            _count(self.comm, words.nbytes)
            self._started = self.comm.allgather(words)

    def begin(self, local: BaseException | None = None) -> Protocol:
        """The exchange's BEGIN on its own, unless a control message already began it (for protocols
        whose first collective carries data of a size the configuration fixes); waits for the
        all-gather :meth:`start` began, if it did."""
        if self.begun:
            return
        w, self._started = self._started, None
        if w is None:
            yield from self._control(BEGIN, [], local)
            return
        if local is not None:  # its words went out without this error: the peers would not raise
            raise GcodecError(f"{self.what}: a local error after the BEGIN was started: {local!r}")
        yield from self._finish(w, BEGIN, None)

    def sizes(self, sizes: Sequence[int], local: BaseException | None = None, cap: int | None = None) -> Protocol:
        """A size exchange (the BEGIN when it is the exchange's first message): every rank's
        ``sizes``, as a ``(p, len)`` table; raises on every rank when any rank sent an error, or
        announced a size above ``cap`` bytes (the most the agreed plan can produce: what a rank
        then allocates for is bounded by it)."""
        table = yield from self._control(SIZES if self.begun else BEGIN, sizes, local, cap)
        return table[:, : len(sizes)]

    def agree(self, local: BaseException | None) -> Protocol:
        """Error agreement at the end of an exchange: every rank raises if any rank failed."""
        yield from self._control(AGREE if self.begun else BEGIN, [], local)

    def allgather_bytes(
        self, buf: np.ndarray, local: BaseException | None = None, riders: Any = None, cap: int | None = None
    ) -> Protocol:
        """Every rank's byte buffer, rank order; sizes and error codes travel first (a rank that
        failed locally sends no bytes and every rank raises before any data moves; so does every
        rank when one announces more than ``cap`` bytes). ``riders`` are summed beside the bytes,
        once the sizes agreed (:func:`~.comm.with_riders`)."""
        table = yield from self.sizes([buf.shape[0]], local, cap)
        w = self.comm.allgatherv(buf, [int(c) for c in table[:, 0]])
        yield with_riders(self.comm, riders, w)
        return w.result()

    def alltoall_bytes(
        self, bufs: Sequence[np.ndarray], local: BaseException | None = None, riders: Any = None, cap: int | None = None
    ) -> Protocol:
        """Send ``bufs[r]`` to rank r; return what each rank sent here (sizes and codes first; any
        size above ``cap`` bytes is refused on every rank). ``riders`` are summed beside the bytes,
        once the sizes agreed (:func:`~.comm.with_riders`)."""
        table = yield from self.sizes([b.shape[0] for b in bufs], local, cap)  # table[src, dst]
        w = self.comm.alltoallv(bufs, [int(c) for c in table[:, self.comm.rank]])
        yield with_riders(self.comm, riders, w)
        return w.result()


def failed_exchange(comm: Communicator, error: Exception, what: str) -> Generator[Work, None, NoReturn]:
    """Take part in an exchange this rank could not even set up (bad arguments, a policy that
    raised, any local failure before the first collective): a BEGIN with the error code, so that
    the peers raise too instead of waiting for this rank forever. This rank raises ``error``
    itself; the peers raise the :class:`~gcodec.GcodecError` subclass of its code (any exception
    that is not a gcodec error travels as :class:`~gcodec.GcodecError`)."""
    ex = Exchange(comm, {"error": type(error).__name__}, None, "", what)
    yield from ex.begin(error)
    raise error  # not reached: begin raises the local error
