"""How many elements a sparsifier keeps: ``ratio=`` or ``k=``, shared by ``topk`` and ``randomk``."""

from __future__ import annotations

from typing import Any

__all__ = ["check_ratio_k", "k_for"]


def check_ratio_k(params: dict[str, Any], err: type[Exception], where: str) -> None:
    """Exactly one of ``ratio`` (in (0, 1]) and ``k`` (>= 0) is given."""
    if "ratio" not in params:
        return
    ratio, k = params["ratio"], params["k"]
    if (ratio is None) == (k is None):
        raise err(f"{where}give exactly one of ratio= and k=")
    if ratio is not None and not (0.0 < ratio <= 1.0):
        raise err(f"{where}ratio={ratio!r} must lie in (0, 1]")
    if k is not None and k < 0:
        raise err(f"{where}k={k!r} must be >= 0")


def k_for(params: dict[str, Any], n: int) -> int:
    """The number of elements kept from a tensor of ``n`` elements: ``min(n, k)``, or
    ``min(n, max(1, floor(n * ratio)))`` (0 for an empty tensor)."""
    if params["k"] is not None:
        return min(n, params["k"])
    if n == 0:
        return 0
    return min(n, max(1, int(n * params["ratio"])))
