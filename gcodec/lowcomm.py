"""Low-communication training's schedule: when DiLoCo and Streaming DiLoCo send and apply.

DiLoCo (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language
Models") lets every replica take ``H`` inner optimizer steps on its own, then averages the
*pseudo-gradient* ``theta_global - theta_local`` across replicas and applies it to the shared
global parameters with an outer optimizer (SGD with Nesterov momentum, lr 0.7, momentum 0.9).

Streaming DiLoCo (Douillard et al. 2025, "Streaming DiLoCo with overlapping communication") splits
the parameters into ``P`` *fragments* synchronised at staggered steps (fragment ``p`` every ``H``
steps, ``p * H // P`` steps after fragment 0), lets each fragment's exchange run during the next
``delay`` inner steps, and then mixes the outer-updated global values into the local ones:
``theta_local <- mix * theta_local + (1 - mix) * theta_global`` (``mix = 0`` is plain DiLoCo's
replacement; the paper uses 0.5 with overlap).

This module holds what does not depend on the framework (:class:`Schedule`,
:func:`assign_fragments`); :class:`gcodec.torch.DiLoCo` runs it on torch.distributed, and a
``gcodec.mpi`` job drives the same exchange with ``gcodec.mpi.allreduce(delta, None, key=name,
state=router)`` on a :class:`gcodec.transports.Router` (docs/lowcomm.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ConfigError

__all__ = ["Schedule", "assign_fragments"]


def _positive_int(v: object, name: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


@dataclass(frozen=True)
class Schedule:
    """When each fragment sends its pseudo-gradient and when the averaged one is applied.

    Args:
        sync_every: ``H``, inner steps between two synchronisations of the same fragment.
        fragments: ``P``, how many fragments the parameters are split into (1: plain DiLoCo).
        delay: ``tau``, inner steps between a fragment's send and the outer update that uses its
            average (0: wait at once; ``0 <= delay < sync_every`` so at most one exchange per
            fragment is in flight).
        mix: ``alpha`` in ``[0, 1)``, the share of the local parameters kept when the outer-updated
            global ones come back (0: replace them, plain DiLoCo).

    Inner steps count from 1: after inner step ``t``, fragment ``p`` sends when
    ``t >= offset(p)`` and ``(t - offset(p)) % H == 0`` with ``t > 0``, and applies ``delay`` steps
    after each send.
    """

    sync_every: int
    fragments: int = 1
    delay: int = 0
    mix: float = 0.0

    def __post_init__(self) -> None:
        h = _positive_int(self.sync_every, "sync_every", 1)
        p = _positive_int(self.fragments, "fragments", 1)
        if p > h:
            raise ConfigError(f"fragments ({p}) must not exceed sync_every ({h}): each needs its own step")
        d = self.delay
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < h:
            raise ConfigError(f"delay must be an integer in [0, sync_every={h}), got {d!r}")
        m = self.mix
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0.0 <= float(m) < 1.0:
            raise ConfigError(f"mix must be a number in [0, 1), got {m!r}")

    def offset(self, fragment: int) -> int:
        """Inner steps from the start of a period to fragment ``fragment``'s send."""
        return (fragment * self.sync_every) // self.fragments

    def sends(self, step: int) -> list[int]:
        """The fragments that send after inner step ``step`` (counted from 1)."""
        if step <= 0:
            return []
        return [f for f in range(self.fragments) if step % self.sync_every == self.offset(f)]

    def applies(self, step: int) -> list[int]:
        """The fragments whose average is applied after inner step ``step``: those that sent at
        ``step - delay``."""
        return self.sends(step - self.delay)

    def as_dict(self) -> dict[str, object]:
        return {"sync_every": self.sync_every, "fragments": self.fragments, "delay": self.delay, "mix": float(self.mix)}


def assign_fragments(numels: Sequence[int], fragments: int) -> list[int]:
    """Each parameter's fragment, in parameter order: contiguous runs of about equal element count
    (a transformer's consecutive layers stay together, as the paper's sequential fragments do);
    every fragment gets at least one parameter."""
    n = len(numels)
    if fragments > n:
        raise ConfigError(f"{fragments} fragments for {n} parameters: every fragment needs one")
    total = sum(int(v) for v in numels)
    out: list[int] = []
    f, acc, here = 0, 0, 0  # current fragment, elements before this parameter, parameters in f
    for i, v in enumerate(numels):
        later = fragments - 1 - f  # fragments still empty after f
        if here and later and (acc >= total * (f + 1) / fragments or n - i <= later):
            f, here = f + 1, 0
        out.append(f)
        acc += int(v)
        here += 1
    return out
