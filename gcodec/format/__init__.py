"""Layer 3: the wire format (specs/format.md). Knows sections and bytes, never algorithms."""

from .container import (
    ALIGN,
    FLAG_PAYLOAD_CRC,
    MAGIC,
    MAJOR,
    MINOR,
    PREAMBLE_SIZE,
    SECTION_DTYPES,
    Header,
    ParsedPayload,
    PendingTensor,
    SectionInfo,
    SectionSpec,
    TensorEntry,
    read_payload,
    write_payload,
)
from .header import pack_canonical, unpack_strict

__all__ = [
    "ALIGN",
    "FLAG_PAYLOAD_CRC",
    "MAGIC",
    "MAJOR",
    "MINOR",
    "PREAMBLE_SIZE",
    "SECTION_DTYPES",
    "Header",
    "ParsedPayload",
    "PendingTensor",
    "SectionInfo",
    "SectionSpec",
    "TensorEntry",
    "pack_canonical",
    "read_payload",
    "unpack_strict",
    "write_payload",
]
