"""The golden vectors of specs/vectors/: the code must reproduce and honour every committed file.

A vector that a case module defines but that is not committed is a failure: the test never writes
files (``python tools/make_vectors.py --write`` does, and its diff is reviewed).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import gcodec

ROOT = Path(__file__).resolve().parents[1]

import make_vectors as mv  # noqa: E402

VECTORS = ROOT / "specs" / "vectors"
CASES = mv.load_cases()
VALID = [c for c in CASES if c.kind == "valid"]
INVALID = [c for c in CASES if c.kind == "invalid"]


def _manifest() -> dict:
    path = VECTORS / "manifest.json"
    assert path.is_file(), "specs/vectors/manifest.json is missing (run tools/make_vectors.py --write)"
    return json.loads(path.read_text("utf-8"))


MANIFEST = _manifest() if (VECTORS / "manifest.json").is_file() else {"vectors": []}
ENTRIES = {e["name"]: e for e in MANIFEST["vectors"]}


def _committed(rel: str) -> bytes:
    path = VECTORS / rel
    if not path.is_file():
        pytest.fail(f"specs/vectors/{rel} is not committed (run tools/make_vectors.py --write and review)")
    return path.read_bytes()


def _entry(name: str) -> dict:
    if name not in ENTRIES:
        pytest.fail(f"vector {name!r} has a case but no manifest entry (run tools/make_vectors.py --write)")
    return ENTRIES[name]


# ---------------------------------------------------------------------------------------------
# completeness


def test_manifest_exists():
    _manifest()


def test_every_case_has_a_manifest_entry():
    missing = sorted({c.name for c in CASES} - set(ENTRIES))
    assert not missing, f"cases without committed vectors: {missing}"


def test_every_manifest_entry_has_a_case():
    cases = {c.name: c for c in CASES}
    orphans = sorted(set(ENTRIES) - set(cases))
    assert not orphans, f"manifest entries without a case: {orphans}"
    for name, e in ENTRIES.items():
        c = cases[name]
        assert e["kind"] == c.kind, name
        if c.kind == "invalid":
            assert (e["error"], e["rule"], e.get("limits")) == (c.error, c.rule, c.limits), name


def test_no_stray_files():
    listed = set()
    for e in MANIFEST["vectors"]:
        listed.add(e["file"])
        for k in ("decoded", "input"):
            if k in e:
                listed.add(e[k]["file"])
    assert not sorted(mv.existing_files() - listed)


def test_manifest_counts():
    kinds = [e["kind"] for e in MANIFEST["vectors"]]
    assert MANIFEST["counts"] == {"valid": kinds.count("valid"), "invalid": kinds.count("invalid")}


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_sha256(name):
    e = ENTRIES[name]
    for ref in [e, e.get("decoded"), e.get("input")]:
        if ref is not None:
            assert hashlib.sha256(_committed(ref["file"])).hexdigest() == ref["sha256"], ref["file"]


# ---------------------------------------------------------------------------------------------
# valid vectors


@pytest.mark.parametrize("case", VALID, ids=lambda c: c.name)
def test_valid_regenerates_byte_for_byte(case):
    e = _entry(case.name)
    committed = _committed(e["file"])
    payload, x = case.make()
    assert bytes(payload) == committed, f"{case.name}: the encoder no longer reproduces the committed payload"
    if x is not None and "input" in e:
        stored = mv.load_array_file(e["input"]["file"], _committed(e["input"]["file"]), e["input"])
        assert mv.same_value(stored, x), f"{case.name}: the case's input changed"


@pytest.mark.parametrize("case", VALID, ids=lambda c: c.name)
def test_valid_decodes_to_committed_array(case):
    e = _entry(case.name)
    payload = _committed(e["file"])
    info = gcodec.validate(payload)
    assert info.codec == e["codec"]
    assert [t.codec for t in info.tensors] == e["codecs"]
    assert info.is_bundle == e["bundle"]
    want = mv.load_array_file(e["decoded"]["file"], _committed(e["decoded"]["file"]), e["decoded"])
    got = gcodec.decode(payload)
    if e["bundle"]:
        assert isinstance(got, dict)
        assert list(got) == list(want)
        for k in want:
            assert mv.same_bits(got[k], want[k]), f"{case.name}[{k}]"
    else:
        assert mv.same_bits(got, want), case.name
        assert got.dtype == gcodec.arrays.DTYPES[e["decoded"]["dtype"]]
        assert list(got.shape) == e["decoded"]["shape"]


# ---------------------------------------------------------------------------------------------
# invalid vectors


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.name)
def test_invalid_regenerates_byte_for_byte(case):
    e = _entry(case.name)
    assert bytes(case.make()) == _committed(e["file"])


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.name)
@pytest.mark.parametrize("fn", [gcodec.validate, gcodec.decode], ids=["validate", "decode"])
def test_invalid_raises_named_error(case, fn):
    e = _entry(case.name)
    payload = _committed(e["file"])
    err = getattr(gcodec, e["error"])
    with pytest.raises(err) as info:
        fn(payload, limits=mv.reader_limits(e.get("limits")))
    assert type(info.value).__name__ == e["error"], f"{case.name}: {type(info.value).__name__}: {info.value}"
    tag = mv._RULE_TAG.match(str(info.value))
    if tag:
        assert tag.group(1) == e["rule"], f"{case.name}: {info.value}"


# ---------------------------------------------------------------------------------------------
# the specs' worked examples


def test_spec_hexdumps_match_vectors():
    """Every hex dump marked ``<!-- hexdump: FILE -->`` in specs/ shows the committed FILE exactly."""
    assert mv.spec_hexdumps(), "no marked hex dumps found in specs/"
    assert mv.check_spec_hexdumps() == []


def test_a_value_rule_id_names_one_codec():
    """Codec value rules have unique prefixes (U, Q, S, TG, T, TH, R, P; H for hybrids), so a rule ID
    alone says which codec's specification defines it; every invalid vector's name starts with its rule."""
    owners: dict[str, set[str]] = {}
    for e in MANIFEST["vectors"]:
        if e["kind"] != "invalid":
            continue
        if e["rule"][0] in "FCH":
            continue
        assert e["name"].startswith(e["rule"].lower() + "_"), e["name"]
        codecs = set(e["codecs"])
        if e["rule"][0] not in "UQS":  # the quantizers' rules also guard values nested in a host
            codecs = {e["codec"]}
        owners.setdefault(e["rule"].rstrip("0123456789"), set()).update(codecs)
    shared = {prefix: sorted(c) for prefix, c in owners.items() if len(c) > 1 and prefix not in "UQS"}
    assert not shared, f"rule prefixes used by several codecs: {shared}"
    assert owners["TG"] == {"terngrad"} and owners["T"] == {"topk"}
