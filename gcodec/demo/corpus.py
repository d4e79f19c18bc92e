"""The language-model workload's text: Python's own standard library, a corpus every machine with
Python has (no download), read as bytes.

**Selection.** The 39 modules of :data:`FILES`, read from ``sysconfig.get_paths()["stdlib"]`` in
that order: plain-source modules that exist, as files of these names, in CPython 3.11 to 3.13.
Their text changes between Python releases (and patch releases), so every result records the
Python version and the SHA-256 of the corpus (:func:`load`).

**Split.** Each file's last 5 % of bytes (at least 1, at a byte boundary) go to validation, the
rest to training: every module contributes to both sides, and no validation byte was trained on.
Within each side the files are concatenated in :data:`FILES` order, each followed by a NUL byte.

**Batches.** Windows of ``context + 1`` bytes at offsets drawn from a NumPy PCG64 generator seeded
with ``(seed, step, rank)``: every rank draws its own, and a run is repeatable (:func:`batch`).
Validation uses the windows at offsets ``i * stride`` for ``i < windows`` (:func:`val_windows`).
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["FILES", "VAL_SHARE", "Corpus", "batch", "load", "val_windows"]

FILES = (
    "argparse.py ast.py base64.py bisect.py calendar.py collections/__init__.py configparser.py contextlib.py "
    "copy.py csv.py dataclasses.py difflib.py enum.py fnmatch.py fractions.py functools.py gettext.py glob.py "
    "gzip.py heapq.py hmac.py inspect.py ipaddress.py json/decoder.py json/encoder.py logging/__init__.py "
    "pprint.py queue.py random.py shlex.py shutil.py statistics.py string.py tarfile.py textwrap.py "
    "threading.py tokenize.py typing.py uuid.py"
).split()

#: Share of each file's bytes held out for validation.
VAL_SHARE = 0.05


@dataclass(frozen=True)
class Corpus:
    train: np.ndarray  # uint8
    val: np.ndarray  # uint8
    sha256: str  # of the selected files' bytes, in order, each followed by its length (8 bytes LE)
    python: str  # e.g. "3.11.7"
    root: str


def load(root: str | None = None) -> Corpus:
    """Read the corpus (module docstring); a missing file names itself."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    h = hashlib.sha256()
    train, val = [], []
    for name in FILES:
        path = base / name
        try:
            data = path.read_bytes()
        except OSError as e:
            raise FileNotFoundError(f"the LM corpus needs {path} (Python's standard library source): {e}") from e
        h.update(data)
        h.update(len(data).to_bytes(8, "little"))
        cut = len(data) - max(1, int(len(data) * VAL_SHARE))
        train.append(data[:cut] + b"\0")
        val.append(data[cut:] + b"\0")
    return Corpus(
        train=np.frombuffer(b"".join(train), np.uint8).copy(),
        val=np.frombuffer(b"".join(val), np.uint8).copy(),
        sha256=h.hexdigest(),
        python=".".join(str(v) for v in sys.version_info[:3]),
        root=str(base),
    )


def batch(data: np.ndarray, size: int, context: int, seed: int, step: int, rank: int) -> np.ndarray:
    """``size`` windows of ``context + 1`` bytes (inputs and next-byte targets), int64."""
    rng = np.random.default_rng([seed, step, rank])
    starts = rng.integers(0, data.shape[0] - context - 1, size=size)
    idx = starts[:, None] + np.arange(context + 1)[None, :]
    return data[idx].astype(np.int64)


def val_windows(data: np.ndarray, windows: int, context: int) -> np.ndarray:
    """``windows`` evenly spaced validation windows of ``context + 1`` bytes, int64."""
    span = data.shape[0] - context - 1
    stride = max(1, span // max(1, windows))
    starts = np.arange(min(windows, span // stride + 1)) * stride
    idx = starts[:, None] + np.arange(context + 1)[None, :]
    return data[idx].astype(np.int64)
