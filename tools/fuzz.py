#!/usr/bin/env python
"""Coverage-guided fuzzing of ``gcodec.decode`` and ``gcodec.validate`` with atheris (libFuzzer).

    python tools/fuzz.py                       # 60 seconds, crashes go to fuzz-crashes/
    python tools/fuzz.py --seconds 3600 --jobs 2 --corpus fuzz-corpus
    python tools/fuzz.py --replay fuzz-crashes/  # re-run the oracles on saved inputs, no atheris
    python tools/fuzz.py --target encode       # the encoders instead: what they write must decode

Seeds: every ``specs/vectors/**/*.gcd`` plus small payloads of every registered codec that this
script makes itself (tests/codec_kit.py ``seed_payloads``).

Mutations: libFuzzer's byte mutations, and then (custom mutator) most of the time the CRCs are
recomputed so the mutation reaches the header and section rules instead of stopping at the
checksum; one time in five a header field is replaced by another msgpack value instead.

Oracles (tests/codec_kit.py ``check_payload``), any failure is a crash and its input is written to
the crash directory:

* only ``GcodecError`` subclasses escape ``decode``, ``validate`` and ``inspect_header``;
* ``validate`` success implies ``decode`` success, with the declared shape and dtype (and names,
  for bundles), and ``decode(out=zeros, accumulate=True)`` gives the same values;
* a payload that fails to decode leaves an ``accumulate=True`` target untouched;
* the peak traced allocation of each call is within the memory bound of docs/limits.md
  (``gcodec.resources.memory_bound``), and libFuzzer's ``-rss_limit_mb`` bounds the whole process;
* no input takes longer than ``--timeout`` seconds (a hang is a crash).

With ``--target encode`` the input is a tensor instead (tests/codec_kit.py ``encoder_input``: a case of
``NESTED_CASES``, every host with every codec that nests, a dtype, and raw element bits), and the
oracle is ``check_encoder``: encoding raises a ``GcodecError`` or writes a payload that passes the
oracles above as valid. Seeds: wide-range tensors of every case (``encoder_seeds``).

Decoding is limited to ``--max-output-mb`` (default 256) decoded bytes per payload during the run
(``gcodec.scoped_limits(max_output_bytes=...)``), so that a legitimately huge declared tensor does not
exhaust the machine; the size checks themselves are exercised all the same.

docs/fuzzing.md explains how to run it for hours and what to do with a crash.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _jitted_modules() -> list[str]:
    """gcodec modules that hold Numba code: atheris must not rewrite their bytecode."""
    out = []
    for p in (ROOT / "gcodec").rglob("*.py"):
        text = p.read_text("utf-8", errors="replace")
        if re.search(r"\bnumba\b|\bnjit\b|cuda\.jit", text):
            out.append(".".join(p.relative_to(ROOT).with_suffix("").parts))
    return sorted(out)


def _seed_files() -> list[Path]:
    return sorted((ROOT / "specs" / "vectors").rglob("*.gcd"))


def _check(target: str, data: bytes, memory: bool) -> str:
    """Run the oracles of ``target`` on one input; raises ``codec_kit.OracleFailure``."""
    from tests import codec_kit

    if target == "encode":
        return codec_kit.check_encoder(*codec_kit.encoder_input(data))
    return codec_kit.check_payload(data, memory=memory)


def _replay(paths: list[str], memory: bool, target: str = "decode") -> int:
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    bad = 0
    for f in files:
        try:
            outcome = _check(target, f.read_bytes(), memory)
            print(f"ok      {outcome:9} {f}")
        except Exception as e:  # report every broken oracle, not just the first
            bad += 1
            print(f"FAILED  {f}: {type(e).__name__}: {e}")
    print(f"{len(files)} input(s), {bad} failure(s)")
    return 1 if bad else 0


def _signature(message: str) -> str:
    """What identifies a failure: its message with numbers and quoted values blanked."""
    return re.sub(r"'[^']*'|\"[^\"]*\"|0x[0-9a-f]+|\d+", "#", message)[:120]


def _record(crash_dir: Path, data: bytes, message: str, seen: set[str]) -> None:
    sig = _signature(message)
    if sig in seen:
        return
    seen.add(sig)
    name = f"oracle-{hashlib.sha1(data).hexdigest()}"
    (crash_dir / name).write_bytes(data)
    (crash_dir / f"{name}.txt").write_text(message + "\n", "utf-8")
    print(f"\n== oracle failure (new kind), input saved as {crash_dir / name}:\n   {message}\n", flush=True)


def _supervise(args: argparse.Namespace, argv: list[str]) -> int:
    """Run ``--jobs`` fuzzing processes on one corpus until ``--seconds`` are spent, restarting any that
    stop early (a hard crash, a timeout or an out-of-memory: libFuzzer saved the input already)."""
    import subprocess

    corpus = args.corpus or tempfile.mkdtemp(prefix="gcodec-fuzz-")
    child = _drop(_drop(argv, "--jobs"), "--seconds")
    if "--corpus" not in child:
        child += ["--corpus", corpus]
    deadline = time.monotonic() + args.seconds
    env = dict(os.environ, GCODEC_FUZZ_CHILD="1")
    procs: list[subprocess.Popen[bytes] | None] = [None] * max(1, args.jobs)
    restarts = 0
    while True:
        left = int(deadline - time.monotonic())
        for i, p in enumerate(procs):
            if p is not None and p.poll() is None:
                continue
            if p is not None:
                restarts += 1
            if left < 5:
                procs[i] = None
                continue
            cmd = [sys.executable, __file__, *child, "--seconds", str(left), "--keep-going"]
            procs[i] = subprocess.Popen(cmd, env=env)
        if all(p is None for p in procs):
            break
        time.sleep(1)
    if not args.corpus:
        import shutil

        shutil.rmtree(corpus, ignore_errors=True)
    print(f"fuzz: done; {restarts} restart(s) after hard crashes; see {args.crash_dir}/", flush=True)
    return 0


def _drop(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``flag VALUE`` / ``flag=VALUE``."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(flag + "="):
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=60, help="total fuzzing time (default 60)")
    ap.add_argument("--crash-dir", default="fuzz-crashes", help="where crash inputs are written")
    ap.add_argument("--corpus", default=None, help="corpus directory to grow and reuse (default: a temp dir)")
    ap.add_argument("--max-len", type=int, default=8192, help="largest input libFuzzer makes (bytes)")
    ap.add_argument("--timeout", type=int, default=60, help="seconds per input before it counts as a hang")
    ap.add_argument("--rss-limit-mb", type=int, default=2048, help="process memory bound (libFuzzer)")
    ap.add_argument("--max-output-mb", type=int, default=256, help="decoded bytes allowed per payload")
    ap.add_argument(
        "--keep-going",
        action="store_true",
        help="record oracle failures (deduplicated) and go on fuzzing; restart after hard crashes",
    )
    ap.add_argument("--jobs", type=int, default=1, help="parallel fuzzing processes sharing the corpus")
    ap.add_argument("--no-memory", action="store_true", help="skip the tracemalloc oracle (about 2x faster)")
    ap.add_argument("--seed", type=int, default=0, help="libFuzzer -seed (0: time-based)")
    ap.add_argument("--replay", nargs="+", metavar="PATH", help="check saved inputs instead of fuzzing")
    ap.add_argument(
        "--target",
        choices=("decode", "encode"),
        default="decode",
        help="decode: payload bytes (default); encode: tensors through every hybrid, whose payloads must decode",
    )
    ap.add_argument("libfuzzer_args", nargs="*", help="extra libFuzzer flags after --")
    args = ap.parse_args(argv)

    if args.replay:
        return _replay(args.replay, memory=not args.no_memory, target=args.target)
    if args.jobs > 1 or (args.keep_going and not os.environ.get("GCODEC_FUZZ_CHILD")):
        return _supervise(args, argv if argv is not None else sys.argv[1:])

    import atheris

    with atheris.instrument_imports(include=["gcodec"], exclude=_jitted_modules()):
        import gcodec
        import gcodec.api
    import numpy as np

    from tests import codec_kit

    np.seterr(all="ignore")
    memory = not args.no_memory
    gcodec.set_limits(gcodec.Limits(max_output_bytes=args.max_output_mb << 20))

    # ---- corpus: golden vectors + our own payloads ----------------------------------------
    corpus = Path(args.corpus) if args.corpus else Path(tempfile.mkdtemp(prefix="gcodec-fuzz-"))
    if not args.corpus:
        import atexit
        import shutil

        atexit.register(shutil.rmtree, corpus, True)
    corpus.mkdir(parents=True, exist_ok=True)
    if args.target == "encode":
        seeds = codec_kit.encoder_seeds()
    else:
        seeds = [f.read_bytes() for f in _seed_files()] + codec_kit.seed_payloads()
    for s in seeds:
        (corpus / f"seed-{hashlib.sha1(s).hexdigest()[:16]}").write_bytes(s)
    crash_dir = Path(args.crash_dir)
    crash_dir.mkdir(parents=True, exist_ok=True)
    # warm up: compile every kernel the seeds reach (JIT compilation is slow, and would count as
    # a hang or as a memory peak of the first input that needs it)
    for s in seeds:
        try:
            _check(args.target, s, memory=False)
        except codec_kit.OracleFailure as e:
            print(f"fuzz: a seed breaks an oracle already: {e}", flush=True)
    print(f"fuzz: {len(seeds)} seeds, corpus {corpus}, crashes -> {crash_dir}/, {args.seconds} s", flush=True)

    values = [
        0, 1, 2, 3, 4, 7, 8, 63, 64, 65, 255, 256, 65535, 2**24, 2**31, 2**32, 2**34, 2**40, 2**63 - 1,
        2**64 - 1, -1, -(2**63), 0.5, -0.0, float("nan"), float("inf"), True, False, None, "", "x",
        "float32", "float16", "bfloat16", "float64", "u1", "u2", "u4", "f4", "f8", "i8", "data", "codes",
        "scales", [], [0], [1, 2], [[]], {}, {"a": 1}, *gcodec.list_codecs(),
    ]  # fmt: skip

    def header_mutation(data: bytes, rng: random.Random) -> bytes | None:
        try:
            header, body = codec_kit.parse_payload(data)
        except Exception:
            return None
        for _ in range(rng.choice((1, 1, 2, 3))):
            paths = codec_kit.header_paths(header)
            path = rng.choice(paths)
            value = rng.choice(values) if rng.random() < 0.9 else ...
            if value is ... and not path:
                continue
            try:
                header = codec_kit.mutate_header(header, path, value)
            except (KeyError, IndexError, TypeError):
                pass
        try:
            return codec_kit.rebuild(
                header, body, checksum=bool(len(data) > 6 and data[6] & 1),
                minor=rng.choice((0, 0, 0, 1)), canonical=rng.random() < 0.9,
            )  # fmt: skip
        except Exception:
            return None

    def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        r = rng.random()
        if r < 0.2:
            out = header_mutation(data, rng)
            if out is not None and len(out) <= max_size:
                return out
        out = atheris.Mutate(data, max_size)
        if r < 0.85:
            out = codec_kit.reseal(out)
        return out

    seen: set[str] = set()

    def test_one_input(data: bytes) -> None:
        if not args.keep_going:
            _check(args.target, data, memory)
            return
        try:
            _check(args.target, data, memory)
        except codec_kit.OracleFailure as e:
            _record(crash_dir, data, str(e), seen)

    lf = [
        sys.argv[0],
        str(corpus),
        f"-max_total_time={args.seconds}",
        f"-max_len={args.max_len}",
        f"-timeout={args.timeout}",
        f"-rss_limit_mb={args.rss_limit_mb}",
        f"-artifact_prefix={crash_dir}{os.sep}",
        "-print_final_stats=1",
    ]
    if args.seed:
        lf.append(f"-seed={args.seed}")
    lf += args.libfuzzer_args
    if args.target == "encode":  # any bytes are a tensor: libFuzzer's own mutations suffice
        atheris.Setup(lf, test_one_input)
    else:
        atheris.Setup(lf, test_one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
