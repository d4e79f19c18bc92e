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
    """The core module's vectors: fp16, bf16 and deterministic uniform (others use codec features it lacks)."""
    return entry["module"] == "core" and set(entry.get("codecs") or [entry.get("codec")]) <= KNOWN


VALID = [e for e in MANIFEST["vectors"] if e["kind"] == "valid" and _supported(e)]
INVALID = [e for e in MANIFEST["vectors"] if e["kind"] == "invalid" and e["module"] == "core"]


def test_the_independent_decoder_covers_many_vectors():
    assert len(VALID) >= 40 and len(INVALID) >= 100


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
