"""The vocabulary between codecs and the wire format: sections, tensor records, element counts.

A codec describes the raw sections it needs (:class:`SectionSpec`: name, element type, byte
length) and reads a payload's tensor record (:class:`TensorEntry`); ``gcodec.format`` lays the
sections out and checks them. Both sides import these plain types from here, so neither has to
import the other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["SECTION_DTYPES", "SectionInfo", "SectionSpec", "TensorEntry", "numel"]

#: Element types a section may declare: little-endian NumPy type codes.
SECTION_DTYPES: dict[str, np.dtype] = {
    code: np.dtype("<" + code) if code[1] != "1" else np.dtype(code)
    for code in ("u1", "i1", "u2", "i2", "f2", "u4", "i4", "f4", "u8", "i8", "f8")
}


def numel(shape: Iterable[int]) -> int:
    """The element count of ``shape`` as an exact Python int (1 for a scalar's ``()``)."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


@dataclasses.dataclass(frozen=True)
class SectionSpec:
    """A section a codec asks for: its name, element type code and byte length."""

    name: str
    dtype: str
    nbytes: int

    @property
    def count(self) -> int:
        return self.nbytes // SECTION_DTYPES[self.dtype].itemsize


@dataclasses.dataclass(frozen=True)
class SectionInfo:
    """A section as laid out in a payload: ``offset`` is relative to the start of the data area."""

    name: str
    dtype: str
    offset: int
    nbytes: int

    @property
    def count(self) -> int:
        return self.nbytes // SECTION_DTYPES[self.dtype].itemsize


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    """One tensor's record in the header."""

    codec: str
    version: int
    dtype: str
    shape: tuple[int, ...]
    params: dict[str, Any]
    sections: tuple[SectionInfo, ...]
    name: str | None = None

    @property
    def numel(self) -> int:
        return numel(self.shape)

    def section(self, name: str) -> SectionInfo:
        for s in self.sections:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "codec": self.codec,
            "version": self.version,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "params": self.params,
            "sections": [[s.name, s.dtype, s.offset, s.nbytes] for s in self.sections],
        }
        if self.name is not None:
            d["name"] = self.name
        return d
