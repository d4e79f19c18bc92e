"""The golden vectors, decoded by tests/spec_decoder.py: a decoder written from specs/ alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import spec_decoder as sd

ROOT = Path(__file__).resolve().parent.parent / "specs" / "vectors"
MANIFEST = json.loads((ROOT / "manifest.json").read_text())
KNOWN = {"fp16", "bf16", "uniform"}


def _supported(entry: dict) -> bool:
    """The core module's vectors (fp16, bf16 and deterministic uniform; others use codec features it
    lacks) and every powersgd vector (raw, pass-through, and fp16 / uniform-nearest factors)."""
    codecs = set(entry.get("codecs") or [entry.get("codec")])
    return (entry["module"] == "core" and codecs <= KNOWN) or codecs == {"powersgd"}


VALID = [e for e in MANIFEST["vectors"] if e["kind"] == "valid" and _supported(e)]
INVALID = [e for e in MANIFEST["vectors"] if e["kind"] == "invalid" and (e["module"] == "core" or _supported(e))]


def test_the_independent_decoder_covers_many_vectors():
    assert len(VALID) >= 40 and len(INVALID) >= 100
    assert sum(e["codecs"] == ["powersgd"] for e in VALID) == 8


@pytest.mark.parametrize("entry", VALID, ids=lambda e: e["name"])
def test_valid_vector_decodes_identically(entry):
    y = sd.read((ROOT / entry["file"]).read_bytes())
    want = sd.load(str(ROOT) + "/", entry["decoded"]["file"], entry["decoded"])
    if isinstance(want, dict):
        assert set(y) == set(want)
        assert all(sd.same(y[k], want[k]) for k in want)
    else:
        assert sd.same(y, want)


@pytest.mark.parametrize("entry", INVALID, ids=lambda e: e["name"])
def test_invalid_vector_refused_with_named_error(entry):
    with pytest.raises(sd.E) as ei:
        sd.read((ROOT / entry["file"]).read_bytes())
    assert ei.value.cls == entry["error"]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("r", [1, 5, 12])
def test_powersgd_with_inexact_sums_decodes_identically(dtype, r):
    """Random factors (sums that round, unlike the vectors' dyadic ones): the spec's order of
    powersgd.md §6 gives gcodec's bits, whatever the rank (the kernel has no BLAS path)."""
    import numpy as np
    from vector_cases.sparse import _powersgd_payload

    import gcodec

    rng = np.random.default_rng(r)
    p = rng.standard_normal((13, r)).astype(np.float32)
    q = rng.standard_normal((700, r)).astype(np.float32)
    buf = _powersgd_payload((13, 700), p, q, dtype)
    y = gcodec.decode(buf)
    assert sd.same(sd.read(buf), y.view(sd.BF16) if dtype == "bfloat16" else y)
