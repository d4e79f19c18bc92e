#!/usr/bin/env python
"""Build or check the golden vectors in ``specs/vectors/``.

    python tools/make_vectors.py            # check: regenerate in memory, report differences (exit 1)
    python tools/make_vectors.py --write    # write the files and the manifest

The cases live in ``tools/vector_cases/`` (one module per codec family; see its ``__init__``).
For every case this script first checks that it behaves as declared: a valid payload validates and
decodes; an invalid one is rejected by both ``gcodec.validate`` and ``gcodec.decode`` with exactly
the named error class (and, when the error message starts with a rule tag like ``F7:``, with the
declared rule). Only then does it compare with, or write, the files:

* ``valid/<name>.gcd``: the payload; ``valid/<name>.npy`` (``.npz`` for a bundle): what it decodes
  to; ``valid/<name>.input.npy`` (``.input.npz``): what it was encoded from, when there is one;
* ``invalid/<name>.gcd``: a payload that must be refused;
* ``manifest.json``: every file with its sha256, and for invalid vectors the error class and rule.

Arrays are stored as ``.npy`` files in their own dtype, except bfloat16, which NumPy cannot describe
in a ``.npy`` header: those hold the ``<u2`` bit patterns and the manifest says ``"bfloat16"``.
Committed vectors are never regenerated silently: the test suite only compares. Check mode also
compares the hex dumps in ``specs/**/*.md`` marked ``<!-- hexdump: valid/x.gcd -->`` with the
committed files (``--hexdump valid/x.gcd`` prints one in that format).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import io
import json
import pkgutil
import re
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "specs" / "vectors"
for _p in (str(ROOT), str(ROOT / "tools")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import gcodec  # noqa: E402
from gcodec.arrays import BFLOAT16, dtype_name  # noqa: E402

_NAME = re.compile(r"^[a-z0-9][a-z0-9_]*$")
_RULE_TAG = re.compile(r"^([A-Z]+[0-9]+):")
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    module: str
    kind: str  # "valid" or "invalid"
    make: Callable[[], Any]
    error: str | None = None
    rule: str | None = None
    limits: dict[str, int] | None = None  # reader limits other than the defaults (invalid vectors)


def load_cases() -> list[Case]:
    """Every case of every module in ``tools/vector_cases`` (import errors propagate)."""
    import vector_cases

    cases: list[Case] = []
    seen: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(vector_cases.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"vector_cases.{info.name}")
        for entry in getattr(mod, "VALID", []):
            name, make = entry
            cases.append(Case(name, info.name, "valid", make))
        for entry in getattr(mod, "INVALID", []):
            name, make, error, rule, *rest = entry
            if not isinstance(getattr(gcodec, error, None), type):
                raise SystemExit(f"{info.name}: {name}: gcodec has no error class {error!r}")
            limits = rest[0] if rest else None
            if limits is not None:
                gcodec.Limits(**limits)  # a ConfigError names a bad field or value
            cases.append(Case(name, info.name, "invalid", make, error, rule, limits))
    for c in cases:
        if not _NAME.match(c.name):
            raise SystemExit(f"{c.module}: bad vector name {c.name!r} (use [a-z0-9_])")
        if c.name in seen:
            raise SystemExit(f"vector name {c.name!r} is defined in {seen[c.name]} and {c.module}")
        seen[c.name] = c.module
    return cases


# --------------------------------------------------------------------------------------------
# arrays


def array_to_npy(a: np.ndarray) -> bytes:
    """``.npy`` bytes of ``a`` (bfloat16 stored as its ``<u2`` bit patterns)."""
    a = np.asarray(a)
    if not a.flags.c_contiguous:
        a = a.copy()  # (np.ascontiguousarray would turn a 0-d array into 1-d)
    if a.dtype == BFLOAT16:
        a = a.view("<u2")
    f = io.BytesIO()
    np.lib.format.write_array(f, a, version=(1, 0), allow_pickle=False)
    return f.getvalue()


def npy_to_array(data: bytes, dtype: str) -> np.ndarray:
    a = np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
    return a.view(BFLOAT16) if dtype == "bfloat16" else a


def arrays_to_npz(arrays: dict[str, np.ndarray]) -> bytes:
    """A deterministic ``.npz`` (stored, fixed timestamps), members in the given order."""
    f = io.BytesIO()
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED) as z:
        for name, a in arrays.items():
            zi = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE)
            zi.external_attr = 0o644 << 16
            z.writestr(zi, array_to_npy(a))
    return f.getvalue()


def npz_to_arrays(data: bytes, dtypes: dict[str, str]) -> dict[str, np.ndarray]:
    out = {}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for name, dt in dtypes.items():
            out[name] = npy_to_array(z.read(f"{name}.npy"), dt)
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and bits; two NaNs of the same sign count as equal whatever their payload."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    ut = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    ab, bb = a.view(ut), b.view(ut)
    if a.dtype == BFLOAT16:
        a, b = a.astype(np.float32), b.astype(np.float32)
    nan = np.isnan(a) & np.isnan(b) & (np.signbit(a) == np.signbit(b))
    return bool(((ab == bb) | nan).all())


def _describe(a: np.ndarray) -> dict[str, Any]:
    return {"dtype": dtype_name(a.dtype), "shape": list(a.shape)}


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# --------------------------------------------------------------------------------------------
# building


@dataclasses.dataclass
class Built:
    """A case turned into files: ``files`` maps paths under specs/vectors/ to bytes."""

    case: Case
    entry: dict[str, Any]
    files: dict[str, bytes]
    arrays: dict[str, Any]  # path -> array or dict of arrays, for content comparison


def _codecs_of(payload: bytes) -> list[str]:
    """The codec ids a payload's header names, read without checks (empty when unreadable)."""
    import msgpack

    try:
        hlen = int.from_bytes(payload[8:12], "little")
        h = msgpack.unpackb(payload[16 : 16 + hlen], raw=False, strict_map_key=False)
        return [t["codec"] for t in h["tensors"] if isinstance(t["codec"], str)]
    except Exception:
        return []


def reader_limits(limits: dict[str, int] | None) -> gcodec.Limits:
    """The limits a vector is checked under: the defaults, with the manifest's ``limits`` changed."""
    return gcodec.Limits(**(limits or {}))


def check_invalid(payload: bytes, error: str, rule: str | None, limits: dict[str, int] | None = None) -> str | None:
    """None when validate() and decode() both raise exactly ``error``; otherwise what went wrong."""
    lim = reader_limits(limits)
    for fn in (gcodec.validate, gcodec.decode):
        try:
            fn(payload, limits=lim)
        except Exception as e:
            got = type(e).__name__
            if got != error:
                return f"{fn.__name__}: raised {got} ({e}), expected {error}"
            m = _RULE_TAG.match(str(e))
            if rule and m and m.group(1) != rule:
                return f"{fn.__name__}: rule {m.group(1)} fired ({e}), expected {rule}"
        else:
            return f"{fn.__name__}: accepted the payload, expected {error}"
    return None


def _array_files(stem: str, value: Any) -> tuple[str, bytes, dict[str, Any]]:
    if isinstance(value, dict):
        path = f"{stem}.npz"
        return path, arrays_to_npz(value), {"file": path, "arrays": {k: _describe(v) for k, v in value.items()}}
    path = f"{stem}.npy"
    return path, array_to_npy(value), {"file": path, **_describe(value)}


def build(case: Case) -> Built:
    """Run ``case.make()``, check the case behaves as declared, and return its files and manifest entry."""
    if case.kind == "valid":
        payload, x = case.make()
        payload = bytes(payload)
        try:
            info = gcodec.validate(payload)
            decoded = gcodec.decode(payload)
        except gcodec.GcodecError as e:
            raise SystemExit(f"valid vector {case.name}: {type(e).__name__}: {e}") from None
        stem = f"valid/{case.name}"
        files = {f"{stem}.gcd": payload}
        arrays: dict[str, Any] = {}
        entry: dict[str, Any] = {
            "name": case.name,
            "kind": "valid",
            "module": case.module,
            "file": f"{stem}.gcd",
            "sha256": _sha(payload),
            "codec": info.codec,
            "codecs": [t.codec for t in info.tensors],
            "bundle": info.is_bundle,
            "version": f"{info.version[0]}.{info.version[1]}",
            "checksum": info.checksum,
        }
        path, data, desc = _array_files(stem, decoded)
        files[path] = data
        arrays[path] = decoded
        entry["decoded"] = {**desc, "sha256": _sha(data)}
        if x is not None:
            path, data, desc = _array_files(f"{stem}.input", x)
            files[path] = data
            arrays[path] = x
            entry["input"] = {**desc, "sha256": _sha(data)}
        return Built(case, entry, files, arrays)
    payload = bytes(case.make())
    problem = check_invalid(payload, case.error or "", case.rule, case.limits)
    if problem:
        raise SystemExit(f"invalid vector {case.name}: {problem}")
    codecs = _codecs_of(payload)
    path = f"invalid/{case.name}.gcd"
    entry = {
        "name": case.name,
        "kind": "invalid",
        "module": case.module,
        "file": path,
        "sha256": _sha(payload),
        "codec": codecs[0] if codecs else None,
        "codecs": codecs,
        "error": case.error,
        "rule": case.rule,
    }
    if case.limits:
        entry["limits"] = dict(case.limits)
    return Built(case, entry, {path: payload}, {})


def manifest(built: list[Built]) -> dict[str, Any]:
    entries = sorted((b.entry for b in built), key=lambda e: (e["kind"], e["name"]))
    return {
        "about": "gcodec golden vectors (specs/format.md, 'Golden vectors'), written by tools/make_vectors.py",
        "counts": {
            "valid": sum(e["kind"] == "valid" for e in entries),
            "invalid": sum(e["kind"] == "invalid" for e in entries),
        },
        "vectors": entries,
    }


def dump_manifest(m: dict[str, Any]) -> bytes:
    return (json.dumps(m, indent=1, ensure_ascii=False, sort_keys=False) + "\n").encode("utf-8")


def load_array_file(path: str, data: bytes, desc: dict[str, Any]) -> Any:
    if path.endswith(".npz"):
        return npz_to_arrays(data, {k: v["dtype"] for k, v in desc["arrays"].items()})
    return npy_to_array(data, desc["dtype"])


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and list(a) == list(b)
            and all(same_bits(np.asarray(a[k]), np.asarray(b[k])) for k in a)
        )
    return same_bits(np.asarray(a), np.asarray(b))


def hexdump(data: bytes) -> str:
    """The dump format of the spec's worked examples: offset, 16 bytes in hex, printable ASCII."""
    lines = []
    for i in range(0, len(data), 16):
        chunk = data[i : i + 16]
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{i:04x}  {' '.join(f'{b:02x}' for b in chunk):<47}  {text}".rstrip())
    return "\n".join(lines)


_HEXDUMP_MARK = re.compile(r"<!-- hexdump: (\S+) -->\s*\n```[a-z]*\n(.*?)\n```", re.S)


def spec_hexdumps() -> list[tuple[str, str, str]]:
    """Every hex dump in ``specs/**/*.md`` marked ``<!-- hexdump: valid/x.gcd -->``: (spec, file, text)."""
    out = []
    for md in sorted((ROOT / "specs").rglob("*.md")):
        for m in _HEXDUMP_MARK.finditer(md.read_text("utf-8")):
            out.append((str(md.relative_to(ROOT)), m.group(1), m.group(2)))
    return out


def check_spec_hexdumps() -> list[str]:
    """Hex dumps in the specs that no longer match the committed vector they show."""
    diffs = []
    for md, rel, text in spec_hexdumps():
        f = VECTORS / rel
        if not f.is_file():
            diffs.append(f"{md}: hex dump of missing vector {rel}")
        elif "\n".join(line.rstrip() for line in text.splitlines()) != hexdump(f.read_bytes()):
            diffs.append(f"{md}: hex dump of {rel} differs from the file (print it with --hexdump {rel})")
    return diffs


def existing_files() -> set[str]:
    out = set()
    for sub in ("valid", "invalid"):
        d = VECTORS / sub
        if d.is_dir():
            out |= {f"{sub}/{p.name}" for p in d.iterdir() if p.is_file()}
    return out


# --------------------------------------------------------------------------------------------
# main


def check(built: list[Built]) -> list[str]:
    """Differences between the regenerated vectors and the committed ones."""
    diffs = []
    expected: dict[str, bytes] = {}
    for b in built:
        expected.update(b.files)
        for path, data in b.files.items():
            f = VECTORS / path
            if not f.is_file():
                diffs.append(f"missing: {path}")
                continue
            have = f.read_bytes()
            if have == data:
                continue
            if path in b.arrays:  # .npy/.npz bytes may differ between NumPy versions: compare values
                desc = b.entry["decoded"] if b.entry["decoded"]["file"] == path else b.entry["input"]
                try:
                    same = same_value(load_array_file(path, have, desc), b.arrays[path])
                except Exception as e:
                    diffs.append(f"unreadable: {path}: {e}")
                    continue
                if same:
                    desc["sha256"] = _sha(have)  # the committed file is right; keep its hash
                    continue
            diffs.append(f"differs: {path}")
    for path in sorted(existing_files() - set(expected)):
        diffs.append(f"stale (no case produces it): {path}")
    mpath = VECTORS / "manifest.json"
    if not mpath.is_file():
        diffs.append("missing: manifest.json")
    else:
        have = json.loads(mpath.read_text("utf-8"))
        want = manifest(built)
        if have != want:
            hv = {e["name"]: e for e in have.get("vectors", [])}
            wv = {e["name"]: e for e in want["vectors"]}
            for n in sorted(set(hv) | set(wv)):
                if hv.get(n) != wv.get(n):
                    diffs.append(f"manifest entry differs: {n}")
            if {k: v for k, v in have.items() if k != "vectors"} != {k: v for k, v in want.items() if k != "vectors"}:
                diffs.append("manifest header differs")
    return diffs


def write(built: list[Built]) -> None:
    for sub in ("valid", "invalid"):
        (VECTORS / sub).mkdir(parents=True, exist_ok=True)
    expected = {}
    for b in built:
        expected.update(b.files)
    for path in sorted(existing_files() - set(expected)):
        print(f"removing stale {path}")
        (VECTORS / path).unlink()
    changed = 0
    for path, data in sorted(expected.items()):
        f = VECTORS / path
        if not f.is_file() or f.read_bytes() != data:
            f.write_bytes(data)
            changed += 1
    (VECTORS / "manifest.json").write_bytes(dump_manifest(manifest(built)))
    print(f"wrote {changed} changed file(s); {len(built)} vectors in specs/vectors/manifest.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the vector files and manifest.json")
    ap.add_argument("--only", metavar="MODULE", help="(check mode) only this case module's vectors")
    ap.add_argument("--hexdump", metavar="FILE", help="print a committed vector (valid/x.gcd) as specs show it")
    args = ap.parse_args(argv)
    if args.hexdump:
        print(hexdump((VECTORS / args.hexdump).read_bytes()))
        return 0
    cases = load_cases()
    if args.only and args.write:
        ap.error("--only cannot be combined with --write (the manifest covers every module)")
    built = [build(c) for c in cases if not args.only or c.module == args.only]
    nv = sum(b.case.kind == "valid" for b in built)
    print(f"{len(built)} vectors ({nv} valid, {len(built) - nv} invalid) behave as declared")
    if args.write:
        write(built)
        return 0
    diffs = check(built) + check_spec_hexdumps()
    if args.only:  # the stale-file and manifest checks need every module
        diffs = [d for d in diffs if not d.startswith(("stale", "manifest", "specs/"))]
    for d in diffs:
        print(d)
    if diffs:
        print(f"{len(diffs)} difference(s); run with --write to accept them (and review the diff)")
        return 1
    print("specs/vectors/ is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
